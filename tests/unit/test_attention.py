"""Every attention backend against the dense reference: forward and gradients, on CPU.

Splash (TPU) and the Pallas GPU kernel run in Pallas interpret mode. The cases cover packed
segments, pads (queries see nothing, keys are never seen), queries whose document has no key
(fully masked rows), local windows (on contiguous positions and on gathered ones), and
cross-attention with different query and key lengths.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crossbert_jax.model import attention as attn
from crossbert_jax.model import attention_kernels

H, K = 2, 16


def _packed(lengths, total):
  """Segment ids (1.., pads 0) and per-document positions for one row."""
  seg, pos = np.zeros(total, np.int32), np.zeros(total, np.int32)
  start = 0
  for i, n in enumerate(lengths):
    seg[start:start + n], pos[start:start + n] = i + 1, np.arange(n)
    start += n
  return seg, pos


def _self_case(gathered: bool):
  """B=2 rows of T=40: packed documents and pads; `gathered`: a sorted random subset of a longer row."""
  if not gathered:
    rows = [_packed([17, 15], 40), _packed([9, 12, 11], 40)]
  else:
    rng = np.random.default_rng(0)
    rows = []
    for lengths in ([30, 34], [20, 25, 19]):
      seg, pos = _packed(lengths, 72)
      keep = np.sort(rng.permutation(72)[:40])
      rows.append((seg[keep], pos[keep]))
  seg, pos = (np.stack(a) for a in zip(*rows))
  return jnp.asarray(seg), jnp.asarray(pos)


def _qkv(t, s, seed=0):
  kq, kk, kv, kd = jax.random.split(jax.random.key(seed), 4)
  return (jax.random.normal(kq, (2, t, H, K)), jax.random.normal(kk, (2, s, H, K)), jax.random.normal(kv, (2, s, H, K)),
          jax.random.normal(kd, (2, t, H, K)))


def _run(fn, q, k, v, dout):
  """Output and the gradients of <out, dout> w.r.t. q, k, v."""
  out, vjp = jax.vjp(fn, q, k, v)
  return (out,) + vjp(dout)


def _check(got, want, what, atol=2e-5):
  for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
    err = float(jnp.max(jnp.abs(g - w)))
    assert err <= atol * max(1.0, float(jnp.max(jnp.abs(w)))), f"{what}: {name} differs from dense by {err:.2e}"


BACKENDS = ["chunked", "splash", "gpu_flash"]


def _spec(backend):
  # Small blocks: several key blocks (and padding of the last one) even at these lengths.
  return attn.AttentionSpec(backend=backend, block_q=16, block_kv=16, interpret=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [None, 8], ids=["global", "local"])
def test_self_attention_matches_dense(backend, window):
  seg, pos = _self_case(gathered=False)
  q, k, v, dout = _qkv(40, 40)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(seg, seg, pos, pos, window))
  fn = lambda q, k, v: attn.attention(q, k, v, seg, spec=_spec(backend), q_pos_BxT=pos, window=window)
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  _check(got, want, f"{backend} self-attention window={window}")
  assert float(jnp.max(jnp.abs(got[0][seg == 0]))) == 0.0, "pad queries must output zeros"
  assert float(jnp.max(jnp.abs(got[2][seg == 0]))) == 0.0, "pad keys must get no gradient"


@pytest.mark.parametrize("backend", ["chunked", "splash", "gpu_flash"])
def test_local_window_on_gathered_positions_matches_dense(backend):
  """Visible tokens keep their original positions: the window is by position, not index."""
  seg, pos = _self_case(gathered=True)
  assert not bool(attention_kernels.positions_follow_indices(seg, pos, seg, pos))
  q, k, v, dout = _qkv(40, 40, seed=1)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(seg, seg, pos, pos, 8))
  fn = lambda q, k, v: attn.attention(q, k, v, seg, spec=_spec(backend), q_pos_BxT=pos, window=8)
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  _check(got, want, f"{backend} local window on gathered positions")


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_attention_matches_dense(backend):
  """T=24 queries, S=40 keys; row 0 has a query segment with no key and pad queries."""
  kv_seg, _ = _self_case(gathered=False)
  q_seg = jnp.asarray(
      [
          [1] * 8 + [2] * 6 + [3] * 4 + [0] * 6,  # Segment 3 has no key: masked rows.
          [3] * 10 + [1] * 10 + [0] * 4],
      jnp.int32)
  q, k, v, dout = _qkv(24, 40, seed=2)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(q_seg, kv_seg))
  fn = lambda q, k, v: attn.attention(q, k, v, q_seg, kv_seg, spec=_spec(backend))
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  _check(got, want, f"{backend} cross-attention")
  assert float(jnp.max(jnp.abs(got[0][0, 14:]))) == 0.0, "keyless and pad queries must output zeros"


def test_gpu_flash_runs_windows_and_cross_attention_on_its_window_kernel():
  """Local layers and cross-attention trace the Pallas window kernel, local layers with no fallback."""
  seg, pos = _self_case(gathered=False)
  q, k, v, _ = _qkv(40, 40)
  spec = _spec("gpu_flash")
  local = jax.make_jaxpr(lambda q, k, v: attn.attention(q, k, v, seg, spec=spec, q_pos_BxT=pos, window=8))(q, k, v)
  cross = jax.make_jaxpr(lambda q, k, v: attn.attention(q, k, v, seg, seg[::-1], spec=spec))(q, k, v)
  glob = jax.make_jaxpr(lambda q, k, v: attn.attention(q, k, v, seg, spec=spec))(q, k, v)
  # A window by position: no check of the positions and no chunked fallback (lax.cond's `branches=`).
  assert "window_mha_forward" in str(local) and "branches=" not in str(local) and "chunked" not in str(local)
  assert "window_mha_forward" in str(cross) and "branches=" not in str(cross)
  assert "window_mha_forward" not in str(glob) and "mha_forward" in str(glob), "global: the stock kernel"


def test_scanned_layer_flag_selects_the_window():
  """A traced is_global (nn.scan over layers) picks the global or the local mask per call."""
  seg, pos = _self_case(gathered=False)
  q, k, v, _ = _qkv(40, 40, seed=3)
  spec = _spec("chunked")
  fn = jax.jit(functools.partial(attn.self_attention, spec=spec, window=8))
  for is_global, window in ((True, None), (False, 8)):
    want = attn.dense(q, k, v, attn.mask(seg, seg, pos, pos, window))
    got = fn(q, k, v, seg, pos, is_global=jnp.asarray(is_global))
    np.testing.assert_allclose(got, want, atol=2e-5, err_msg=f"is_global={is_global}")


def test_chunked_backward_holds_one_key_block_of_scores():
  """No BxHxTxS tensor (forward or backward) in the compiled chunked gradient."""
  t = s = 256
  seg = jnp.ones((1, t), jnp.int32)
  q, k, v, _ = _qkv(t, s)
  q, k, v = q[:1], k[:1], v[:1]
  loss = lambda q, k, v: jnp.sum(attn.attention(q, k, v, seg, spec=attn.AttentionSpec("chunked", 64, 64)) ** 2)
  hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()
  assert f"f32[1,2,{t},{s}]" not in hlo and f"f32[1,2,{t},64]" in hlo, (
      "the chunked backward materialised the full score matrix")
  dense_loss = lambda q, k, v: jnp.sum(attn.attention(q, k, v, seg, spec=attn.AttentionSpec("xla")) ** 2)
  assert f"f32[1,2,{t},{s}]" in jax.jit(jax.grad(dense_loss)).lower(q, k, v).compile().as_text()


def test_auto_picks_by_platform_and_length():
  spec = attn.AttentionSpec("auto", chunked_min_len=1024)
  assert attention_kernels.target_platform() == "cpu"
  assert attn.resolve_backend(spec, 512, 512) == "xla"
  assert attn.resolve_backend(spec, 2048, 1024) == "chunked"
  assert attn.resolve_backend(attn.AttentionSpec("splash", interpret=True), 8, 8) == "splash"
  # Off its platform without interpret (a TPU-trained config evaluated on CPU): chunked.
  assert attn.resolve_backend(attn.AttentionSpec("splash"), 8, 8) == "chunked"
  assert attn.resolve_backend(attn.AttentionSpec("gpu_flash"), 8, 8) == "chunked"


def test_has_key_and_position_check():
  q_seg = jnp.asarray([[1, 2, 3, 0]], jnp.int32)
  kv_seg = jnp.asarray([[2, 0, 1, 1, 0]], jnp.int32)
  assert attention_kernels.has_key(q_seg, kv_seg).tolist() == [[True, True, False, False]]
  seg, pos = _self_case(gathered=False)
  assert bool(attention_kernels.positions_follow_indices(seg, pos, seg, pos))
  # A document split in two places (segment 1 reappears after segment 2) breaks the index band.
  seg2 = jnp.asarray([[1, 1, 2, 2, 1, 1]], jnp.int32)
  pos2 = jnp.asarray([[0, 1, 0, 1, 2, 3]], jnp.int32)
  assert not bool(attention_kernels.positions_follow_indices(seg2, pos2, seg2, pos2))


@pytest.mark.parametrize("backend, window", [("splash", None), ("gpu_flash", 8)])
def test_kernel_sharded_over_batch_and_heads_matches_dense(backend, window):
  """Under the train step's mesh and logical rules, the Pallas kernels run in shard_map (batch x heads)."""
  import ml_collections
  from jax.sharding import NamedSharding, PartitionSpec
  from crossbert_jax.training import sharding
  mesh = sharding.make_mesh(ml_collections.ConfigDict({"data": 2, "fsdp": 2, "tensor": 2, "rules": ()}))
  rules = sharding.logical_rules(ml_collections.ConfigDict({"rules": ()}))
  seg, pos = _self_case(gathered=False)
  seg, pos = jnp.concatenate([seg, seg[::-1]]), jnp.concatenate([pos, pos[::-1]])  # B=4.
  q, k, v, dout = (jnp.concatenate([a, a * 0.5]) for a in _qkv(40, 40, seed=4))
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(seg, seg, pos, pos, window))
  fn = lambda q, k, v: attn.attention(q, k, v, seg, spec=_spec(backend), q_pos_BxT=pos, window=window)
  put = lambda a: jax.device_put(a, NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, "tensor")))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    step = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))
    assert "shard_map" in str(jax.make_jaxpr(fn)(q, k, v)), f"{backend} must run under shard_map on a mesh"
    want, got = step(*(put(a) for a in (q, k, v, dout)))
  _check(got, want, f"{backend} sharded over a 2x2x2 mesh")


@pytest.mark.parametrize("objective", [pytest.param("crossbert", marks=pytest.mark.slow), "mlm"])
def test_model_loss_and_grads_chunked_match_xla(objective):
  """The whole loss (encoder with local layers, reconstructor self/cross-attention) in fp32."""
  from crossbert_jax.core import config as config_lib
  from crossbert_jax.training import objectives
  configs = {}
  for backend in ("xla", "chunked"):
    c = config_lib.get_config(objective, "tiny")
    c.unlock()
    c.model.attention, c.model.attention_block_kv = backend, 16
    c.model.global_every, c.model.local_window = 2, 8
    c.reconstructor.self_attention = True
    c.data.seq_len = 48
    configs[backend] = c
  params = nn.unbox(objectives.init_params(configs["xla"], jax.random.key(0)))
  rng = np.random.default_rng(0)
  seg = np.stack([_packed([20, 18], 48)[0], _packed([30, 12], 48)[0]])
  pos = np.stack([_packed([20, 18], 48)[1], _packed([30, 12], 48)[1]])
  batch = {
      "tokens": jnp.asarray(np.where(seg > 0, rng.integers(5, 1024, seg.shape), 0), jnp.int32),
      "segment_ids": jnp.asarray(seg), "positions": jnp.asarray(pos)}
  out = {}
  for backend, c in configs.items():
    loss_fn = objectives.make_loss_fn(c)
    (loss, stats), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch, jax.random.key(1))
    out[backend] = (loss, stats, grads)
  (l0, s0, g0), (l1, s1, g1) = out["xla"], out["chunked"]
  assert float(s0.num_targets) > 0
  np.testing.assert_allclose(l1, l0, rtol=1e-5, err_msg="loss: chunked vs xla")
  np.testing.assert_array_equal(s1.num_correct, s0.num_correct)
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g0), jax.tree.leaves(g1)):
    scale = float(jnp.max(jnp.abs(a))) + 1e-12
    err = float(jnp.max(jnp.abs(a - b)))
    assert err <= 1e-4 * scale, f"grad {jax.tree_util.keystr(path[0])}: chunked vs xla differs by {err:.2e} (max {scale:.2e})"

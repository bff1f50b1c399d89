"""Every attention backend against the dense reference: forward and gradients, on CPU.

Splash (TPU) and the Pallas GPU kernel run in Pallas interpret mode. The cases cover packed
segments, pads (queries see nothing, keys are never seen), queries whose document has no key
(fully masked rows), local windows (on contiguous positions and on gathered ones), and
cross-attention with different query and key lengths.
"""

import functools

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
  return (jax.random.normal(kq, (2, t, H, K)), jax.random.normal(kk, (2, s, H, K)),
          jax.random.normal(kv, (2, s, H, K)), jax.random.normal(kd, (2, t, H, K)))


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
  return attn.AttentionSpec(backend=backend, block_q=16, block_kv=16)


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


@pytest.mark.parametrize("backend", ["chunked", "splash"])
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
  q_seg = jnp.asarray([[1] * 8 + [2] * 6 + [3] * 4 + [0] * 6,   # Segment 3 has no key: masked rows.
                       [3] * 10 + [1] * 10 + [0] * 4], jnp.int32)
  q, k, v, dout = _qkv(24, 40, seed=2)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(q_seg, kv_seg))
  fn = lambda q, k, v: attn.attention(q, k, v, q_seg, kv_seg, spec=_spec(backend))
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  _check(got, want, f"{backend} cross-attention")
  assert float(jnp.max(jnp.abs(got[0][0, 14:]))) == 0.0, "keyless and pad queries must output zeros"


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
  assert attn.resolve_backend(attn.AttentionSpec("splash"), 8, 8) == "splash"


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

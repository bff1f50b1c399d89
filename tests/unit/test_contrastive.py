"""The contrastive loss (InfoNCE) against NumPy, on 8 sharded devices, GradCache against the plain gradient, pooling."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.model import inference
from crossbert_jax.model.encoder import Encoder, EncoderSpec
from crossbert_jax.training import sharding
from crossbert_jax.training.objectives import contrastive, contrastive_cache

# GradCache's and the sharded gradients against the plain one: each leaf's largest difference, relative to
# that leaf's largest entry. Elementwise rtol does not fit: a param's gradient sums many rows' terms, and a
# small entry is what is left after they cancel, so float32 rounding of the terms (the chunks' embeddings
# come from other matmul shapes: measured 2.4e-7 apart at |x| 1.6, then scaled by 1 / temperature) is large
# against that entry though not against the gradient. Measured worst 7.8e-7; 1e-5 leaves rounding room and
# still catches any real error (a missed chunk, a wrong cotangent or key: differences of order 1).
GRAD_RTOL = 1e-5

needs_8_devices = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (the suite's fake CPU devices)")
B, D = 8, 16


def _np_info_nce(a, p, negs=None, t=0.05, symmetric=False, pos_ids=None, neg_ids=None):
  """The reference, in float64, written from the definition: softmax over [all positives, all negatives]."""
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  a, p = unit(a.astype(np.float64)), unit(p.astype(np.float64))
  cands = p if negs is None else np.concatenate([p, unit(negs.reshape(-1, negs.shape[-1]).astype(np.float64))])
  cand_ids = None
  if pos_ids is not None:
    extra = [] if negs is None else (list(neg_ids.reshape(-1)) if neg_ids is not None else [None] *
                                     (len(cands) - len(p)))
    cand_ids = list(pos_ids) + extra

  def direction(rows, cols, n_cols):
    losses = []
    for i in range(len(rows)):
      keep = [j for j in range(n_cols) if j == i or cand_ids is None or cand_ids[j] != pos_ids[i]]
      logits = np.array([rows[i] @ cols[j] / t for j in keep])
      target = keep.index(i)
      losses.append(np.log(np.sum(np.exp(logits - logits.max()))) + logits.max() - logits[target])
    return np.mean(losses)

  loss = direction(a, cands, len(cands))
  if symmetric:
    loss = 0.5 * (loss + direction(p, a, len(p)))
  return loss


def _inputs(seed=0, n=None, dtype=np.float32):
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(B, D))
  p = a + 1.5 * rng.normal(size=(B, D))  # Correlated, so the positives are often (not always) top-1.
  negs = None if n is None else rng.normal(size=(B, D) if n == 1 else (B, n, D))
  cast = lambda x: None if x is None else jnp.asarray(x, dtype)
  return cast(a), cast(p), cast(negs)


@pytest.mark.parametrize("negs", [None, 1, 3], ids=["in_batch", "one_hard", "three_hard"])
@pytest.mark.parametrize("symmetric", [False, True], ids=["one_way", "symmetric"])
@pytest.mark.parametrize("t", [0.05, 1.0])
def test_loss_matches_numpy(negs, symmetric, t):
  a, p, n = _inputs(n=negs)
  loss, m = contrastive.info_nce(a, p, n, temperature=t, symmetric=symmetric)
  ref = _np_info_nce(np.asarray(a), np.asarray(p), None if n is None else np.asarray(n), t, symmetric)
  assert loss.dtype == jnp.float32
  # float32 cosines / t (|logit| <= 20) against float64: ~1e-6 absolute per logit.
  np.testing.assert_allclose(float(loss), ref, rtol=1e-5, atol=1e-6)
  assert 0.0 <= float(m.accuracy) <= 1.0 and float(m.positive_cosine) > float(m.negative_cosine)


@pytest.mark.parametrize("symmetric", [False, True], ids=["one_way", "symmetric"])
def test_duplicate_positives_are_masked(symmetric):
  """Rows 0, 3 and 5 share one positive text (same id, same vector): none of them is another's negative,
  nor is a hard negative that is the same text as an anchor's positive."""
  a, p, n = _inputs(n=2)
  p = p.at[3].set(p[0]).at[5].set(p[0])
  n = n.at[1, 0].set(p[4])  # Anchor 4's positive, given as anchor 1's hard negative.
  pos_ids = np.array([7, 1, 2, 7, 4, 7, 6, 9])
  neg_ids = np.arange(100, 100 + B * 2).reshape(B, 2)
  neg_ids[1, 0] = 4
  loss, m = contrastive.info_nce(a, p, n, temperature=0.05, symmetric=symmetric, positive_ids_B=jnp.asarray(pos_ids),
                                 negative_ids=jnp.asarray(neg_ids))
  ref = _np_info_nce(np.asarray(a), np.asarray(p), np.asarray(n), 0.05, symmetric, pos_ids, neg_ids)
  np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
  unmasked, _ = contrastive.info_nce(a, p, n, temperature=0.05, symmetric=symmetric)
  assert float(unmasked) > float(loss) + 0.1  # The duplicates did count as (hard) negatives without ids.
  assert np.isfinite(float(m.negative_cosine))


def test_masking_keeps_gradients_finite_and_logits_float32():
  """Every candidate but each anchor's own positive masked (all ids equal) in bfloat16: the loss is 0 (as the
  reference's), float32, and its gradients finite."""
  a, p, n = _inputs(n=2, dtype=jnp.bfloat16)
  ids = jnp.zeros((B,), jnp.int32)
  fn = lambda a, p, n: contrastive.info_nce(a, p, n, positive_ids_B=ids, negative_ids=jnp.zeros((B, 2), jnp.int32))[0]
  loss, grads = jax.value_and_grad(fn, argnums=(0, 1, 2))(a, p, n)
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(
      float(loss),
      _np_info_nce(*(np.asarray(x, np.float32) for x in (a, p, n)), 0.05, pos_ids=np.zeros(B), neg_ids=np.zeros(
          (B, 2))), atol=1e-6)
  assert float(loss) == 0.0
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_learnable_temperature():
  """exp(log t) as a traced temperature: the loss equals the fixed one, and d loss / d log t is the
  reference's central difference."""
  a, p, n = _inputs(n=1)
  log_t = contrastive.init_log_temperature(0.07)
  fn = lambda lt: contrastive.info_nce(a, p, n, temperature=contrastive.temperature_of(lt), symmetric=True)[0]
  loss, g = jax.value_and_grad(fn)(log_t)
  np.testing.assert_allclose(float(loss), float(contrastive.info_nce(a, p, n, temperature=0.07, symmetric=True)[0]),
                             rtol=1e-5)
  eps = 1e-4
  ref = lambda lt: _np_info_nce(np.asarray(a), np.asarray(p), np.asarray(n), np.exp(lt), True)
  numeric = (ref(np.log(0.07) + eps) - ref(np.log(0.07) - eps)) / (2 * eps)
  np.testing.assert_allclose(float(g), numeric, rtol=1e-3)


@pytest.mark.parametrize("bad", [0.0, -0.05, float("nan"), float("inf"), "0.05"])
def test_temperature_must_be_positive(bad):
  with pytest.raises(UserError, match=r"^config contrast.temperature: must be a number > 0 .*e\.g\. 0\.05"):
    contrastive.info_nce(*_inputs()[:2], temperature=bad)
  with pytest.raises(UserError, match="contrast.temperature"):
    contrastive.init_log_temperature(bad)


@needs_8_devices
@pytest.mark.parametrize("data,fsdp", [(8, 1), (2, 4)])
def test_sharded_batch_gives_the_global_batch_loss(data, fsdp):
  """The batch's rows over 8 devices (data x fsdp): loss, metrics and input gradients equal one device's,
  and the compiled step gathers the candidates (every anchor meets all B positives and B*N negatives)."""
  a, p, n = _inputs(n=2)
  ids = jnp.asarray([3, 1, 2, 3, 4, 5, 6, 7])

  def fn(a, p, n):
    return contrastive.info_nce(a, p, n, temperature=0.05, symmetric=True, positive_ids_B=ids)

  grad_fn = jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True)
  (loss1, m1), g1 = jax.jit(grad_fn)(a, p, n)
  mesh = jax.make_mesh((data, fsdp, 1), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  rows = sharding.batch_sharding(mesh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
    args = [jax.device_put(x, rows) for x in (a, p, n)]
    jitted = jax.jit(grad_fn, in_shardings=(rows,) * 3)
    (loss8, m8), g8 = jitted(*args)
    hlo = jitted.lower(*args).compile().as_text()
  assert "all-gather" in hlo
  np.testing.assert_allclose(float(loss8), float(loss1), rtol=1e-6)
  # The metrics are means of cosines in [-1, 1] (the negatives' near 0): summed in another order over the
  # shards they differ by a fraction of float32's ulp at 1 (4.7e-9 measured at -O0), so absolutely.
  np.testing.assert_allclose(np.asarray(m8), np.asarray(m1), rtol=1e-6, atol=1e-7)
  _assert_grads_close(g8, g1)


def _assert_grads_close(got, want):
  leaves_got, leaves_want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(leaves_got) == len(leaves_want) > 0
  for path_want, x, y in zip(jax.tree_util.tree_flatten_with_path(want)[0], leaves_got, leaves_want):
    x, y = np.asarray(x), np.asarray(y)
    scale = float(np.max(np.abs(y)))
    assert scale > 0, jax.tree_util.keystr(path_want[0])
    assert float(np.max(np.abs(x - y))) <= GRAD_RTOL * scale, jax.tree_util.keystr(path_want[0])


# -- GradCache ----------------------------------------------------------------------------------------------


def _encoder():
  c = config_lib.get_config("mlm", "tiny")
  with c.unlocked():
    c.model.embed_dim, c.model.num_heads, c.model.num_layers, c.model.mlp_dim, c.model.vocab_size = 32, 2, 2, 64, 64
    c.data.seq_len = 12
  plan_lib.build(c)
  spec = EncoderSpec.from_config(c.model)
  model = Encoder(spec)
  toks = jnp.ones((1, 12), jnp.int32)
  params = nn.unbox(model.init(jax.random.key(0), toks, jnp.arange(12)[None], toks)["params"])
  return model, params


def _texts(m, seq_len=12, seed=0):
  """m texts of 3..seq_len tokens, padded."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, seq_len + 1, m)
  seg = (np.arange(seq_len)[None] < lengths[:, None]).astype(np.int32)
  return {
      "tokens": np.where(seg > 0, rng.integers(5, 64, (m, seq_len)), 0).astype(np.int32), "segment_ids": seg,
      "positions": np.where(seg > 0,
                            np.arange(seq_len)[None], 0).astype(np.int32)}


@pytest.mark.integration  # Compiles a tiny encoder's two scans: 7-13 s each.
@pytest.mark.parametrize("chunk", [4, 5, 24], ids=["divides", "padded", "one_chunk"])
def test_grad_cache_equals_the_plain_gradient(chunk):
  """A real (tiny) encoder, mean pooling, 8 anchors + 8 positives + 8 hard negatives (24 texts): GradCache's
  loss and param gradients equal jax.value_and_grad of the plain loss. Tolerance: float32 with only the
  rounding changed (GRAD_RTOL says why and how much)."""
  model, params = _encoder()
  texts = _texts(3 * B)
  ids = jnp.asarray([0, 1, 2, 0, 4, 5, 6, 7])

  def embed(params, chunk_texts, key=None):
    del key
    hidden = model.apply({"params": params}, chunk_texts["tokens"], chunk_texts["positions"],
                         chunk_texts["segment_ids"])
    return inference.pool(hidden, chunk_texts["segment_ids"], "mean")

  def loss_of(emb):
    return contrastive.info_nce(emb[:B], emb[B:2 * B], emb[2 * B:], temperature=0.05, symmetric=True,
                                positive_ids_B=ids)

  plain = jax.jit(jax.value_and_grad(lambda p: loss_of(embed(p, texts)), has_aux=True))
  cached = jax.jit(lambda p: contrastive_cache.cached_value_and_grad(embed, loss_of, p, texts, chunk))
  (loss_p, m_p), g_p = plain(params)
  (loss_c, m_c), g_c = cached(params)
  np.testing.assert_allclose(float(loss_c), float(loss_p), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(m_c), np.asarray(m_p), rtol=1e-6)
  _assert_grads_close(g_c, g_p)


@needs_8_devices
@pytest.mark.integration  # Compiles a tiny encoder's two scans: 7-13 s each.
def test_grad_cache_on_a_sharded_batch():
  """The 24 texts' rows over 8 devices (mesh data=8), chunks of 8 (one row per device each): GradCache's loss and
  gradients equal the plain loss's on one device."""
  model, params = _encoder()
  texts = _texts(3 * B, seed=2)

  def embed(params, chunk_texts, key=None):
    del key
    hidden = model.apply({"params": params}, chunk_texts["tokens"], chunk_texts["positions"],
                         chunk_texts["segment_ids"])
    return inference.pool(hidden, chunk_texts["segment_ids"], "cls")

  loss_of = lambda emb: contrastive.info_nce(emb[:B], emb[B:2 * B], emb[2 * B:], temperature=0.05)
  (loss1, _), g1 = jax.jit(jax.value_and_grad(lambda p: loss_of(embed(p, texts)), has_aux=True))(params)
  mesh = jax.make_mesh((8, 1, 1), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
    sharded = jax.device_put(texts, sharding.batch_sharding(mesh))
    fn = jax.jit(lambda p, t: contrastive_cache.cached_value_and_grad(embed, loss_of, p, t, 8))
    (loss8, _), g8 = fn(params, sharded)
  np.testing.assert_allclose(float(loss8), float(loss1), rtol=1e-6)
  _assert_grads_close(g8, g1)


@pytest.mark.integration  # Compiles a tiny encoder's two scans: 7-13 s each.
def test_grad_cache_passes_each_chunk_the_same_key_twice():
  """With a key, both passes give chunk i fold_in(key, i): a dropout-style embed_fn still gets the exact
  gradient of the embeddings it produced (checked against the gradient through embed_chunked's own layout)."""
  model, params = _encoder()
  texts = _texts(12, seed=1)

  def embed(params, chunk_texts, key):
    hidden = model.apply({"params": params}, chunk_texts["tokens"], chunk_texts["positions"],
                         chunk_texts["segment_ids"])
    keep = jax.random.bernoulli(key, 0.8, hidden.shape)
    return inference.pool(jnp.where(keep, hidden / 0.8, 0.0), chunk_texts["segment_ids"], "mean")

  loss_of = lambda emb: contrastive.info_nce(emb[:6], emb[6:], temperature=0.1)
  key = jax.random.key(3)
  (loss, _), g = jax.jit(lambda p: contrastive_cache.cached_value_and_grad(embed, loss_of, p, texts, 4, key))(params)
  emb = contrastive_cache.embed_chunked(embed, params, texts, 4, key)
  np.testing.assert_allclose(float(loss), float(loss_of(emb)[0]), rtol=1e-6)

  # The reference: each chunk (rows k, k+3, k+6, k+9) embedded with fold_in(key, k), gradients flowing.
  def reference(p):
    out = jnp.zeros((12, emb.shape[1]))
    for k in range(3):
      rows = np.arange(k, 12, 3)
      out = out.at[rows].set(embed(p, jax.tree.map(lambda x: x[rows], texts), jax.random.fold_in(key, k)))
    return loss_of(out)[0]

  g_ref = jax.jit(jax.grad(reference))(params)
  _assert_grads_close(g, g_ref)


# -- Pooling ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", inference.POOLINGS)
def test_pooling_matches_sentence_transformers(pooling):
  """inference.pool equals sentence-transformers' Pooling module (what the export writes) on padded rows."""
  torch = pytest.importorskip("torch")
  st_models = pytest.importorskip("sentence_transformers.models")
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(4, 7, D)).astype(np.float32)
  seg = (np.arange(7)[None] < np.array([[7], [3], [1], [5]])).astype(np.int32)
  module = st_models.Pooling(D, pooling_mode=pooling)
  theirs = module({"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(seg)})
  ours = inference.pool(jnp.asarray(hidden), jnp.asarray(seg), pooling)
  np.testing.assert_allclose(np.asarray(ours), theirs["sentence_embedding"].numpy(), rtol=1e-6, atol=1e-6)

"""Model information flow by gradients: hidden tokens, segments, windows, gathers, layouts."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.model import layers
from crossbert_jax.model.encoder import Encoder, EncoderBlock, EncoderSpec
from crossbert_jax.model.models import MlmHead
from crossbert_jax.training.objectives import build_model
from crossbert_jax.training import masking

VOCAB = 64
FIRST_REGULAR = 5
PERTURB_PATH = ("encoder", "embeddings", "token_embeddings")


def _config(objective="crossbert", **overrides):
  """The tiny config shrunk further; overrides as section__key=value."""
  c = config_lib.get_config(objective, "tiny")
  with c.unlocked():
    c.model.embed_dim, c.model.num_heads, c.model.num_layers, c.model.mlp_dim = 32, 2, 2, 64
    c.model.vocab_size = VOCAB
    c.reconstructor.embed_dim, c.reconstructor.num_heads = 32, 2
    c.reconstructor.mlp_dim, c.reconstructor.num_layers = 64, 1
    c.data.seq_len, c.train.batch_size = 16, 8
    for key, value in overrides.items():
      section, name = key.split("__")
      c[section][name] = value
  plan_lib.build(c)
  return c


def _encoder_spec(**overrides) -> EncoderSpec:
  base = dict(vocab_size=VOCAB, embed_dim=32, num_heads=2, num_layers=2, mlp_dim=64)
  base.update(overrides)
  return EncoderSpec(**base)


def _packed(segment_lengths_per_row, seq_len, seed=0):
  """(tokens, positions, segment_ids) int32 BxL: segments packed from position 0, positions restart, pads 0."""
  rng = np.random.default_rng(seed)
  b = len(segment_lengths_per_row)
  seg = np.zeros((b, seq_len), np.int32)
  pos = np.zeros((b, seq_len), np.int32)
  for row, lengths in enumerate(segment_lengths_per_row):
    start = 0
    for s, n in enumerate(lengths):
      seg[row, start:start + n] = s + 1
      pos[row, start:start + n] = np.arange(n)
      start += n
    assert start <= seq_len
  tokens = np.where(seg > 0, rng.integers(FIRST_REGULAR, VOCAB, (b, seq_len)), 0).astype(np.int32)
  return tokens, pos, seg


def _unboxed_params(variables):
  return nn.unbox(variables["params"])


def _init(module, *args, **kwargs):
  """Variables shaped like module.init's, filled from numpy: eager flax init compiles every op (slow on CPU).

  Kernels ~ N(0, 0.02), norm scales ~ 1 + N(0, 0.1), perturbations zero.
  """
  abstract = nn.unbox(jax.eval_shape(lambda k: module.init(k, *args, **kwargs), jax.random.key(0)))
  rng = np.random.default_rng(0)

  def fill(path, a):
    if path[0].key == "perturbations":
      return jnp.zeros(a.shape, a.dtype)
    if path[-1].key == "scale":
      return jnp.asarray(1.0 + 0.1 * rng.standard_normal(a.shape), a.dtype)
    return jnp.asarray(0.02 * rng.standard_normal(a.shape), a.dtype)

  return jax.tree_util.tree_map_with_path(fill, abstract)


_crossbert_masks = jax.jit(masking.crossbert_masks, static_argnums=(2, 3, 4))


def _path(tree, path):
  for k in path:
    tree = tree[k]
  return tree


# ---------------------------------------------------------------------------------------------
# CrossBERT: a hidden token cannot influence the view that hides it.


def test_hidden_tokens_get_exactly_zero_gradient_in_their_view():
  c = _config()
  model = build_model(c)
  seq_len = c.data.seq_len
  tokens, pos, seg = _packed([[16], [9, 5], [4, 6, 3], [7]], seq_len, seed=1)
  masks = _crossbert_masks(jax.random.key(3), jnp.asarray(seg), c.masking.ratio, c.masking.views, 1.0)
  view_args = lambda k: (masks.vis_idx_KxBxT[k], masks.rec_idx_KxBxQ[k], masks.rec_valid_KxBxQ[k])
  variables = _init(model, tokens, pos, seg, *view_args(0))
  assert "perturbations" in variables, "Embeddings must declare a 'token_embeddings' perturbation (flax perturb)"
  params = _unboxed_params(variables)
  perturb = variables["perturbations"]
  assert _path(perturb, PERTURB_PATH).shape == (4, seq_len, c.model.embed_dim), (
      "the perturbation must sit on the FULL-length token embeddings (before the gather of visible tokens)")

  def view_loss(perturb, vis_idx, rec_idx, rec_valid):
    logits = model.apply({"params": params, "perturbations": perturb}, tokens, pos, seg, vis_idx, rec_idx, rec_valid)
    targets = jnp.take_along_axis(jnp.asarray(tokens), rec_idx, axis=1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(ce * rec_valid.astype(jnp.float32))

  grad_fn = jax.jit(jax.grad(view_loss))  # One compile: the views differ only in index values.
  for k in range(c.masking.views):
    g = np.asarray(_path(grad_fn(perturb, *view_args(k)), PERTURB_PATH))
    g_norm_BxL = np.abs(g).sum(-1)
    vis_idx, vis_valid = np.asarray(masks.vis_idx_KxBxT[k]), np.asarray(masks.vis_valid_KxBxT[k])
    rec_idx, rec_valid = np.asarray(masks.rec_idx_KxBxQ[k]), np.asarray(masks.rec_valid_KxBxQ[k])
    visible = np.zeros_like(seg, bool)
    queried_segment = np.zeros_like(seg, bool)  # Tokens whose document has a valid query in this view.
    for b in range(seg.shape[0]):
      visible[b, vis_idx[b][vis_valid[b]]] = True
      queried_segment[b] = np.isin(seg[b], seg[b, rec_idx[b][rec_valid[b]]]) & (seg[b] > 0)
    hidden = ~visible & (seg > 0)  # Pads: see test_query_without_visible_tokens_of_its_segment_sees_nothing.
    assert (g_norm_BxL[hidden] == 0.0).all(), (
        f"view {k}: information leaks from hidden (masked) tokens into the loss; non-zero gradient at "
        f"(row, position) {np.argwhere(hidden & (g_norm_BxL != 0)).tolist()}")
    used = visible & queried_segment
    assert used.sum() > 10 and (g_norm_BxL[used] > 0).all(), (
        f"view {k}: visible tokens whose document is reconstructed in this view get no gradient at "
        f"{np.argwhere(used & (g_norm_BxL == 0)).tolist()}; the reconstructor does not read the encoder")


# ---------------------------------------------------------------------------------------------
# Encoder: segments, local windows, gathered subsets, scan layout, remat.


@pytest.mark.parametrize("global_every,num_layers", [(1, 2), (3, 3)], ids=["all_global", "local_global"])
def test_attention_never_crosses_segments(global_every, num_layers):
  spec = _encoder_spec(num_layers=num_layers, global_every=global_every, local_window=4)
  enc = Encoder(spec)
  seq_len = 32
  tokens, pos, seg = _packed([[8, 12, 8]], seq_len, seed=2)  # Segments 1, 2, 3, then 4 pads.
  variables = _init(enc, tokens, pos, seg)
  params, perturb = _unboxed_params(variables), variables["perturbations"]
  in_seg2 = jnp.asarray(seg == 2)

  def seg2_sum(perturb):
    out = enc.apply({"params": params, "perturbations": perturb}, tokens, pos, seg)
    return jnp.sum(jnp.where(in_seg2[:, :, None], out, 0.0))

  g = np.abs(np.asarray(_path(jax.jit(jax.grad(seg2_sum))(perturb), ("embeddings", "token_embeddings")))).sum(-1)[0]
  outside = seg[0] != 2
  assert (g[outside] == 0.0).all(), (
      f"attention crosses a document boundary: segment 2's outputs depend on positions "
      f"{np.flatnonzero(outside & (g != 0)).tolist()} (segments {seg[0][outside & (g != 0)].tolist()})")
  assert (g[~outside] > 0).all(), f"segment 2 tokens without gradient: {np.flatnonzero(~outside & (g == 0)).tolist()}"


def test_local_attention_window_by_gradients():
  """One local block (layer 0 is always global, so the window is checked on a block alone)."""
  spec = _encoder_spec(num_layers=3, global_every=3, local_window=4)
  seq_len, d = 16, spec.embed_dim
  tokens, pos, seg = _packed([[10, 6]], seq_len)
  x = jax.random.normal(jax.random.key(1), (1, seq_len, d))
  rope_g = layers.rope_tables(jnp.asarray(pos), spec.head_dim, spec.rope_theta)
  rope_l = layers.rope_tables(jnp.asarray(pos), spec.head_dim, spec.local_rope_theta)
  seg_j, pos_j = jnp.asarray(seg), jnp.asarray(pos)
  block = EncoderBlock(spec)
  params = _init(block, x, rope_g, rope_l, seg_j, pos_j, False)
  query = 4  # Segment 1, position 4: sees positions 2..6 of segment 1 only.
  out_fn = lambda is_global: lambda x: block.apply(params, x, rope_g, rope_l, seg_j, pos_j, is_global)[0, query].sum()
  g, g_global = jax.jit(lambda x: (jax.grad(out_fn(False))(x), jax.grad(out_fn(True))(x)))(x)
  g, g_global = (np.abs(np.asarray(a)).sum(-1)[0] for a in (g, g_global))
  half = spec.local_window // 2
  expected = (seg[0] == seg[0, query]) & (np.abs(pos[0] - pos[0, query]) <= half)
  assert (g[~expected] == 0.0).all(), (
      f"local layer: token {query} gets gradient from positions {np.flatnonzero(~expected & (g != 0)).tolist()}, "
      f"outside its segment or farther than local_window//2={half}")
  assert (g[expected]
          > 0).all(), f"local layer: in-window positions without gradient {np.flatnonzero(expected & (g == 0))}"
  assert (g_global[seg[0] == 1] > 0).all(), "a global layer must see the whole segment"


@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
def test_gathered_subset_equals_shorter_sequence(scan_layers):
  spec = _encoder_spec(num_layers=3, global_every=3, local_window=4, scan_layers=scan_layers)
  enc = Encoder(spec)
  seq_len = 24
  tokens, pos, seg = _packed([[24], [10, 9], [5, 7, 6]], seq_len, seed=3)
  rng = np.random.default_rng(0)
  t = 13
  keep = np.stack([rng.permutation(seq_len)[:t] for _ in range(3)]).astype(np.int32)  # Random order, pads included.
  params = _unboxed_params(_init(enc, tokens, pos, seg, keep))
  take = lambda a: np.take_along_axis(a, keep, axis=1)
  gathered, shorter = jax.jit(lambda p: (enc.apply({"params": p}, tokens, pos, seg, keep),
                                         enc.apply({"params": p}, take(tokens), take(pos), take(seg))))(params)
  assert gathered.shape == (3, t, spec.embed_dim), gathered.shape
  real = take(seg) > 0
  np.testing.assert_allclose(
      np.asarray(gathered)[real],
      np.asarray(shorter)[real], atol=1e-5, rtol=1e-5,
      err_msg="encoder on keep_idx differs from the encoder on the shorter sequence "
      "(original position and segment ids must travel with the kept tokens)")


def _to_scan_params(params, num_layers):
  """Non-scan layout (layers_0..N-1) -> scan layout (layers_0, layers/block stacked over 1..N-1)."""
  out = {k: v for k, v in params.items() if not k.startswith("layers_")}
  out["layers_0"] = params["layers_0"]
  stacked = [params[f"layers_{i}"] for i in range(1, num_layers)]
  out["layers"] = {"block": jax.tree.map(lambda *xs: jnp.stack(xs), *stacked)}
  return out


@pytest.mark.parametrize("global_every", [1, 3])
def test_scan_layers_matches_loop(global_every):
  num_layers, seq_len = 3, 16
  tokens, pos, seg = _packed([[16], [9, 5]], seq_len, seed=4)
  loop = Encoder(_encoder_spec(num_layers=num_layers, global_every=global_every, local_window=4))
  scan = Encoder(_encoder_spec(num_layers=num_layers, global_every=global_every, local_window=4, scan_layers=True))
  params = _unboxed_params(_init(loop, tokens, pos, seg))
  scan_params = _to_scan_params(params, num_layers)
  expected_shapes = jax.tree.map(lambda a: a.shape,
                                 nn.unbox(jax.eval_shape(lambda: _init(scan, tokens, pos, seg))["params"]))
  assert jax.tree.map(lambda a: a.shape, scan_params) == expected_shapes, (
      "scan layout is not layers_0 + layers/block stacked over layers 1..N-1")
  a, b = jax.jit(lambda p, sp: (loop.apply({"params": p}, tokens, pos, seg, return_all_layers=True),
                                scan.apply({"params": sp}, tokens, pos, seg, return_all_layers=True)))(params,
                                                                                                       scan_params)
  np.testing.assert_allclose(np.asarray(b[0]), np.asarray(a[0]), atol=1e-5, rtol=1e-5,
                             err_msg="scan_layers=True output differs from the layer loop with the same weights")
  assert len(b[1]) == len(a[1]) == num_layers + 1, "return_all_layers must give embeddings + every block output"
  for i, (x, y) in enumerate(zip(a[1], b[1])):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-5, rtol=1e-5,
                               err_msg=f"scan vs loop: layer output {i} differs")


@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
def test_remat_full_matches_none(scan_layers):
  seq_len = 16
  tokens, pos, seg = _packed([[16], [9, 5]], seq_len, seed=5)
  plain = Encoder(_encoder_spec(scan_layers=scan_layers))
  remat = Encoder(_encoder_spec(scan_layers=scan_layers, remat="full"))
  params = _unboxed_params(_init(plain, tokens, pos, seg))
  loss = lambda m: lambda p: jnp.sum(m.apply({"params": p}, tokens, pos, seg) ** 2)
  (la, ga), (lb, gb) = jax.jit(lambda p: tuple(jax.value_and_grad(loss(m))(p) for m in (plain, remat)))(params)
  np.testing.assert_allclose(float(lb), float(la), rtol=1e-6, err_msg="remat='full' changes the encoder output")
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-6, rtol=1e-5,
                               err_msg=f"remat='full' changes the gradient of {jax.tree_util.keystr(path)}")


# ---------------------------------------------------------------------------------------------
# Reconstructor options and the MLM head.


def _crossbert_setup(c, seed=0):
  model = build_model(c)
  tokens, pos, seg = _packed([[16], [9, 5], [4, 6, 3], [7]], c.data.seq_len, seed=seed)
  masks = _crossbert_masks(jax.random.key(seed), jnp.asarray(seg), c.masking.ratio, c.masking.views, 1.0)
  args = (masks.vis_idx_KxBxT[0], masks.rec_idx_KxBxQ[0], masks.rec_valid_KxBxQ[0])
  params = _unboxed_params(_init(model, tokens, pos, seg, *args))
  return model, params, (tokens, pos, seg), args


@pytest.mark.parametrize("rec_width,tie_head", [(32, True), (16, False)], ids=["tied_same_width", "half_width"])
def test_reconstructor_options(rec_width, tie_head):
  c = _config(reconstructor__self_attention=True, reconstructor__feature_mixing=True, reconstructor__tie_head=tie_head,
              reconstructor__embed_dim=rec_width, reconstructor__mlp_dim=2 * rec_width, reconstructor__num_layers=2)
  model, params, (tokens, pos, seg), (vis_idx, rec_idx, rec_valid) = _crossbert_setup(c)
  rp = params["reconstructor"]
  assert ("head" in rp) != tie_head, f"tie_head={tie_head} but reconstructor params are {sorted(rp)}"
  assert "mix_weights" in rp["layers_0"] and "self_attn" in rp["layers_0"], (
      f"feature_mixing / self_attention params missing: {sorted(rp['layers_0'])}")
  assert rp["layers_0"]["mix_weights"].shape == (c.model.num_layers + 1,), "one mix weight per encoder layer output"
  wkv = rp["layers_0"]["cross_attn"]["Wkv"]["kernel"]
  assert wkv.shape[0] == c.model.embed_dim and rp["mask_embedding"].shape == (rec_width,), (
      "K/V projections must map the encoder width into the reconstructor width")

  @jax.jit
  def loss_fn(params, rec_idx, rec_valid):
    logits = model.apply({"params": params}, tokens, pos, seg, vis_idx, rec_idx, rec_valid)
    targets = jnp.take_along_axis(jnp.asarray(tokens), rec_idx, axis=1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(ce * rec_valid) / jnp.sum(rec_valid), logits

  loss, logits = loss_fn(params, rec_idx, rec_valid)
  b, q = rec_idx.shape
  assert logits.shape == (b, q, VOCAB) and logits.dtype == jnp.float32, logits.shape
  assert np.isfinite(float(loss)), f"loss is {float(loss)}"

  # An invalid query (segment 0) must not affect the valid queries: move it, change nothing else.
  rec_valid = np.asarray(rec_valid).copy()
  rec_idx = np.asarray(rec_idx).copy()
  row, slot = 0, 1
  rec_valid[row, slot] = False
  before = loss_fn(params, rec_idx, rec_valid)[1]
  rec_idx[row, slot] = rec_idx[row, slot + 1]
  after = loss_fn(params, rec_idx, rec_valid)[1]
  np.testing.assert_array_equal(
      np.asarray(after)[rec_valid],
      np.asarray(before)[rec_valid], "an invalid reconstruction query (segment 0) changed the valid queries' logits")

  if tie_head:  # The head is the encoder's token embedding: change an unused row, only that logit moves.
    unused = int(np.setdiff1d(np.arange(FIRST_REGULAR, VOCAB), tokens)[0])
    table_path = ("encoder", "embeddings", "tok_embeddings", "embedding")
    bumped = jax.tree_util.tree_map_with_path(
        lambda p, a: a.at[unused].add(1.0) if tuple(k.key for k in p) == table_path else a, params)
    moved = np.asarray(loss_fn(bumped, rec_idx, rec_valid)[1])
    delta = np.abs(moved - np.asarray(before)).max(axis=(0, 1))
    assert delta[unused] > 0 and np.delete(delta, unused).max() == 0.0, (
        f"tied head: changing embedding row {unused} must move only logit {unused}; moved {np.flatnonzero(delta)}")


def test_mlm_logits_shape_and_tied_decoder():
  c = _config("mlm", masking__ratio=0.25)
  model = build_model(c)
  tokens, pos, seg = _packed([[16], [9, 5], [4, 6, 3], [7]], c.data.seq_len, seed=6)
  masks = jax.jit(masking.mlm_masks, static_argnums=2)(jax.random.key(0), jnp.asarray(seg), c.masking.ratio)
  params = _unboxed_params(_init(model, tokens, pos, seg, masks.mask_idx_BxM))
  apply = jax.jit(model.apply)
  logits = apply({"params": params}, tokens, pos, seg, masks.mask_idx_BxM)
  assert logits.shape == (4, round(c.masking.ratio * c.data.seq_len),
                          VOCAB), f"MLM logits {logits.shape}, want [B, M, V]"
  head_shapes = jax.tree.map(lambda a: a.shape, params["head"])
  assert not [
      s for s in jax.tree.leaves(head_shapes, is_leaf=lambda x: isinstance(x, tuple)) if len(s) == 2 and VOCAB in s
  ], f"the MLM head has its own decoder kernel: {head_shapes}"
  unused = int(np.setdiff1d(np.arange(FIRST_REGULAR, VOCAB), tokens)[0])
  bumped = jax.tree.map(lambda a: a, params)
  emb = bumped["encoder"]["embeddings"]["tok_embeddings"]["embedding"]
  bumped["encoder"]["embeddings"]["tok_embeddings"]["embedding"] = emb.at[unused].add(1.0)
  moved = np.asarray(apply({"params": bumped}, tokens, pos, seg, masks.mask_idx_BxM))
  delta = np.abs(moved - np.asarray(logits)).max(axis=(0, 1))
  assert delta[unused] > 0 and np.delete(delta, unused).max() == 0.0, (
      f"MLM decoder must be tied to the token embedding: changing row {unused} moved logits {np.flatnonzero(delta)}")


def test_query_without_visible_tokens_of_its_segment_sees_nothing():
  c = _config()
  model = build_model(c)
  tokens, pos, seg = _packed([[8, 4]], 16, seed=7)  # Segment 1: 0..7, segment 2: 8..11, pads 12..15.
  vis_idx = jnp.asarray([[0, 1, 2, 3, 4, 5, 12, 13]], jnp.int32)  # Segment 2 entirely hidden; 2 pad fills.
  rec_idx = jnp.asarray([[6, 7, 8, 9, 10, 11, 14, 15]], jnp.int32)
  rec_valid = jnp.asarray([[True] * 6 + [False] * 2])
  variables = _init(model, tokens, pos, seg, vis_idx, rec_idx, rec_valid)
  params, perturb = _unboxed_params(variables), variables["perturbations"]

  def seg2_logits(perturb):
    logits = model.apply({"params": params, "perturbations": perturb}, tokens, pos, seg, vis_idx, rec_idx, rec_valid)
    return jnp.sum(logits[0, 2:6] ** 2)  # The queries at positions 8..11 (segment 2).

  g = np.abs(np.asarray(_path(jax.jit(jax.grad(seg2_logits))(perturb), PERTURB_PATH))).sum(-1)[0]
  assert (g == 0.0).all(), (
      f"a segment-2 query with no visible segment-2 token depends on positions {np.flatnonzero(g).tolist()} "
      f"(segments {seg[0][g != 0].tolist()}): attention crosses a document boundary / reads pads. Fix: zero the "
      "attention output of fully masked query rows in model/attention.py")


@pytest.mark.parametrize("part", ["rope_tables", "mlm_head"])
def test_strict_rank_promotion(part):
  assert jax.config.jax_numpy_rank_promotion == "raise", "conftest must set strict rank promotion"
  if part == "rope_tables":
    cos, _ = layers.rope_tables(jnp.zeros((2, 4), jnp.int32), 8, 1e4)
    assert cos.shape == (2, 4, 4)
  else:
    spec = _encoder_spec()
    x = jnp.ones((2, 3, spec.embed_dim))
    emb = jnp.ones((VOCAB, spec.embed_dim))
    logits = jax.eval_shape(lambda: MlmHead(spec).init_with_output(jax.random.key(0), x, emb)[0])
    assert logits.shape == (2, 3, VOCAB)


@pytest.mark.parametrize("global_every", [1, 2], ids=["global", "local_layers"])
def test_the_order_of_the_visible_slots_changes_no_output(global_every):
  """masking puts the visible slots in row order (for the window kernel's binary search); the model must
  be indifferent to that order: any permutation of them gives the same reconstruction logits."""
  c = _config(reconstructor__self_attention=True, reconstructor__feature_mixing=True, model__global_every=global_every,
              model__local_window=4)
  model, params, (tokens, pos, seg), (vis_idx, rec_idx, rec_valid) = _crossbert_setup(c)
  shuffled = jax.vmap(
      lambda key, row: jax.random.permutation(key, row))(jax.random.split(jax.random.key(9), vis_idx.shape[0]), vis_idx)
  assert not np.array_equal(shuffled, vis_idx)
  logits = jax.jit(lambda v: model.apply({"params": params}, tokens, pos, seg, v, rec_idx, rec_valid))
  np.testing.assert_allclose(logits(shuffled), logits(vis_idx), atol=1e-5, rtol=1e-5)

"""Masks drawn in the step: partitions, exact counts, pads never predicted, 80/10/10."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crossbert_jax.training import masking

L = 24  # Divisible by 2, 3 and 4 (complementary views need L % K == 0).
VOCAB = 1024
MASK_ID, NUM_SPECIAL = 4, 5


def _segments(n_real_per_row, seq_len=L):
  """Packed rows: real tokens in 1-3 segments (lengths vary), then pads (segment 0)."""
  seg = np.zeros((len(n_real_per_row), seq_len), np.int32)
  for b, n in enumerate(n_real_per_row):
    cuts = sorted({n // 3, (2 * n) // 3})
    ids = np.ones(n, np.int32)
    for cut in cuts:
      if 0 < cut < n:
        ids[cut:] += 1
    seg[b, :n] = ids
  return seg


# Full rows, rows with pads at the end (different amounts per row), an all-pad row.
FULL_ROWS = [L, L, L]
PADDED_ROWS = [L - 1, L - 5, 17, 13, 7, 2, 1]
ALL_PAD_ROW = [0]
ALL_ROWS = FULL_ROWS + PADDED_ROWS + ALL_PAD_ROW


def _np(masks):
  return type(masks)(*(np.asarray(a) for a in masks))


# One compile per static (ratio, views, reconstruct_ratio) and shape; eager dispatch is slower on CPU.
_crossbert_masks = jax.jit(masking.crossbert_masks, static_argnums=(2, 3, 4))
_mlm_masks = jax.jit(masking.mlm_masks, static_argnums=(2,))
_corrupt = jax.jit(masking.corrupt,
                   static_argnames=("mask_prob", "random_prob", "mask_id", "first_regular_id", "vocab_size"))


def _masks(seg, ratio, views, reconstruct_ratio=1.0, seed=0):
  return _np(_crossbert_masks(jax.random.key(seed), jnp.asarray(seg), ratio, views, reconstruct_ratio))


def _check_shapes(m, seg, ratio, views, reconstruct_ratio=1.0):
  b, seq_len = seg.shape
  t, q = masking.slot_counts(seq_len, ratio, views, reconstruct_ratio)
  for name, a, shape in (("vis_idx", m.vis_idx_KxBxT, (views, b, t)), ("vis_valid", m.vis_valid_KxBxT, (views, b, t)),
                         ("rec_idx", m.rec_idx_KxBxQ, (views, b, q)), ("rec_valid", m.rec_valid_KxBxQ, (views, b, q))):
    assert a.shape == shape, f"{name} has shape {a.shape}, expected {shape} (K, B, slots)"
  for name, a in (("vis_idx", m.vis_idx_KxBxT), ("rec_idx", m.rec_idx_KxBxQ)):
    assert a.min() >= 0 and a.max() < seq_len, f"{name} holds positions outside [0, {seq_len}): {a.min()}..{a.max()}"


def _view_sets(m, seg, k, b):
  """(valid visible positions, valid reconstructed positions) of view k, row b; checks per-slot invariants."""
  vis, vis_ok = m.vis_idx_KxBxT[k, b], m.vis_valid_KxBxT[k, b]
  rec, rec_ok = m.rec_idx_KxBxQ[k, b], m.rec_valid_KxBxQ[k, b]
  real = seg[b] > 0
  where = f"view {k}, row {b} (n_real={int(real.sum())})"
  assert real[vis[vis_ok]].all(), f"{where}: a valid visible slot points at a pad: {vis[vis_ok]}"
  assert not real[vis[~vis_ok]].any(), (
      f"{where}: a spare (invalid) visible slot points at a real token, which the encoder would then see: "
      f"positions {vis[~vis_ok][real[vis[~vis_ok]]]}")
  assert real[rec[rec_ok]].all(), f"{where}: a valid reconstruction slot points at a pad: {rec[rec_ok]}"
  assert len(set(vis[vis_ok])) == vis_ok.sum(), f"{where}: a visible position is repeated: {vis[vis_ok]}"
  assert len(set(rec[rec_ok])) == rec_ok.sum(), f"{where}: a reconstructed position is repeated: {rec[rec_ok]}"
  assert len(set(vis)) == len(vis), f"{where}: visible slots (incl. pad fill) repeat a position: {vis}"
  vis_set, rec_set = set(vis[vis_ok].tolist()), set(rec[rec_ok].tolist())
  assert not vis_set & rec_set, f"{where}: positions both visible and reconstructed: {sorted(vis_set & rec_set)}"
  return vis_set, rec_set


def test_two_complementary_views_partition_real_tokens():
  seg = _segments(ALL_ROWS)
  m = _masks(seg, 0.5, 2)
  _check_shapes(m, seg, 0.5, 2)
  for b in range(seg.shape[0]):
    real = set(np.flatnonzero(seg[b] > 0).tolist())
    (v0, r0), (v1, r1) = _view_sets(m, seg, 0, b), _view_sets(m, seg, 1, b)
    assert not v0 & v1, f"row {b}: the two views show the same positions {sorted(v0 & v1)}"
    assert v0 | v1 == real, f"row {b}: the views' visible sets do not cover the real tokens; missing {sorted(real - v0 - v1)}"
    assert abs(len(v0) - len(v1)) <= 1, f"row {b}: unbalanced views {len(v0)} vs {len(v1)}"
    counts = collections.Counter(sorted(r0) + sorted(r1))
    assert set(counts) == real and set(counts.values()) <= {
        1}, (f"row {b}: every real token must be reconstructed exactly once across the 2 views; counts {dict(counts)}, "
             f"real {sorted(real)}")
    assert r0 == v1 and r1 == v0, f"row {b}: view 0 must reconstruct exactly what view 1 shows (and vice versa)"
  all_pad = seg.shape[0] - 1
  assert not m.vis_valid_KxBxT[:, all_pad].any() and not m.rec_valid_KxBxQ[:, all_pad].any(), (
      "the all-pad row must have no valid visible or reconstruction slot")


@pytest.mark.parametrize("ratio", [0.15, 0.5, 0.75])
def test_random_masking_exact_counts(ratio):
  seg = _segments(ALL_ROWS)
  m = _masks(seg, ratio, 1, seed=1)
  _check_shapes(m, seg, ratio, 1)
  n_masked_full = round(ratio * L)
  assert m.vis_idx_KxBxT.shape[-1] == L - n_masked_full, "K=1 must have n_vis = L - round(r*L) visible slots"
  for b in range(seg.shape[0]):
    n_real = int((seg[b] > 0).sum())
    vis, rec = _view_sets(m, seg, 0, b)
    n_rec = round(ratio * n_real)
    assert len(
        rec
    ) == n_rec, f"ratio {ratio}, row {b} (n_real={n_real}): {len(rec)} reconstructed, expected round(r*n_real)={n_rec}"
    assert len(vis) == n_real - n_rec, f"ratio {ratio}, row {b}: {len(vis)} visible, expected {n_real - n_rec}"
    assert vis | rec == set(np.flatnonzero(
        seg[b] > 0).tolist()), f"row {b}: visible + reconstructed must cover the real tokens"
    if n_real == L:
      assert m.vis_valid_KxBxT[0, b].all() and m.rec_valid_KxBxQ[0, b].all(), (
          f"ratio {ratio}: a full row must fill every visible and reconstruction slot")


@pytest.mark.parametrize("views", [3, 4])
def test_k_complementary_views_partition(views):
  ratio = 1.0 - 1.0 / views
  seg = _segments(ALL_ROWS)
  m = _masks(seg, ratio, views, seed=2)
  _check_shapes(m, seg, ratio, views)
  for b in range(seg.shape[0]):
    real = set(np.flatnonzero(seg[b] > 0).tolist())
    sets = [_view_sets(m, seg, k, b) for k in range(views)]
    shown = collections.Counter(p for v, _ in sets for p in v)
    assert set(shown) == real and set(shown.values()) <= {
        1}, (f"K={views}, row {b}: each real token must be shown by exactly one view; counts {dict(shown)}")
    for k, (v, r) in enumerate(sets):
      assert r == real - v, f"K={views}, view {k}, row {b}: must reconstruct every real token it hides"
      assert len(v) in (len(real) // views,
                        -(-len(real) // views)), f"K={views}: view {k} shows {len(v)} of {len(real)}"


@pytest.mark.parametrize("ratio,views,reconstruct_ratio", [(0.75, 1, 0.5), (0.5, 2, 0.5), (0.75, 4, 0.3)])
def test_partial_reconstruction_is_a_subset_of_the_masked_tokens(ratio, views, reconstruct_ratio):
  seg = _segments(ALL_ROWS)
  full = _masks(seg, ratio, views, seed=3)
  part = _masks(seg, ratio, views, reconstruct_ratio, seed=3)
  _check_shapes(part, seg, ratio, views, reconstruct_ratio)
  q_full, q_part = full.rec_idx_KxBxQ.shape[-1], part.rec_idx_KxBxQ.shape[-1]
  assert q_part == max(1, round(reconstruct_ratio * q_full)) < q_full, (
      f"reconstruct_ratio={reconstruct_ratio}: {q_part} slots, expected round(rr * {q_full})")
  np.testing.assert_array_equal(part.vis_idx_KxBxT, full.vis_idx_KxBxT,
                                "partial reconstruction changed the visible set")
  for k in range(views):
    for b in range(seg.shape[0]):
      vis, rec = _view_sets(part, seg, k, b)
      _, masked = _view_sets(full, seg, k, b)
      assert rec <= masked, f"view {k}, row {b}: reconstructs {sorted(rec - masked)} which are not masked"
      assert not rec & vis, f"view {k}, row {b}: reconstructs visible tokens {sorted(rec & vis)}"
      if seg[b].all():
        assert len(rec) == q_part, f"view {k}, full row {b}: {len(rec)} valid of {q_part} slots"


def test_masks_are_deterministic_per_step_key():
  seg = _segments(ALL_ROWS)
  base = jax.random.key(42)
  draw = lambda step: _masks_from_key(jax.random.fold_in(base, step), seg)
  a, b, c = draw(7), draw(7), draw(8)
  for name, x, y, _z in zip(a._fields, a, b, c):
    np.testing.assert_array_equal(x, y, f"{name}: the same step key must give the same masks (restart safety)")
  assert not np.array_equal(a.vis_idx_KxBxT, c.vis_idx_KxBxT), "different steps must give different masks"
  m = _np(_mlm_masks(jax.random.fold_in(base, 7), jnp.asarray(seg), 0.3))
  m2 = _np(_mlm_masks(jax.random.fold_in(base, 7), jnp.asarray(seg), 0.3))
  m3 = _np(_mlm_masks(jax.random.fold_in(base, 8), jnp.asarray(seg), 0.3))
  np.testing.assert_array_equal(m.mask_idx_BxM, m2.mask_idx_BxM, "mlm masks differ for the same step key")
  assert not np.array_equal(m.mask_idx_BxM, m3.mask_idx_BxM), "mlm masks must differ across steps"


def _masks_from_key(key, seg):
  return _np(_crossbert_masks(key, jnp.asarray(seg), 0.5, 2, 1.0))


@pytest.mark.parametrize("ratio", [0.15, 0.3])
def test_mlm_masks_select_round_ratio_real_tokens(ratio):
  seg = _segments(ALL_ROWS)
  m = _np(_mlm_masks(jax.random.key(5), jnp.asarray(seg), ratio))
  assert m.mask_idx_BxM.shape == (seg.shape[0],
                                  round(ratio * L)), f"mlm slots {m.mask_idx_BxM.shape}, expected M=round(r*L)"
  for b in range(seg.shape[0]):
    n_real = int((seg[b] > 0).sum())
    sel = m.mask_idx_BxM[b][m.mask_valid_BxM[b]]
    assert len(sel) == round(ratio *
                             n_real), f"row {b} (n_real={n_real}): {len(sel)} selected, expected round(r*n_real)"
    assert len(set(sel.tolist())) == len(sel), f"row {b}: a position is selected twice: {sel}"
    assert (seg[b, sel] > 0).all(), f"row {b}: a pad position is selected: {sel}"


def test_corrupt_80_10_10_split():
  rng = np.random.default_rng(0)
  b, seq_len, ratio = 64, 64, 0.5
  n_real = rng.integers(seq_len // 2, seq_len + 1, b)
  seg = (np.arange(seq_len)[None, :] < n_real[:, None]).astype(np.int32)
  tokens = np.where(seg > 0, rng.integers(NUM_SPECIAL, VOCAB, (b, seq_len)), 0).astype(np.int32)
  counts = collections.Counter()
  for s in range(8):
    k_mask, k_corrupt = jax.random.split(jax.random.key(100 + s))
    masks = _mlm_masks(k_mask, jnp.asarray(seg), ratio)
    out = np.asarray(
        _corrupt(k_corrupt, jnp.asarray(tokens), masks, mask_prob=0.8, random_prob=0.1, mask_id=MASK_ID,
                 first_regular_id=NUM_SPECIAL, vocab_size=VOCAB))
    idx, valid = np.asarray(masks.mask_idx_BxM), np.asarray(masks.mask_valid_BxM)
    selected = np.zeros_like(seg, bool)
    for row in range(b):
      selected[row, idx[row][valid[row]]] = True
    assert (selected.sum(1) == np.round(ratio * n_real)).all(), "corrupt: wrong number of selected positions per row"
    np.testing.assert_array_equal(out[~selected], tokens[~selected], "corrupt changed a token that was not selected")
    new, orig = out[selected], tokens[selected]
    is_mask = new == MASK_ID
    is_random = (new != MASK_ID) & (new != orig)
    assert ((new[is_random] >= NUM_SPECIAL) & (new[is_random] < VOCAB)).all(), (
        f"random replacements must be regular tokens in [{NUM_SPECIAL}, {VOCAB}): {new[is_random].min()}..{new[is_random].max()}"
    )
    counts.update(mask=int(is_mask.sum()), random=int(is_random.sum()), same=int((new == orig).sum()), n=len(new))
  n = counts["n"]
  # A random replacement equals the original with prob ~1/1019; counted as "same" below.
  frac = {k: counts[k] / n for k in ("mask", "random", "same")}
  assert n > 5000, n
  assert abs(frac["mask"] - 0.8) < 0.02, f"[MASK] fraction {frac['mask']:.3f}, expected 0.80 +- 0.02 over {n} tokens"
  assert abs(frac["random"] - 0.1) < 0.015, f"random fraction {frac['random']:.3f}, expected 0.10 +- 0.015"
  assert abs(frac["same"] - 0.1) < 0.015, f"unchanged fraction {frac['same']:.3f}, expected 0.10 +- 0.015"


def test_masks_run_under_jit():
  """Masks drawn inside a larger jitted function (as in the step) equal the standalone ones."""
  seg = jnp.asarray(_segments(ALL_ROWS))
  key = jax.random.key(9)

  @jax.jit
  def step_like(key, seg):
    return masking.crossbert_masks(jax.random.fold_in(key, 3), seg, ratio=0.75, views=4, reconstruct_ratio=0.5)

  inside = _np(step_like(key, seg))
  alone = _masks_from_key_args(jax.random.fold_in(key, 3), seg, 0.75, 4, 0.5)
  for name, x, y in zip(inside._fields, inside, alone):
    np.testing.assert_array_equal(x, y, f"crossbert_masks inside a jitted function differs: {name}")

  @jax.jit
  def mlm(key, seg, tokens):
    k1, k2 = jax.random.split(key)
    masks = masking.mlm_masks(k1, seg, 0.15)
    return masks, masking.corrupt(k2, tokens, masks, mask_prob=0.8, random_prob=0.1, mask_id=MASK_ID,
                                  first_regular_id=NUM_SPECIAL, vocab_size=VOCAB)

  tokens = jnp.where(seg > 0, 7, 0).astype(jnp.int32)
  masks, out = mlm(key, seg, tokens)
  assert out.shape == tokens.shape and out.dtype == tokens.dtype, "corrupt under jit changed shape/dtype"
  changed = np.asarray(out != tokens)
  assert changed.sum() <= np.asarray(masks.mask_valid_BxM).sum(), "corrupt under jit changed more tokens than selected"


def _masks_from_key_args(key, seg, ratio, views, rr):
  return _np(_crossbert_masks(key, seg, ratio, views, rr))


def test_random_masking_rounding_tie_full_row():
  seq_len, ratio = 190, 0.15
  seg = np.ones((2, seq_len), np.int32)
  m = _masks(seg, ratio, 1)
  for b in range(2):
    vis, rec = _view_sets(m, seg, 0, b)
    assert len(rec) == round(ratio * seq_len) and len(vis) == seq_len - round(ratio * seq_len), (
        f"full row at L={seq_len}, r={ratio}: {len(vis)} valid visible / {len(rec)} reconstructed, expected "
        f"{seq_len - round(ratio * seq_len)} / {round(ratio * seq_len)}")


# ----------------------------------------------------------------------------- targets
# [CLS]/[SEP] out of the targets (masking.exclude_special) and BERT's replacements from the tokenizer.


def _packed_tokens(seg, seed=0):
  """Regular ids in real slots, [CLS] at each segment's start and [SEP] at its end, pads 0."""
  from crossbert_jax.data import tokenizer
  rng = np.random.default_rng(seed)
  tokens = np.where(seg > 0, rng.integers(NUM_SPECIAL, VOCAB, seg.shape), 0).astype(np.int32)
  for b in range(seg.shape[0]):
    for s in set(seg[b][seg[b] > 0].tolist()):
      where = np.flatnonzero(seg[b] == s)
      tokens[b, where[0]], tokens[b, where[-1]] = tokenizer.CLS_ID, tokenizer.SEP_ID
  return tokens


def test_specials_are_excluded_from_targets_by_default():
  from crossbert_jax.core import config as config_lib
  from crossbert_jax.training import objectives
  for objective in ("crossbert", "mlm"):
    assert config_lib.get_config(objective,
                                 "tiny").masking.exclude_special, f"{objective}: specials must be excluded by default"
  seg = _segments(ALL_ROWS)
  tokens = _packed_tokens(seg)
  ok = np.asarray(objectives.targetable(jnp.asarray(tokens), jnp.asarray(seg), True))
  assert ok.sum() < (seg > 0).sum() and not ok[tokens < NUM_SPECIAL].any(), "specials and pads must not be targetable"
  assert np.asarray(objectives.targetable(jnp.asarray(tokens), jnp.asarray(seg), False)).sum() == (seg > 0).sum()
  for ratio, views in ((0.5, 2), (0.75, 4), (0.5, 1)):
    plain = _masks(seg, ratio, views, seed=4)
    m = _np(
        jax.jit(masking.crossbert_masks, static_argnums=(2, 3, 4))(jax.random.key(4), jnp.asarray(seg), ratio, views,
                                                                   1.0, jnp.asarray(ok)))
    _check_shapes(m, seg, ratio, views)
    np.testing.assert_array_equal(m.vis_idx_KxBxT, plain.vis_idx_KxBxT, "excluding specials changed the visible sets")
    np.testing.assert_array_equal(m.vis_valid_KxBxT, plain.vis_valid_KxBxT)
    for b in range(seg.shape[0]):
      shown, predicted = collections.Counter(), collections.Counter()
      for k in range(views):
        vis, rec = _view_sets(m, seg, k, b)
        shown.update(vis)
        predicted.update(rec)
        _, rec_plain = _view_sets(plain, seg, k, b)
        assert rec == {p for p in rec_plain if ok[b, p]
                      }, f"K={views}, view {k}, row {b}: targets must be the hidden non-specials"
      real, targets = set(np.flatnonzero(seg[b] > 0).tolist()), set(np.flatnonzero(ok[b]).tolist())
      if views > 1:
        assert set(shown) == real and set(shown.values()) <= {
            1}, f"K={views}, row {b}: views must still partition the row"
        assert set(predicted) == targets and set(predicted.values()) <= {views - 1}, (
            f"K={views}, row {b}: every non-special token must be a target in K-1 views; {dict(predicted)}")
  for ratio in (0.15, 0.3):
    mm = _np(
        jax.jit(masking.mlm_masks, static_argnums=(2,))(jax.random.key(6), jnp.asarray(seg), ratio, jnp.asarray(ok)))
    for b in range(seg.shape[0]):
      sel = mm.mask_idx_BxM[b][mm.mask_valid_BxM[b]]
      assert len(sel) == round(ratio *
                               ok[b].sum()), f"BERT row {b}: {len(sel)} masked, expected round(r * n_targetable)"
      assert ok[b, sel].all(), f"BERT row {b}: masked a special or a pad: tokens {tokens[b, sel]}"


def test_bert_random_replacements_come_from_the_tokenizer(tmp_path):
  """With model.vocab_size above the tokenizer's, replacements still draw only pieces the tokenizer has."""
  from crossbert_jax.core import config as config_lib
  from crossbert_jax.data import corpus, tokenizer
  from crossbert_jax.training import objectives
  spm = tmp_path / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:2000], 512, spm)
  c = config_lib.get_config("mlm", "tiny")
  c.model.vocab_size, c.data.tokenizer = VOCAB, str(spm)
  n_pieces = objectives.replacement_vocab_size(c, tokenizer.Tokenizer.load(str(spm)).vocab_size)
  assert n_pieces == 512, f"replacements must end at the tokenizer's 512 pieces, not model.vocab_size={VOCAB}: {n_pieces}"
  seg = np.ones((64, L), np.int32)
  tokens = np.full((64, L), 7, np.int32)
  masks = _mlm_masks(jax.random.key(0), jnp.asarray(seg), 0.5)
  out = np.asarray(
      _corrupt(jax.random.key(1), jnp.asarray(tokens), masks, mask_prob=0.0, random_prob=1.0, mask_id=MASK_ID,
               first_regular_id=NUM_SPECIAL, vocab_size=n_pieces))
  replaced = out[out != tokens]
  assert len(replaced) > 500 and replaced.min() >= NUM_SPECIAL and replaced.max() < 512, (
      f"replacements {replaced.min()}..{replaced.max()} must be regular pieces in [{NUM_SPECIAL}, 512)")


def test_invariants_with_high_special_ids():
  """A ModernBERT-like layout (roles at 1000-1004, more specials at 0, 1, 500 and 1005-1010): no special
  is a target or a replacement, complementary views still partition the row."""
  from crossbert_jax.data.special_ids import SpecialIds
  from crossbert_jax.training import objectives
  specials = SpecialIds.of(1003, 1000, 1001, 1002, 1004, (0, 1, 500, *range(1005, 1011)))
  reserved = np.asarray(specials.reserved)
  seg = _segments(ALL_ROWS)
  rng = np.random.default_rng(3)
  tokens = np.where(seg > 0, rng.integers(2, 1000, seg.shape), specials.pad).astype(np.int32)
  for b in range(seg.shape[0]):
    for s in set(seg[b][seg[b] > 0].tolist()):
      where = np.flatnonzero(seg[b] == s)
      tokens[b, where[0]], tokens[b, where[-1]] = specials.cls, specials.sep
      if len(where) > 3:  # Specials spelled in the text ([MASK], <|endoftext|>, ...) land inside documents.
        tokens[b, where[1]] = rng.choice(reserved)
  ok = np.asarray(objectives.targetable(jnp.asarray(tokens), jnp.asarray(seg), True, specials))
  assert not ok[np.isin(tokens, reserved)].any(), "a special id is targetable"
  np.testing.assert_array_equal(ok, (seg > 0) & ~np.isin(tokens, reserved))
  for ratio, views in ((0.5, 2), (0.75, 4)):
    m = _np(
        jax.jit(masking.crossbert_masks, static_argnums=(2, 3, 4))(jax.random.key(5), jnp.asarray(seg), ratio, views,
                                                                   1.0, jnp.asarray(ok)))
    for b in range(seg.shape[0]):
      shown, predicted = collections.Counter(), collections.Counter()
      for k in range(views):
        vis, rec = _view_sets(m, seg, k, b)
        shown.update(vis)
        predicted.update(rec)
      assert set(shown) == set(np.flatnonzero(seg[b] > 0).tolist()) and set(shown.values()) <= {
          1}, (f"K={views}, row {b}: views must partition the row")
      assert set(predicted) == set(np.flatnonzero(ok[b]).tolist()) and set(predicted.values()) <= {
          views - 1}, (f"K={views}, row {b}: targets must be exactly the non-special tokens, each in K-1 views")
  table = specials.replacement_range(1011)
  assert isinstance(table, np.ndarray) and len(table) == 1011 - len(reserved)
  assert SpecialIds.of(1003, 1000, 1001, 1002, 1004, (0, 1)).replacement_range(1005) == (2, 1000)
  masks = _mlm_masks(jax.random.key(0), jnp.asarray(np.ones((64, L), np.int32)), 0.5)
  flat = np.full((64, L), 7, np.int32)
  out = np.asarray(
      jax.jit(masking.corrupt,
              static_argnames=("mask_prob", "random_prob", "mask_id", "first_regular_id",
                               "vocab_size"))(jax.random.key(1), jnp.asarray(flat), masks, mask_prob=0.0,
                                              random_prob=1.0, mask_id=specials.mask, first_regular_id=0, vocab_size=0,
                                              regular_ids_R=jnp.asarray(table)))
  replaced = out[out != flat]
  assert len(replaced) > 500 and not np.isin(replaced, reserved).any() and replaced.max() < 1011, (
      f"replacements must be regular ids below the tokenizer's 1011: {np.intersect1d(replaced, reserved)}")
  assert len(np.unique(replaced)) > 300, "replacements must spread over the regular ids"


@pytest.mark.parametrize("views,ratio", [(1, 0.5), (2, 0.5), (1, 0.75)])
def test_visible_slots_are_in_row_order_so_local_windows_skip_blocks(views, ratio):
  """Valid visible slots rise along the row (pad slots after them), so the gathered tokens' window keys
  (segment, position) rise and the GPU window kernel's binary search holds: its bounds then skip blocks."""
  from crossbert_jax.model import attention_window_gpu  # pylint: disable=g-import-not-at-top

  seq_len = 256
  seg = _segments([256, 200, 131, 0], seq_len)
  pos = np.zeros_like(seg)
  for b in range(seg.shape[0]):  # Positions restart at each document, as packing writes them.
    for s in np.unique(seg[b][seg[b] > 0]):
      where = np.flatnonzero(seg[b] == s)
      pos[b, where] = np.arange(len(where))
  m = masking.crossbert_masks(jax.random.key(3), jnp.asarray(seg), ratio, views)
  for k in range(views):
    idx, ok = np.asarray(m.vis_idx_KxBxT[k]), np.asarray(m.vis_valid_KxBxT[k])
    for b in range(seg.shape[0]):
      n = int(ok[b].sum())
      assert ok[b, :n].all() and not ok[b, n:].any(), "valid slots first"
      assert (np.diff(idx[b, :n]) > 0).all(), "valid slots in row order"
    g_seg, g_pos = np.take_along_axis(seg, idx, axis=1), np.take_along_axis(pos, idx, axis=1)
    q_key, kv_key = attention_window_gpu.window_keys(jnp.asarray(g_seg), jnp.asarray(np.where(g_seg > 0, g_seg, -1)),
                                                     jnp.asarray(g_pos), jnp.asarray(g_pos), 16)
    assert (np.diff(np.asarray(kv_key), axis=1) >= 0).all() and (np.diff(np.asarray(q_key), axis=1) >= 0).all()
    lo, hi = attention_window_gpu.window_bounds(q_key, kv_key, 16, 8, 8)
    assert float(jnp.mean((hi - lo)[:2])) < idx.shape[1] // 8 / 2, "the full rows' blocks are mostly skipped"

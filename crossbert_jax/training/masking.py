"""Masks drawn inside the jitted step: pure jax.numpy, static shapes, pads never predicted.

Every row's real tokens (segment id > 0) get a uniformly random rank 0..n_real-1; pads are
ranked after them. A view shows the ranks in [lo, hi) to the encoder and reconstructs the other
real ranks. With K complementary views, view k shows ranks [k*n/K, (k+1)*n/K): the views
partition each row's real tokens, and at K = 2 every real token is reconstructed exactly once.
With K = 1 (random masking at ratio r) the row shows n - round(r*n) ranks.

Slots are static: T = L/K (K > 1) or L - round(r*L) (K = 1) visible slots, Q = L - T
reconstruction slots (times `reconstruct_ratio`, CrossMAE partial reconstruction). A row with
pads fills spare visible slots with pad positions (segment 0, so attention ignores them) and
marks spare reconstruction slots invalid (weight 0 in the loss). The visible slots are in row
order (valid ones first, by position index; the pad ones after): the encoder and the
reconstructor are indifferent to their order (positions travel with the tokens), and a local
layer's window kernel then finds each block's neighbours by binary search and skips the rest
(`model/attention_window_gpu.py`); reconstruction slots stay in rank order.

`targetable_BxL` (optional) marks the real tokens that may be predicted ([CLS]/[SEP] are not,
by default). CrossBERT ranks and shows every real token as above, so the views still partition
the row and the slot counts stay static; a hidden non-targetable token just gets an invalid
reconstruction slot (each targetable token is still hidden with probability r). BERT masks
round(r * n_targetable) targetable tokens and leaves the others in its input, as the Hugging Face
collator does.
Shape letters: K views, B batch, L length, T visible slots, Q reconstruction slots, M masked slots.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class ViewMasks(NamedTuple):
  """Index arrays for K views; idx entries are positions into the length axis."""
  vis_idx_KxBxT: Array
  vis_valid_KxBxT: Array
  rec_idx_KxBxQ: Array
  rec_valid_KxBxQ: Array


class MlmMasks(NamedTuple):
  mask_idx_BxM: Array
  mask_valid_BxM: Array


def slot_counts(seq_len: int, ratio: float, views: int, reconstruct_ratio: float = 1.0) -> tuple[int, int]:
  """(visible slots T, reconstruction slots Q) per view for a sequence length."""
  n_vis = seq_len // views if views > 1 else seq_len - round(ratio * seq_len)
  n_rec = seq_len - n_vis
  if reconstruct_ratio < 1.0:
    n_rec = max(1, round(reconstruct_ratio * n_rec))
  return n_vis, n_rec


def _rounded_counts(ratio: float, n_B: Array, seq_len: int) -> Array:
  """round(ratio * n) per row with Python's rounding, as the static slot counts use."""
  table = jnp.asarray([round(ratio * n) for n in range(seq_len + 1)], jnp.int32)
  return table[n_B]


def random_ranks(key: Array, segment_ids_BxL: Array) -> tuple[Array, Array]:
  """(perm_BxL, n_real_B): perm[b, r] is the position holding rank r; real tokens rank first."""
  noise_BxL = jax.random.uniform(key, segment_ids_BxL.shape)
  noise_BxL = jnp.where(segment_ids_BxL > 0, noise_BxL, 2.0 + noise_BxL)
  perm_BxL = jnp.argsort(noise_BxL, axis=-1).astype(jnp.int32)
  n_real_B = jnp.sum(segment_ids_BxL > 0, axis=-1, dtype=jnp.int32)
  return perm_BxL, n_real_B


def _view(perm_BxL: Array, n_real_B: Array, lo_B: Array, hi_B: Array, n_vis: int, n_rec: int):
  """Visible ranks [lo, hi) padded with pad ranks; reconstruct the other real ranks in rank order."""
  seq_len = perm_BxL.shape[-1]
  c_Bx1 = (hi_B - lo_B)[:, None]
  lo_Bx1, n_Bx1 = lo_B[:, None], n_real_B[:, None]
  j_T = jnp.arange(n_vis, dtype=jnp.int32)[None, :]
  vis_valid_BxT = j_T < c_Bx1
  # Spare visible slots take pad ranks n, n+1, ...: there are always enough (see module doc).
  vis_rank_BxT = jnp.where(vis_valid_BxT, lo_Bx1 + j_T, n_Bx1 + j_T - c_Bx1)
  j_Q = jnp.arange(n_rec, dtype=jnp.int32)[None, :]
  rec_rank_BxQ = jnp.where(j_Q < lo_Bx1, j_Q, j_Q + c_Bx1)
  rec_valid_BxQ = rec_rank_BxQ < n_Bx1
  take = lambda r: jnp.take_along_axis(perm_BxL, jnp.clip(r, 0, seq_len - 1), axis=-1)
  vis_idx_BxT, vis_valid_BxT = _in_row_order(take(vis_rank_BxT), vis_valid_BxT, seq_len)
  return vis_idx_BxT, vis_valid_BxT, take(rec_rank_BxQ), rec_valid_BxQ


def _in_row_order(idx_BxT: Array, valid_BxT: Array, seq_len: int) -> tuple[Array, Array]:
  """The slots sorted by position index, valid ones first (pad slots keep theirs after them)."""
  order_BxT = jnp.argsort(jnp.where(valid_BxT, idx_BxT, seq_len + idx_BxT), axis=-1)
  return jnp.take_along_axis(idx_BxT, order_BxT, axis=-1), jnp.take_along_axis(valid_BxT, order_BxT, axis=-1)


def crossbert_masks(key: Array, segment_ids_BxL: Array, ratio: float, views: int, reconstruct_ratio: float = 1.0,
                    targetable_BxL: Array | None = None) -> ViewMasks:
  """Random (K = 1) or complementary (K > 1) masks for every row; see the module doc."""
  seq_len = segment_ids_BxL.shape[-1]
  n_vis, n_rec = slot_counts(seq_len, ratio, views, reconstruct_ratio)
  perm_BxL, n_real_B = random_ranks(key, segment_ids_BxL)
  if views == 1:
    bounds = [(jnp.zeros_like(n_real_B), n_real_B - _rounded_counts(ratio, n_real_B, seq_len))]
  else:
    bounds = [((k * n_real_B) // views, ((k + 1) * n_real_B) // views) for k in range(views)]
  per_view = [_view(perm_BxL, n_real_B, lo, hi, n_vis, n_rec) for lo, hi in bounds]
  masks = ViewMasks(*(jnp.stack(parts) for parts in zip(*per_view)))
  if targetable_BxL is None:
    return masks
  ok_KxBxQ = jnp.stack([jnp.take_along_axis(targetable_BxL, idx_BxQ, axis=-1) for idx_BxQ in masks.rec_idx_KxBxQ])
  return masks._replace(rec_valid_KxBxQ=masks.rec_valid_KxBxQ & ok_KxBxQ)


def mlm_masks(key: Array, segment_ids_BxL: Array, ratio: float, targetable_BxL: Array | None = None) -> MlmMasks:
  """round(ratio * n) random targetable positions per row (n of them), in M = round(ratio * L) static slots."""
  seq_len = segment_ids_BxL.shape[-1]
  n_slots = round(ratio * seq_len)
  # Only the ranks below n are masked: ranking the targetable tokens first keeps the rest unmasked.
  perm_BxL, n_real_B = random_ranks(key, segment_ids_BxL if targetable_BxL is None else targetable_BxL)
  n_mask_Bx1 = _rounded_counts(ratio, n_real_B, seq_len)[:, None]
  j_M = jnp.arange(n_slots, dtype=jnp.int32)[None, :]
  return MlmMasks(perm_BxL[:, :n_slots], j_M < n_mask_Bx1)


def corrupt(key: Array, tokens_BxL: Array, masks: MlmMasks, *, mask_prob: float, random_prob: float, mask_id: int,
            first_regular_id: int, vocab_size: int, regular_ids_R: Array | None = None) -> Array:
  """BERT's 80/10/10: masked slots become [MASK], a random regular token, or stay unchanged.

  Random tokens are drawn from [first_regular_id, vocab_size), or, given `regular_ids_R` (the
  regular ids when the special ones sit among them), from that table (the other two are ignored).
  """
  k_choice, k_random = jax.random.split(key)
  idx_BxM = masks.mask_idx_BxM
  orig_BxM = jnp.take_along_axis(tokens_BxL, idx_BxM, axis=-1)
  u_BxM = jax.random.uniform(k_choice, idx_BxM.shape)
  if regular_ids_R is None:
    random_BxM = jax.random.randint(k_random, idx_BxM.shape, first_regular_id, vocab_size, dtype=tokens_BxL.dtype)
  else:
    pick_BxM = jax.random.randint(k_random, idx_BxM.shape, 0, regular_ids_R.shape[0])
    random_BxM = jnp.asarray(regular_ids_R, tokens_BxL.dtype)[pick_BxM]
  new_BxM = jnp.where(u_BxM < mask_prob, mask_id, jnp.where(u_BxM < mask_prob + random_prob, random_BxM, orig_BxM))
  new_BxM = jnp.where(masks.mask_valid_BxM, new_BxM, orig_BxM).astype(tokens_BxL.dtype)
  rows_Bx1 = jnp.arange(tokens_BxL.shape[0])[:, None]
  # Indices within a row are distinct (a permutation), so the scatter has no collisions.
  return tokens_BxL.at[rows_Bx1, idx_BxM].set(new_BxM, unique_indices=True)

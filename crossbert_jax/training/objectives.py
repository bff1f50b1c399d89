"""The two pretraining objectives behind one seam: `loss_fn(params, batch, key) -> (sum, stats)`.

Both return the summed token cross-entropy and the counts needed to normalise it, so gradient
accumulation over micro-batches is exact: grads of the summed loss / total target count.
Shape letters: K views, B batch, L length, T visible slots, Q reconstruction slots, M masked slots.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds
from crossbert_jax.model import layers
from crossbert_jax.model.models import build_model
from crossbert_jax.training import masking

Array = jax.Array
Batch = dict[str, Array]


class LossStats(NamedTuple):
  """Summed statistics over the predicted tokens of a (micro-)batch."""
  num_targets: Array
  num_correct: Array


def _token_losses(logits_BxQxV: Array, targets_BxQ: Array, weights_BxQ: Array) -> tuple[Array, LossStats]:
  # One max and one logsumexp over the vocabulary serve both the loss and the accuracy (a
  # separate argmax would be another pass over the largest tensor of the step).
  max_BxQ = jax.lax.stop_gradient(jnp.max(logits_BxQxV, axis=-1))
  shifted_BxQxV = logits_BxQxV - max_BxQ[..., None]
  lse_BxQ = jnp.log(jnp.sum(jnp.exp(shifted_BxQxV), axis=-1))
  target_BxQ = jnp.take_along_axis(shifted_BxQxV, targets_BxQ[..., None], axis=-1)[..., 0]
  ce_BxQ = lse_BxQ - target_BxQ
  w_BxQ = weights_BxQ.astype(jnp.float32)
  # Counts ties as correct (argmax would pick one); with float32 logits ties are negligible.
  correct_BxQ = (target_BxQ >= 0.0).astype(jnp.float32)
  return jnp.sum(ce_BxQ * w_BxQ), LossStats(jnp.sum(w_BxQ), jnp.sum(correct_BxQ * w_BxQ))


def targetable(tokens_BxL: Array, segment_ids_BxL: Array, exclude_special: bool,
               specials: SpecialIds = SENTENCEPIECE) -> Array:
  """Real tokens that may be prediction targets: all, or all but the special ones (masking.exclude_special)."""
  real_BxL = segment_ids_BxL > 0
  if not exclude_special:
    return real_BxL
  # [CLS] opens and [SEP] closes every packed document: trivially predictable, so never targets.
  excluded = specials.target_exclusions()
  if len(excluded) > 2:
    return real_BxL & ~jnp.isin(tokens_BxL, jnp.asarray(excluded, tokens_BxL.dtype))
  for i in excluded:
    real_BxL = real_BxL & (tokens_BxL != i)
  return real_BxL


def replacement_vocab_size(c: ml_collections.ConfigDict, tokenizer_vocab_size: int) -> int:
  """End (exclusive) of the ids BERT's random replacements draw from: the tokenizer's vocabulary.

  model.vocab_size may be larger (padded for the MXU); ids past the tokenizer's never occur in
  the data, so drawing them would teach nothing.
  """
  return min(c.model.vocab_size, tokenizer_vocab_size)


def chunked_cross_entropy(x_BxQxD: Array, head: tuple[Array, Array | None], targets_BxQ: Array,
                          weights_BxQ: Array, chunk: int) -> tuple[Array, LossStats]:
  """Summed cross-entropy and stats of logits x @ W + b, `chunk` query slots at a time.

  Each chunk's logits (float32 accumulation) exist only inside a rematerialised scan step, so
  neither the forward nor the backward holds B x Q x V; Q <= chunk is one plain pass.
  """
  w_DxV, b_V = head
  one_chunk = lambda x, t, w: _token_losses(layers.vocab_logits(x, w_DxV, b_V), t, w)
  b, q = targets_BxQ.shape
  if q <= chunk:
    return one_chunk(x_BxQxD, targets_BxQ, weights_BxQ)
  n = -(-q // chunk)
  pad = lambda a: jnp.pad(a, [(0, 0), (0, n * chunk - q)] + [(0, 0)] * (a.ndim - 2))
  # NxBxC...: chunks along the slots, so every chunk keeps the batch axis (and its sharding).
  split = lambda a: jnp.moveaxis(pad(a).reshape((b, n, chunk) + a.shape[2:]), 1, 0)
  xs = (split(x_BxQxD), split(targets_BxQ), split(weights_BxQ))  # Padded slots weigh 0.

  @jax.checkpoint
  def body(carry, xs_chunk):
    loss, stats = one_chunk(*xs_chunk)
    return jax.tree.map(jnp.add, carry, (loss, stats)), None

  zero = jnp.zeros((), jnp.float32)
  (loss, stats), _ = jax.lax.scan(body, (zero, LossStats(zero, zero)), xs)
  return loss, stats


def make_loss_fn(c: ml_collections.ConfigDict, replacement_vocab: int | None = None,
                 specials: SpecialIds = SENTENCEPIECE) -> Callable[[dict, Batch, Array], tuple[Array, LossStats]]:
  """The loss function for `c.objective` (params, batch, key) -> (summed loss, stats).

  `replacement_vocab`: where BERT's random replacement ids end (`replacement_vocab_size`, from
  the run's tokenizer); shape-only callers leave it None and get model.vocab_size. `specials`:
  the tokenizer's special ids (never targets, never random replacements, [MASK]).
  """
  model = build_model(c)
  mk = c.masking
  random_end = (c.model.vocab_size if replacement_vocab is None else replacement_vocab) if c.objective == "mlm" else 0
  if random_end:
    regular = specials.replacement_range(random_end)
    first_regular, regular_end, regular_ids_R = (*regular, None) if isinstance(regular, tuple) else (0, 0, regular)

  def crossbert_loss(params, batch: Batch, key: Array):
    tokens_BxL, seg_BxL, pos_BxL = batch["tokens"], batch["segment_ids"], batch["positions"]
    masks = masking.crossbert_masks(key, seg_BxL, mk.ratio, mk.views, mk.reconstruct_ratio,
                                    targetable(tokens_BxL, seg_BxL, mk.exclude_special, specials))
    k = mk.views
    # The K views run as one batch of K*B rows (view-major), sharing one encoder call.
    tile = lambda a: jnp.concatenate([a] * k, axis=0) if k > 1 else a
    flat = lambda a: a.reshape((-1,) + a.shape[2:])
    tokens_KBxL = tile(tokens_BxL)
    rec_idx_KBxQ, rec_valid_KBxQ = flat(masks.rec_idx_KxBxQ), flat(masks.rec_valid_KxBxQ)
    hidden_KBxQxD, head = model.apply({"params": params}, tokens_KBxL, tile(pos_BxL), tile(seg_BxL),
                                      flat(masks.vis_idx_KxBxT), rec_idx_KBxQ, rec_valid_KBxQ,
                                      return_hidden=True)
    targets_KBxQ = jnp.take_along_axis(tokens_KBxL, rec_idx_KBxQ, axis=1)
    return chunked_cross_entropy(hidden_KBxQxD, head, targets_KBxQ, rec_valid_KBxQ, c.model.loss_chunk)

  def mlm_loss(params, batch: Batch, key: Array):
    tokens_BxL, seg_BxL, pos_BxL = batch["tokens"], batch["segment_ids"], batch["positions"]
    k_mask, k_corrupt = jax.random.split(key)
    masks = masking.mlm_masks(k_mask, seg_BxL, mk.ratio, targetable(tokens_BxL, seg_BxL, mk.exclude_special, specials))
    corrupted_BxL = masking.corrupt(
        k_corrupt, tokens_BxL, masks, mask_prob=c.mlm.mask_prob, random_prob=c.mlm.random_prob,
        mask_id=specials.mask, first_regular_id=first_regular, vocab_size=regular_end, regular_ids_R=regular_ids_R)
    hidden_BxMxD, head = model.apply({"params": params}, corrupted_BxL, pos_BxL, seg_BxL,
                                     masks.mask_idx_BxM, return_hidden=True)
    targets_BxM = jnp.take_along_axis(tokens_BxL, masks.mask_idx_BxM, axis=1)
    return chunked_cross_entropy(hidden_BxMxD, head, targets_BxM, masks.mask_valid_BxM, c.model.loss_chunk)

  return {"crossbert": crossbert_loss, "mlm": mlm_loss}[c.objective]


def dummy_batch(batch_size: int, seq_len: int) -> Batch:
  """A shape-only batch (one full segment per row) for init and eval_shape."""
  ones = jnp.ones((batch_size, seq_len), jnp.int32)
  return {"tokens": ones, "segment_ids": ones, "positions": jnp.broadcast_to(jnp.arange(seq_len), ones.shape)}


def init_params(c: ml_collections.ConfigDict, key: Array, batch_size: int = 1):
  """Initialises the (boxed, logically partitioned) params of `c.objective`'s model."""
  model = build_model(c)
  batch = dummy_batch(batch_size, c.data.seq_len)
  if c.objective == "crossbert":
    masks = masking.crossbert_masks(jax.random.key(0), batch["segment_ids"], c.masking.ratio,
                                    c.masking.views, c.masking.reconstruct_ratio)
    args = (masks.vis_idx_KxBxT[0], masks.rec_idx_KxBxQ[0], masks.rec_valid_KxBxQ[0])
  else:
    args = (masking.mlm_masks(jax.random.key(0), batch["segment_ids"], c.masking.ratio).mask_idx_BxM,)
  return model.init(key, batch["tokens"], batch["positions"], batch["segment_ids"], *args)["params"]

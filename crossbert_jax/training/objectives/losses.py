"""What every objective's loss shares: the summed token cross-entropy and its counts, targets, batches.

A loss returns the summed token cross-entropy and the counts needed to normalise it, so gradient
accumulation over micro-batches is exact: grads of the summed loss / total target count.
Shape letters: B batch, L length, Q predicted slots, D width, V vocab.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds
from crossbert_jax.model import layers

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


def replacement_vocab_size(c: plan_lib.Settings, tokenizer_vocab_size: int) -> int:
  """End (exclusive) of the ids BERT's random replacements draw from: the tokenizer's vocabulary.

  model.vocab_size may be larger (padded for the MXU); ids past the tokenizer's never occur in
  the data, so drawing them would teach nothing.
  """
  return min(c.model.vocab_size, tokenizer_vocab_size)


def chunked_cross_entropy(x_BxQxD: Array, head: tuple[Array, Array | None], targets_BxQ: Array, weights_BxQ: Array,
                          chunk: int, head_dtype: str = "float32") -> tuple[Array, LossStats]:
  """Summed cross-entropy and stats of logits x @ W + b, `chunk` query slots at a time.

  Each chunk's logits (float32 accumulation) exist only inside a rematerialised scan step, so
  neither the forward nor the backward holds B x Q x V; Q <= chunk is one plain pass.
  `head_dtype="bfloat16"` (model.head_dtype): every head GEMM in bf16, the gradient computed in
  the forward pass (`bf16_head.py`).
  """
  if head_dtype == "bfloat16":
    from crossbert_jax.training.objectives import bf16_head  # pylint: disable=g-import-not-at-top (it imports this)
    return bf16_head.cross_entropy(x_BxQxD, head, targets_BxQ, weights_BxQ, chunk, jnp.bfloat16)
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


def dummy_batch(batch_size: int, seq_len: int) -> Batch:
  """A shape-only batch (one full segment per row) for init and eval_shape."""
  ones = jnp.ones((batch_size, seq_len), jnp.int32)
  return {"tokens": ones, "segment_ids": ones, "positions": jnp.broadcast_to(jnp.arange(seq_len), ones.shape)}

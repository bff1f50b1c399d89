"""InfoNCE over in-batch (and hard) negatives: the contrastive stage's loss on pooled embeddings.

Each anchor is scored against every positive of the batch (its own is the target, the others are
its negatives) and, when given, every hard negative of the batch. Embeddings are L2-normalised here,
in float32, so the logits are cosines / temperature in float32 whatever the encoder's dtype.

The batch is the GLOBAL batch: under jit with rows sharded over ("data", "fsdp") the candidates are
constrained to the logical axes (None, None), i.e. gathered to every device, and the logits to
("batch", None), so each device scores its anchors against all candidates (training/sharding.py maps
the logical names to the mesh). The loss equals the one-device loss (tests/unit/test_contrastive.py).

Duplicates: with per-text ids (e.g. a hash of the positive's token ids), a candidate whose id equals
an anchor's own positive's id but sits at another index is masked out rather than counted as a
negative (a finite -1e9 logit rather than -inf: no inf arithmetic, e.g. -inf * 0 = NaN, can reach a sum or a metric).
Shape letters: B batch, N hard negatives per anchor, C candidates (B + B*N), D width.
"""

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.core.objectives import check_temperature  # noqa: F401 - re-exported (config validation's check).

Array = jax.Array
# The logit of a masked candidate: exp(MASKED - max) is exactly 0 in float32 for any |cosine / t| < 1e8.
MASKED = -1e9
_EPS = 1e-12  # Below this norm an embedding counts as zero (its normalised form is 0, not NaN).


class ContrastiveMetrics(NamedTuple):
  """Means over the batch's anchors (float32 scalars)."""
  accuracy: Array  # The anchor's own positive is the top-scored candidate.
  positive_cosine: Array  # cos(anchor, own positive).
  negative_cosine: Array  # cos(anchor, candidate) over the unmasked negatives.


def init_log_temperature(temperature: float) -> Array:
  """The learnable parameter for an initial `temperature`: log(t), so exp(param) stays > 0 under any update."""
  return jnp.log(jnp.asarray(check_temperature(temperature), jnp.float32))


def temperature_of(log_temperature: Array, min_temperature: float = 1e-3) -> Array:
  """exp(log_temperature), floored at `min_temperature` so the logits' scale stays bounded (CLIP's clamp)."""
  return jnp.maximum(jnp.exp(log_temperature.astype(jnp.float32)), min_temperature)


def normalize(x_BxD: Array) -> Array:
  """Rows scaled to unit L2 norm in float32 (an all-zero row stays zero)."""
  x = x_BxD.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), _EPS))


def _gathered(x_CxD: Array) -> Array:
  """The candidates on every device: the all-gather that makes the negatives the global batch's."""
  return nn.with_logical_constraint(x_CxD, (None, None))


def _rows(logits_BxC: Array) -> Array:
  return nn.with_logical_constraint(logits_BxC, ("batch", None))


def _cosines(rows_BxD: Array, cands_CxD: Array) -> Array:
  """BxC cosines of unit rows, at full float32 precision (TPUs' default f32 matmul is bf16 passes: at
  temperature 0.02 its ~4e-3 error in a cosine would be 0.2 in a logit)."""
  return _rows(jnp.einsum("bd,cd->bc", rows_BxD, _gathered(cands_CxD), precision=jax.lax.Precision.HIGHEST))


def _duplicate_mask(positive_ids_B: Array, negative_ids_BN: Array | None, num_candidates: int) -> Array:
  """BxC True where a candidate shares the id of anchor b's own positive but is not that positive (index b)."""
  b = positive_ids_B.shape[0]
  same_BxB = positive_ids_B[:, None] == positive_ids_B[None, :]
  masked_BxB = same_BxB & ~jnp.eye(b, dtype=bool)
  if num_candidates == b:
    return masked_BxB
  if negative_ids_BN is None:  # Hard negatives without ids are never masked.
    return jnp.concatenate([masked_BxB, jnp.zeros((b, num_candidates - b), bool)], axis=1)
  same_BxBN = positive_ids_B[:, None] == negative_ids_BN.astype(positive_ids_B.dtype)[None, :]
  return jnp.concatenate([masked_BxB, same_BxBN], axis=1)


def _cross_entropy(logits_BxC: Array, masked_BxC: Array | None) -> tuple[Array, Array]:
  """(per-row CE against target b, per-row top-1 correctness) of float32 logits, masked ones set to MASKED."""
  if masked_BxC is not None:
    logits_BxC = jnp.where(masked_BxC, MASKED, logits_BxC)
  logits_BxC = _rows(logits_BxC)
  target_B = jnp.diagonal(logits_BxC[:, :logits_BxC.shape[0]])
  lse_B = jax.nn.logsumexp(logits_BxC, axis=-1)
  # Ties count as correct, as in losses._token_losses: with float32 cosines they are negligible.
  correct_B = (target_B >= jnp.max(logits_BxC, axis=-1)).astype(jnp.float32)
  return lse_B - target_B, correct_B


def info_nce(anchors_BxD: Array, positives_BxD: Array, negatives: Array | None = None, *,
             temperature: float | Array = 0.05, symmetric: bool = False, positive_ids_B: Array | None = None,
             negative_ids: Array | None = None) -> tuple[Array, ContrastiveMetrics]:
  """Mean InfoNCE loss of anchors against the batch's positives (+ hard negatives), and its metrics.

  negatives: hard negatives, BxD (one per anchor) or BxNxD, all of them candidates for every anchor.
  temperature: > 0; a float (fixed) or a traced scalar (learnable: `temperature_of(log_t)`).
  symmetric: also positives -> anchors (each positive against all anchors), the two losses averaged.
  positive_ids_B / negative_ids (B or BxN): ids of the texts; a candidate with the id of an anchor's own
  positive, at another index, is masked (duplicates are not negatives). Without ids nothing is masked.
  Returns float32 (loss, ContrastiveMetrics) whatever the inputs' dtype.
  """
  if not isinstance(temperature, jax.Array):  # A traced (learnable) one is kept > 0 by temperature_of.
    check_temperature(temperature)
  scale = 1.0 / jnp.asarray(temperature, jnp.float32)
  a_BxD, p_BxD = normalize(anchors_BxD), normalize(positives_BxD)
  b = a_BxD.shape[0]
  cands_CxD = p_BxD
  if negatives is not None:
    n_BNxD = normalize(negatives.reshape(-1, negatives.shape[-1]))
    cands_CxD = jnp.concatenate([p_BxD, n_BNxD], axis=0)
  cos_BxC = _cosines(a_BxD, cands_CxD)

  masked_BxC = None
  if positive_ids_B is not None:
    neg_ids = None if negative_ids is None or negatives is None else negative_ids.reshape(-1)
    masked_BxC = _duplicate_mask(positive_ids_B, neg_ids, cands_CxD.shape[0])

  ce_B, correct_B = _cross_entropy(cos_BxC * scale, masked_BxC)
  loss = jnp.mean(ce_B)
  if symmetric:  # positives -> anchors: the same BxB block transposed (no hard negatives on this side).
    back_B, _ = _cross_entropy(_cosines(p_BxD, a_BxD) * scale, None if masked_BxC is None else masked_BxC[:, :b])
    loss = 0.5 * (loss + jnp.mean(back_B))
  return loss, _metrics(cos_BxC, correct_B, masked_BxC)


def _metrics(cos_BxC: Array, correct_B: Array, masked_BxC: Array | None) -> ContrastiveMetrics:
  b, c = cos_BxC.shape
  negative_BxC = jnp.arange(c)[None, :] != jnp.arange(b)[:, None]
  if masked_BxC is not None:
    negative_BxC &= ~masked_BxC
  neg_w = negative_BxC.astype(jnp.float32)
  negative_cosine = jnp.sum(cos_BxC * neg_w) / jnp.maximum(jnp.sum(neg_w), 1.0)
  positive_cosine = jnp.mean(jnp.diagonal(cos_BxC[:, :b]))
  return ContrastiveMetrics(jnp.mean(correct_B), positive_cosine, negative_cosine)

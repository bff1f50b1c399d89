"""CrossBERT: the encoder sees only the visible tokens of a view; a reconstructor predicts the rest.

With K complementary views (masking.views) each sequence runs as K views whose visible tokens
partition it; K = 1 is random masking at masking.ratio. The params are {"encoder", "reconstructor"};
the export keeps the encoder (ModernBertModel) and discards the reconstructor.
Shape letters: K views, B batch, L length, T visible slots, Q reconstruction slots, D width.
"""

import jax
import jax.numpy as jnp

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives as specs
from crossbert_jax.data.special_ids import SpecialIds
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.model.models import CrossBert
from crossbert_jax.model.reconstructor import ReconstructorSpec
from crossbert_jax.training import flops, masking, objectives
from crossbert_jax.training.objectives import losses


def crossbert_shapes(c: plan_lib.Settings) -> tuple[int, int, int]:
  """(views K, visible tokens per view, reconstructed slots R' per view)."""
  k, r, seq_len = c.masking.views, c.masking.ratio, c.data.seq_len
  if k > 1:
    # Complementary views: each sees L/K tokens and reconstructs the other L - L/K.
    visible = seq_len // k
    slots = seq_len - visible
  else:
    # Python's round, as config.validate and the masking use.
    slots = round(r * seq_len)
    visible = seq_len - slots
  if c.masking.reconstruct_ratio < 1.0:
    slots = max(1, round(c.masking.reconstruct_ratio * slots))
  return k, visible, slots


def _reconstructor_forward_flops(c: plan_lib.Settings, visible: int, slots: int) -> float:
  """Forward matmul FLOPs of the reconstructor blocks for one view of one sequence (flops.py's rules)."""
  rc, d, n = c.reconstructor, c.model.embed_dim, c.model.num_layers
  dr, ir, q, m = rc.embed_dim, rc.mlp_dim, slots, visible
  block = (
      2 * q * dr * dr  # Query projection dr -> dr.
      + 2 * m * d * 2 * dr  # Key and value projections d -> dr on the encoder memory.
      + 4 * q * m * dr  # Cross-attention scores and weighted sum.
      + 2 * q * dr * dr  # Output projection dr -> dr.
      + 2 * q * (dr * 2 * ir + ir * dr)  # GeGLU MLP dr -> 2Ir, Ir -> dr.
  )
  if rc.self_attention:
    block += 2 * q * 3 * dr * dr + 4 * q * q * dr + 2 * q * dr * dr
  if rc.feature_mixing:
    # Weighted sum of the N+1 encoder layer outputs (embedding output + each layer) per block.
    block += 2 * (n + 1) * m * d
  return float(rc.num_layers * block)


class CrossBertObjective:
  """The CrossBERT objective's training half (`objectives.Objective`)."""

  spec = specs.CROSSBERT

  def build_model(self, c: plan_lib.Settings) -> CrossBert:
    return CrossBert(EncoderSpec.from_config(c.model), ReconstructorSpec.from_config(c))

  def init_inputs(self, c: plan_lib.Settings, batch: losses.Batch) -> tuple:
    masks = masking.crossbert_masks(jax.random.key(0), batch["segment_ids"], c.masking.ratio, c.masking.views,
                                    c.masking.reconstruct_ratio)
    return masks.vis_idx_KxBxT[0], masks.rec_idx_KxBxQ[0], masks.rec_valid_KxBxQ[0]

  def make_loss_fn(self, c: plan_lib.Settings, model: CrossBert, replacement_vocab: int | None,
                   specials: SpecialIds) -> objectives.LossFn:
    del replacement_vocab  # Nothing is replaced: hidden tokens are left out of the encoder's input.
    mk = c.masking

    def crossbert_loss(params, batch: losses.Batch, key: jax.Array):
      tokens_BxL, seg_BxL, pos_BxL = batch["tokens"], batch["segment_ids"], batch["positions"]
      masks = masking.crossbert_masks(key, seg_BxL, mk.ratio, mk.views, mk.reconstruct_ratio,
                                      losses.targetable(tokens_BxL, seg_BxL, mk.exclude_special, specials))
      k = mk.views
      # The K views run as one batch of K*B rows (view-major), sharing one encoder call.
      tile = lambda a: jnp.concatenate([a] * k, axis=0) if k > 1 else a
      flat = lambda a: a.reshape((-1,) + a.shape[2:])
      tokens_KBxL = tile(tokens_BxL)
      rec_idx_KBxQ, rec_valid_KBxQ = flat(masks.rec_idx_KxBxQ), flat(masks.rec_valid_KxBxQ)
      hidden_KBxQxD, head = model.apply({"params": params}, tokens_KBxL, tile(pos_BxL), tile(seg_BxL),
                                        flat(masks.vis_idx_KxBxT), rec_idx_KBxQ, rec_valid_KBxQ, return_hidden=True)
      targets_KBxQ = jnp.take_along_axis(tokens_KBxL, rec_idx_KBxQ, axis=1)
      return losses.chunked_cross_entropy(hidden_KBxQxD, head, targets_KBxQ, rec_valid_KBxQ, c.model.loss_chunk,
                                          c.model.head_dtype)

    return crossbert_loss

  def encoder_shape(self, c: plan_lib.Settings) -> tuple[int, int, int]:
    return crossbert_shapes(c)

  def forward_flops(self, c: plan_lib.Settings) -> dict[str, float]:
    k, visible, slots = crossbert_shapes(c)
    # Every view is a full encoder + reconstructor pass; the head decodes dr -> V on R' slots.
    return {
        "encoder": k * flops.encoder_forward_flops(c.model, visible),
        "reconstructor": k * _reconstructor_forward_flops(c, visible, slots),
        "head": float(k * 2 * slots * c.reconstructor.embed_dim * c.model.vocab_size),}


objectives.register(CrossBertObjective())

"""Flat BERT (the baseline): every (corrupted) token through the encoder, an MLM head on the masked ones.

The selected positions are corrupted as BERT does (mlm.mask_prob -> [MASK], mlm.random_prob -> a
random regular id, the rest unchanged). The params are {"encoder", "head"}; the export keeps both
(ModernBertForMaskedLM).
Shape letters: B batch, L length, M masked slots, D width.
"""

import jax
import jax.numpy as jnp

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives as specs
from crossbert_jax.data.special_ids import SpecialIds
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.model.models import FlatBert
from crossbert_jax.training import flops, masking, objectives
from crossbert_jax.training.objectives import losses


class MlmObjective:
  """The flat BERT objective's training half (`objectives.Objective`)."""

  spec = specs.MLM

  def build_model(self, c: plan_lib.Settings) -> FlatBert:
    return FlatBert(EncoderSpec.from_config(c.model))

  def init_inputs(self, c: plan_lib.Settings, batch: losses.Batch) -> tuple:
    return (masking.mlm_masks(jax.random.key(0), batch["segment_ids"], c.masking.ratio).mask_idx_BxM,)

  def make_loss_fn(self, c: plan_lib.Settings, model: FlatBert, replacement_vocab: int | None,
                   specials: SpecialIds) -> objectives.LossFn:
    mk = c.masking
    random_end = c.model.vocab_size if replacement_vocab is None else replacement_vocab
    regular = specials.replacement_range(random_end)
    first_regular, regular_end, regular_ids_R = (*regular, None) if isinstance(regular, tuple) else (0, 0, regular)

    def mlm_loss(params, batch: losses.Batch, key: jax.Array):
      tokens_BxL, seg_BxL, pos_BxL = batch["tokens"], batch["segment_ids"], batch["positions"]
      k_mask, k_corrupt = jax.random.split(key)
      masks = masking.mlm_masks(k_mask, seg_BxL, mk.ratio,
                                losses.targetable(tokens_BxL, seg_BxL, mk.exclude_special, specials))
      corrupted_BxL = masking.corrupt(k_corrupt, tokens_BxL, masks, mask_prob=c.mlm.mask_prob,
                                      random_prob=c.mlm.random_prob, mask_id=specials.mask,
                                      first_regular_id=first_regular, vocab_size=regular_end,
                                      regular_ids_R=regular_ids_R)
      hidden_BxMxD, head = model.apply({"params": params}, corrupted_BxL, pos_BxL, seg_BxL, masks.mask_idx_BxM,
                                       return_hidden=True)
      targets_BxM = jnp.take_along_axis(tokens_BxL, masks.mask_idx_BxM, axis=1)
      return losses.chunked_cross_entropy(hidden_BxMxD, head, targets_BxM, masks.mask_valid_BxM, c.model.loss_chunk,
                                          c.model.head_dtype)

    return mlm_loss

  def encoder_shape(self, c: plan_lib.Settings) -> tuple[int, int, int]:
    return 1, c.data.seq_len, round(c.masking.ratio * c.data.seq_len)

  def forward_flops(self, c: plan_lib.Settings) -> dict[str, float]:
    d, vocab, seq_len = c.model.embed_dim, c.model.vocab_size, c.data.seq_len
    # The MLM head runs only on the gathered masked positions: dense d->d, then decoder d->V.
    masked = round(c.masking.ratio * seq_len)
    return {
        "encoder": flops.encoder_forward_flops(c.model, seq_len),
        "reconstructor": 0.0,
        "head": float(2 * masked * d * d + 2 * masked * d * vocab),}


objectives.register(MlmObjective())

"""Top-level models: CrossBERT (encoder + reconstructor) and flat BERT (encoder + MLM head).

Both take index arrays produced by `masking.py` inside the jitted step, so every shape is
static. Params are plain pytrees: {"encoder": ..., "reconstructor": ...} or
{"encoder": ..., "head": ...}; training/objectives builds them from a config. Shape letters: B batch, L length,
T visible tokens, Q reconstructed slots, M masked slots, D embed, V vocab.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.model import layers
from crossbert_jax.model.encoder import Encoder, EncoderSpec
from crossbert_jax.model.reconstructor import Reconstructor, ReconstructorSpec

Array = jax.Array


def _token_embedding(encoder_module: nn.Module) -> Array:
  return nn.unbox(encoder_module.variables["params"]["embeddings"]["tok_embeddings"]["embedding"])


class CrossBert(nn.Module):
  """Encoder on the visible tokens only; reconstructor queries at the positions to predict."""
  encoder_spec: EncoderSpec
  reconstructor_spec: ReconstructorSpec

  @nn.compact
  def __call__(self, tokens_BxL: Array, positions_BxL: Array, segment_ids_BxL: Array, vis_idx_BxT: Array,
               rec_idx_BxQ: Array, rec_valid_BxQ: Array, *, return_hidden: bool = False):
    """float32 logits BxQxV for the tokens at rec_idx (rows with rec_valid False are padding).

    With `return_hidden`: (hidden BxQxD, (head DxV, bias V or None)) instead, for a chunked loss.
    """
    encoder = Encoder(self.encoder_spec, name="encoder")
    rs = self.reconstructor_spec
    out = encoder(tokens_BxL, positions_BxL, segment_ids_BxL, vis_idx_BxT, return_all_layers=rs.feature_mixing)
    memory = jnp.stack(out[1][:-1] + [out[0]]) if rs.feature_mixing else out
    take = lambda a, idx: jnp.take_along_axis(a, idx, axis=1)
    mem_pos_BxT, mem_seg_BxT = take(positions_BxL, vis_idx_BxT), take(segment_ids_BxL, vis_idx_BxT)
    q_pos_BxQ = take(positions_BxL, rec_idx_BxQ)
    q_seg_BxQ = jnp.where(rec_valid_BxQ, take(segment_ids_BxL, rec_idx_BxQ), 0)
    embedding = _token_embedding(encoder) if rs.tie_head else None
    return Reconstructor(rs, name="reconstructor")(memory, mem_pos_BxT, mem_seg_BxT, q_pos_BxQ, q_seg_BxQ, embedding,
                                                   return_hidden=return_hidden)


class MlmHead(nn.Module):
  """ModernBERT's MLM head: dense -> gelu -> norm -> decoder tied to the token embedding (+ bias)."""
  spec: EncoderSpec

  @nn.compact
  def __call__(self, x_BxMxD: Array, embedding_VxD: Array, *, return_hidden: bool = False):
    s = self.spec
    dt = s.compute_dtype
    h = layers.Dense((s.embed_dim,), ("embed", "mlp"), s.init_std, dtype=dt, name="dense")(x_BxMxD)
    h = layers.layer_norm(s.norm_eps, dt, "norm")(nn.gelu(h, approximate=False))
    bias_V = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (s.vocab_size,),
                        jnp.float32)
    head = (embedding_VxD.T, bias_V)
    return (h, head) if return_hidden else layers.vocab_logits(h, *head)


class FlatBert(nn.Module):
  """The flat BERT baseline: all (corrupted) tokens through the encoder, head on masked slots."""
  encoder_spec: EncoderSpec

  @nn.compact
  def __call__(self, tokens_BxL: Array, positions_BxL: Array, segment_ids_BxL: Array, mask_idx_BxM: Array, *,
               return_hidden: bool = False):
    """float32 logits BxMxV at the masked positions (or, `return_hidden`, hidden and head)."""
    encoder = Encoder(self.encoder_spec, name="encoder")
    x_BxLxD = encoder(tokens_BxL, positions_BxL, segment_ids_BxL)
    x_BxMxD = jnp.take_along_axis(x_BxLxD, mask_idx_BxM[:, :, None], axis=1)
    return MlmHead(self.encoder_spec, name="head")(x_BxMxD, _token_embedding(encoder), return_hidden=return_hidden)

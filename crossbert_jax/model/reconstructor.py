"""The reconstructor (discarded after pretraining): predicts masked tokens from encoder memory.

One query per position to reconstruct: a shared learned mask embedding, with RoPE at the
query's original position; keys at the visible tokens' positions. Block:
  [x = x + SelfAttn(LN(x))]            (option, default off)
  x = x + CrossAttn(LN(x), memory)     (memory: encoder output, or a learned mix of all layers)
  x = x + MLP(LN(x))
then a final norm and a vocabulary head (untied by default).
Shape letters: B batch, Q queries, S memory (visible tokens), D reconstructor width,
E encoder width, V vocab, N encoder layers.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.model import attention as attention_lib
from crossbert_jax.model import layers

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ReconstructorSpec:
  """Hyperparameters of the reconstructor (hashable)."""
  vocab_size: int
  embed_dim: int
  num_heads: int
  num_layers: int
  mlp_dim: int
  num_memory_layers: int  # Encoder outputs available for feature mixing (N + 1).
  self_attention: bool = False
  feature_mixing: bool = False
  tie_head: bool = False
  norm_eps: float = 1e-5
  init_std: float = 0.02
  rope_theta: float = 160_000.0
  remat: str = "none"
  dtype: str = "float32"
  attention: attention_lib.AttentionSpec = attention_lib.AttentionSpec()

  @classmethod
  def from_config(cls, c: plan_lib.Settings) -> "ReconstructorSpec":
    r, m = c.reconstructor, c.model
    return cls(vocab_size=m.vocab_size, embed_dim=r.embed_dim, num_heads=r.num_heads, num_layers=r.num_layers,
               mlp_dim=r.mlp_dim, num_memory_layers=m.num_layers + 1, self_attention=r.self_attention,
               feature_mixing=r.feature_mixing, tie_head=r.tie_head, norm_eps=m.norm_eps, init_std=m.init_std,
               rope_theta=m.rope_theta, remat=m.remat, dtype=m.dtype,
               attention=attention_lib.AttentionSpec.from_config(m))

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)


class ReconstructorBlock(nn.Module):
  """[self-attention among queries] -> cross-attention to memory -> GeGLU MLP, all pre-norm."""
  spec: ReconstructorSpec

  @nn.compact
  def __call__(self, x_BxQxD, memory, q_rope, kv_rope, q_seg_BxQ, mem_seg_BxS):
    s = self.spec
    dt = s.compute_dtype
    out_std = s.init_std / math.sqrt(2.0 * s.num_layers)
    if s.self_attention:
      h = layers.layer_norm(s.norm_eps, dt, "self_attn_norm")(x_BxQxD)
      x_BxQxD = x_BxQxD + layers.SelfAttention(s.num_heads, s.init_std, out_std, dt, s.attention, name="self_attn")(
          h, q_rope, q_seg_BxQ)
    if s.feature_mixing:
      # CrossMAE: this block's own linear mix of all encoder layer outputs, then a norm.
      feats_NxBxSxE = memory
      w_N = self.param("mix_weights", nn.with_logical_partitioning(lambda _, n: jnp.zeros((n,)).at[-1].set(1.0),
                                                                   (None,)), feats_NxBxSxE.shape[0])
      mem_BxSxE = jnp.einsum("n,nbse->bse", w_N.astype(dt), feats_NxBxSxE.astype(dt))
      mem_BxSxE = layers.layer_norm(s.norm_eps, dt, "memory_norm")(mem_BxSxE)
    else:
      mem_BxSxE = memory
    h = layers.layer_norm(s.norm_eps, dt, "cross_attn_norm")(x_BxQxD)
    x_BxQxD = x_BxQxD + layers.CrossAttention(s.num_heads, s.init_std, out_std, dt, s.attention, name="cross_attn")(
        h, mem_BxSxE, q_rope, kv_rope, q_seg_BxQ, mem_seg_BxS)
    h = layers.layer_norm(s.norm_eps, dt, "mlp_norm")(x_BxQxD)
    x_BxQxD = x_BxQxD + layers.GeGLU(s.mlp_dim, s.init_std, out_std, dt, name="mlp")(h)
    return nn.with_logical_constraint(x_BxQxD, ("batch", "length", "embed"))


class Reconstructor(nn.Module):
  """Predicts token logits at query positions from the encoder's visible-token memory."""
  spec: ReconstructorSpec

  @nn.compact
  def __call__(self, memory, mem_pos_BxS: Array, mem_seg_BxS: Array, q_pos_BxQ: Array, q_seg_BxQ: Array,
               embedding_VxE: Array | None = None, *, return_hidden: bool = False):
    """memory: BxSxE encoder output, or (feature mixing) NxBxSxE stacked layer outputs.

    Returns float32 logits BxQxV, or with `return_hidden` (final hidden BxQxD, (head DxV, bias V
    or None)) for a loss that applies the head chunk by chunk. Queries with segment 0 are padding.
    """
    s = self.spec
    dt = s.compute_dtype
    b, q = q_pos_BxQ.shape
    mask_emb_D = self.param("mask_embedding", layers.init_normal(s.init_std, ("embed",)), (s.embed_dim,), jnp.float32)
    x_BxQxD = jnp.broadcast_to(mask_emb_D.astype(dt), (b, q, s.embed_dim))
    x_BxQxD = nn.with_logical_constraint(x_BxQxD, ("batch", "length", "embed"))
    head_dim = s.embed_dim // s.num_heads
    q_rope = layers.rope_tables(q_pos_BxQ, head_dim, s.rope_theta)
    kv_rope = layers.rope_tables(mem_pos_BxS, head_dim, s.rope_theta)
    block_cls = layers.remat(ReconstructorBlock, s.remat)
    for i in range(s.num_layers):
      x_BxQxD = block_cls(s, name=f"layers_{i}")(x_BxQxD, memory, q_rope, kv_rope, q_seg_BxQ, mem_seg_BxS)
    x_BxQxD = layers.layer_norm(s.norm_eps, dt, "final_norm")(x_BxQxD)
    if s.tie_head:
      head = (embedding_VxE.T, None)
    else:
      head = layers.VocabHead(s.vocab_size, s.init_std, name="head")(s.embed_dim)
    if return_hidden:
      return x_BxQxD, head
    return layers.vocab_logits(x_BxQxD, *head)

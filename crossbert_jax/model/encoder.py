"""The encoder (the product): laid out 1:1 like Hugging Face `ModernBertModel`.

embeddings (tok_embeddings -> norm) -> N blocks -> final_norm. Block i:
  x = x + attn(attn_norm(x))   (layer 0 has no attn_norm, as ModernBERT)
  x = x + mlp(mlp_norm(x))
Attention is global for layers with i % global_every == 0, else local (+-local_window // 2).
With `dropout` > 0 and a "dropout" rng (the contrastive stage), dropout follows the embeddings' norm and
each block's attention and MLP branches (as BERT's hidden dropout); without the rng it is off.

The encoder can run on a gathered subset of tokens (`keep_idx_BxT`): each kept token keeps its
original position id for RoPE and its segment id, so CrossBERT's encoder sees only the visible
tokens. Shape letters: B batch, L full length, T encoder tokens, D embed.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.core import sections
from crossbert_jax.model import attention as attention_lib
from crossbert_jax.model import layers

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
  """Hyperparameters of the encoder (hashable, built from `config.model`)."""
  vocab_size: int
  embed_dim: int
  num_heads: int
  num_layers: int
  mlp_dim: int
  norm_eps: float = 1e-5
  init_std: float = 0.02
  rope_theta: float = 160_000.0
  local_rope_theta: float = 10_000.0
  local_window: int = 128
  global_every: int = 1
  scan_layers: bool = False
  remat: str = "none"
  dtype: str = "float32"
  attention: str = "auto"
  attention_block_q: int = 512
  attention_block_kv: int = 512
  attention_chunked_min_len: int = 1024
  dropout: float = 0.0

  @classmethod
  def from_config(cls, model_cfg: sections.Model) -> "EncoderSpec":
    return cls(**{f.name: model_cfg[f.name] for f in dataclasses.fields(cls)})

  @property
  def attention_spec(self) -> attention_lib.AttentionSpec:
    return attention_lib.AttentionSpec(self.attention, self.attention_block_q, self.attention_block_kv,
                                       self.attention_chunked_min_len)

  @property
  def head_dim(self) -> int:
    return self.embed_dim // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  def is_global(self, layer: int) -> bool:
    return layer % self.global_every == 0


def dropout(module: nn.Module, x: Array, rate: float) -> Array:
  """`x` under dropout at `rate` when the apply passed a "dropout" rng (training); else, and at rate 0, `x`
  itself (no op in the program: a model without dropout lowers as before)."""
  if rate <= 0.0:
    return x
  return nn.Dropout(rate, deterministic=not module.has_rng("dropout"))(x)


def _remat(block_cls, spec: EncoderSpec, static_argnums=()):
  # Under nn.scan, CSE cannot merge the recomputation into the forward: prevent_cse is not needed.
  return layers.remat(block_cls, spec.remat, prevent_cse=not spec.scan_layers, static_argnums=static_argnums)


class EncoderBlock(nn.Module):
  """One pre-norm block; `is_global` may be a Python bool or a traced scalar (under scan)."""
  spec: EncoderSpec
  first: bool = False

  @nn.compact
  def __call__(self, x_BxTxD: Array, rope_global, rope_local, seg_BxT: Array, pos_BxT: Array, is_global) -> Array:
    s = self.spec
    dt = s.compute_dtype
    out_std = s.init_std / math.sqrt(2.0 * s.num_layers)
    if isinstance(is_global, bool):
      cos_sin = rope_global if is_global else rope_local
    else:
      cos_sin = jax.tree.map(lambda g, l: jnp.where(is_global, g, l), rope_global, rope_local)
    window = s.local_window if s.global_every > 1 else None
    h = x_BxTxD if self.first else layers.layer_norm(s.norm_eps, dt, "attn_norm")(x_BxTxD)
    h = layers.SelfAttention(s.num_heads, s.init_std, out_std, dt, s.attention_spec,
                             name="attn")(h, cos_sin, seg_BxT, pos_BxT, window, is_global)
    x_BxTxD = x_BxTxD + dropout(self, h, s.dropout)
    h = layers.layer_norm(s.norm_eps, dt, "mlp_norm")(x_BxTxD)
    h = dropout(self, layers.GeGLU(s.mlp_dim, s.init_std, out_std, dt, name="mlp")(h), s.dropout)
    x_BxTxD = nn.with_logical_constraint(x_BxTxD + h, ("batch", "length", "embed"))
    return x_BxTxD


class _ScanBody(nn.Module):
  """Scan adapter: carry = activations, xs = per-layer `is_global` flag, ys = layer outputs."""
  spec: EncoderSpec
  keep_outputs: bool

  @nn.compact
  def __call__(self, x_BxTxD, is_global, rope_global, rope_local, seg_BxT, pos_BxT):
    block = _remat(EncoderBlock, self.spec)(self.spec, name="block")
    x_BxTxD = block(x_BxTxD, rope_global, rope_local, seg_BxT, pos_BxT, is_global)
    return x_BxTxD, (x_BxTxD if self.keep_outputs else None)


class TokenEmbedding(nn.Module):
  """The token embedding table VxD (param path tok_embeddings/embedding, as nn.Embed)."""
  spec: EncoderSpec

  @nn.compact
  def __call__(self) -> Array:
    s = self.spec
    return self.param("embedding", layers.init_normal(s.init_std, ("vocab", "embed")), (s.vocab_size, s.embed_dim),
                      jnp.float32)


class Embeddings(nn.Module):
  """tok_embeddings -> (optional gather of kept tokens) -> norm."""
  spec: EncoderSpec

  @nn.compact
  def __call__(self, tokens_BxL: Array, keep_idx_BxT: Array | None) -> Array:
    s = self.spec
    table_VxD = TokenEmbedding(s, name="tok_embeddings")()
    # Gather from a replicated table (FSDP all-gathers weights before use anyway): a lookup into
    # a vocab/embed-sharded table would force the partitioner into a full rematerialisation.
    table_VxD = nn.with_logical_constraint(table_VxD, (None, None))
    x_BxLxD = jnp.take(table_VxD, tokens_BxL, axis=0).astype(s.compute_dtype)
    # A zero perturbation: its gradient is the gradient w.r.t. the input embeddings (tests).
    x_BxLxD = self.perturb("token_embeddings", x_BxLxD)
    if keep_idx_BxT is not None:
      x_BxLxD = jnp.take_along_axis(x_BxLxD, keep_idx_BxT[:, :, None], axis=1)
    x_BxTxD = nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
    return dropout(self, layers.layer_norm(s.norm_eps, s.compute_dtype, "norm")(x_BxTxD), s.dropout)


class Encoder(nn.Module):
  """ModernBERT-layout encoder over the full sequence or a gathered subset of it."""
  spec: EncoderSpec

  @nn.compact
  def __call__(self, tokens_BxL: Array, positions_BxL: Array, segment_ids_BxL: Array, keep_idx_BxT: Array | None = None,
               *, return_all_layers: bool = False):
    """Returns final hidden states BxTxD, or (final, [embedding output, block 1..N outputs])."""
    s = self.spec
    x_BxTxD = Embeddings(s, name="embeddings")(tokens_BxL, keep_idx_BxT)
    if keep_idx_BxT is None:
      pos_BxT, seg_BxT = positions_BxL, segment_ids_BxL
    else:
      pos_BxT = jnp.take_along_axis(positions_BxL, keep_idx_BxT, axis=1)
      seg_BxT = jnp.take_along_axis(segment_ids_BxL, keep_idx_BxT, axis=1)

    rope_global = layers.rope_tables(pos_BxT, s.head_dim, s.rope_theta)
    if s.global_every > 1:
      rope_local = layers.rope_tables(pos_BxT, s.head_dim, s.local_rope_theta)
    else:  # All layers global: nothing local is ever selected.
      rope_local = rope_global
    # Masks are built inside the attention backend from segment ids and positions (a fused
    # kernel never sees a BxTxT mask).
    args = (rope_global, rope_local, seg_BxT, pos_BxT)

    outputs = [x_BxTxD]
    x_BxTxD = _remat(EncoderBlock, s,
                     static_argnums=(6,))(s, first=True,
                                          name="layers_0")(x_BxTxD, *args,
                                                           True if s.global_every == 1 else s.is_global(0))
    outputs.append(x_BxTxD)
    if s.scan_layers:
      flags = jnp.array([s.is_global(i) for i in range(1, s.num_layers)])
      rngs = {"params": True, "dropout": True} if s.dropout > 0 else {"params": True}  # A mask per layer.
      scan = nn.scan(_ScanBody, variable_axes={"params": 0}, split_rngs=rngs,
                     in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast), length=s.num_layers - 1,
                     metadata_params={nn.PARTITION_NAME: "layers"})
      x_BxTxD, ys = scan(s, return_all_layers, name="layers")(x_BxTxD, flags, *args)
      if return_all_layers:
        outputs.extend(ys[i] for i in range(s.num_layers - 1))
    else:
      for i in range(1, s.num_layers):
        x_BxTxD = _remat(EncoderBlock, s, static_argnums=(6,))(s, name=f"layers_{i}")(x_BxTxD, *args, s.is_global(i))
        outputs.append(x_BxTxD)
    x_BxTxD = layers.layer_norm(s.norm_eps, s.compute_dtype, "final_norm")(x_BxTxD)
    if return_all_layers:
      return x_BxTxD, outputs
    return x_BxTxD

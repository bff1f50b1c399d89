"""Transformer building blocks shared by the encoder, the reconstructor and the MLM head.

Shape letters: B batch, T tokens (queries), S keys/memory, D embed, H heads, K head dim,
F mlp hidden, V vocab. Every param and activation carries logical axis names only
(`batch, length, embed, heads, kv, mlp, vocab, layers`); `sharding.py` maps them to the mesh.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.model import attention as attention_lib

Dtype = Any
Array = jax.Array


def init_normal(std: float, axes: tuple[str | None, ...]):
  """ModernBERT's init (normal truncated at +-2 std) with logical axis names."""
  return nn.with_logical_partitioning(jax.nn.initializers.truncated_normal(stddev=std, lower=-2.0, upper=2.0), axes)


def layer_norm(eps: float, dtype: Dtype, name: str) -> nn.LayerNorm:
  """LayerNorm without bias (ModernBERT: norm_bias=False)."""
  return nn.LayerNorm(epsilon=eps, use_bias=False, dtype=dtype, param_dtype=jnp.float32,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), name=name)


def rope_tables(positions_BxT: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
  """cos, sin of RoPE angles, each BxTx(K/2), in float32 (HF's rotate_half convention)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles_BxTxK2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
  return jnp.cos(angles_BxTxK2), jnp.sin(angles_BxTxK2)


def apply_rope(x_BxTxHxK: Array, cos_sin: tuple[Array, Array]) -> Array:
  """Rotates x by the RoPE tables; the first and second halves of K form the pairs."""
  cos, sin = (t[:, :, None, :] for t in cos_sin)
  x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxHxK.dtype)


def vocab_logits(x_BxQxD: Array, w_DxV: Array, b_V: Array | None) -> Array:
  """float32 logits x @ w (+ b): the matmul accumulates in float32 (bf16 inputs, no bf16 logits)."""
  logits_BxQxV = jnp.einsum("bqd,dv->bqv", x_BxQxD, w_DxV.astype(x_BxQxD.dtype), preferred_element_type=jnp.float32)
  if b_V is not None:
    logits_BxQxV = logits_BxQxV + b_V.astype(jnp.float32)[None, None, :]
  return nn.with_logical_constraint(logits_BxQxV, ("batch", "length", "vocab"))


class VocabHead(nn.Module):
  """The untied vocabulary projection's params: kernel DxV and bias V (nn.Dense's param paths)."""
  vocab_size: int
  init_std: float

  @nn.compact
  def __call__(self, embed_dim: int) -> tuple[Array, Array]:
    kernel_DxV = self.param("kernel", init_normal(self.init_std, ("embed", "vocab")), (embed_dim, self.vocab_size),
                            jnp.float32)
    bias_V = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (self.vocab_size,),
                        jnp.float32)
    return kernel_DxV, bias_V


class Dense(nn.Module):
  """A bias-free projection contracting the last `contract` dims into a kernel of N-d `features`.

  The kernel is created at its full N-d shape (e.g. embed x 3 x heads x kv), so its logical axis
  names always match its rank.
  """
  features: tuple[int, ...]
  axes: tuple[str | None, ...]
  std: float
  contract: int = 1
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    in_shape = x.shape[x.ndim - self.contract:]
    kernel = self.param("kernel", init_normal(self.std, self.axes), in_shape + tuple(self.features), jnp.float32)
    contract_x = tuple(range(x.ndim - self.contract, x.ndim))
    return jnp.tensordot(x.astype(self.dtype), kernel.astype(self.dtype),
                         axes=(contract_x, tuple(range(self.contract))))


class SelfAttention(nn.Module):
  """Bidirectional self-attention: fused QKV (no bias), RoPE, output projection (no bias).

  Mask (`attention.py`): same non-pad segment, and with `window` set and `is_global` false
  (a Python bool, or traced under nn.scan) |pos_q - pos_k| <= window // 2.
  """
  num_heads: int
  init_std: float
  out_std: float
  dtype: Dtype = jnp.float32
  attention: attention_lib.AttentionSpec = attention_lib.AttentionSpec()

  @nn.compact
  def __call__(self, x_BxTxD: Array, cos_sin: tuple[Array, Array], seg_BxT: Array, pos_BxT: Array | None = None,
               window: int | None = None, is_global=True) -> Array:
    d = x_BxTxD.shape[-1]
    k = d // self.num_heads
    qkv_BxTx3xHxK = Dense((3, self.num_heads, k), ("embed", None, "heads", "kv"), self.init_std, dtype=self.dtype,
                          name="Wqkv")(x_BxTxD)
    qkv_BxTx3xHxK = nn.with_logical_constraint(qkv_BxTx3xHxK, ("batch", "length", None, "heads", "kv"))
    # One split (its transpose is a concatenate) rather than three slices (three pads + adds).
    q, kk, v = (a[:, :, 0] for a in jnp.split(qkv_BxTx3xHxK, 3, axis=2))
    out_BxTxHxK = attention_lib.self_attention(apply_rope(q, cos_sin), apply_rope(kk, cos_sin), v, seg_BxT, pos_BxT,
                                               spec=self.attention, window=window, is_global=is_global)
    out_BxTxHxK = nn.with_logical_constraint(out_BxTxHxK, ("batch", "length", "heads", "kv"))
    return Dense((d,), ("heads", "kv", "embed"), self.out_std, contract=2, dtype=self.dtype, name="Wo")(out_BxTxHxK)


class CrossAttention(nn.Module):
  """Queries attend to a memory of another width: Wq on queries, fused Wkv on memory, RoPE on both."""
  num_heads: int
  init_std: float
  out_std: float
  dtype: Dtype = jnp.float32
  attention: attention_lib.AttentionSpec = attention_lib.AttentionSpec()

  @nn.compact
  def __call__(self, x_BxTxD: Array, mem_BxSxE: Array, q_cos_sin: tuple[Array, Array], kv_cos_sin: tuple[Array, Array],
               q_seg_BxT: Array, kv_seg_BxS: Array) -> Array:
    d = x_BxTxD.shape[-1]
    k = d // self.num_heads
    q_BxTxHxK = Dense((self.num_heads, k), ("embed", "heads", "kv"), self.init_std, dtype=self.dtype,
                      name="Wq")(x_BxTxD)
    kv_BxSx2xHxK = Dense((2, self.num_heads, k), ("embed", None, "heads", "kv"), self.init_std, dtype=self.dtype,
                         name="Wkv")(mem_BxSxE)
    kv_BxSx2xHxK = nn.with_logical_constraint(kv_BxSx2xHxK, ("batch", "length", None, "heads", "kv"))
    k_BxSxHxK, v_BxSxHxK = (a[:, :, 0] for a in jnp.split(kv_BxSx2xHxK, 2, axis=2))
    out_BxTxHxK = attention_lib.attention(apply_rope(q_BxTxHxK, q_cos_sin), apply_rope(k_BxSxHxK, kv_cos_sin),
                                          v_BxSxHxK, q_seg_BxT, kv_seg_BxS, spec=self.attention)
    return Dense((d,), ("heads", "kv", "embed"), self.out_std, contract=2, dtype=self.dtype, name="Wo")(out_BxTxHxK)


class GeGLU(nn.Module):
  """ModernBERT MLP: Wi -> (input, gate) -> gelu(input) * gate -> Wo, no biases."""
  mlp_dim: int
  init_std: float
  out_std: float
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    d = x_BxTxD.shape[-1]
    h_BxTx2xF = Dense((2, self.mlp_dim), ("embed", None, "mlp"), self.init_std, dtype=self.dtype, name="Wi")(x_BxTxD)
    h_BxTx2xF = nn.with_logical_constraint(h_BxTx2xF, ("batch", "length", None, "mlp"))
    in_BxTxF, gate_BxTxF = (a[:, :, 0] for a in jnp.split(h_BxTx2xF, 2, axis=2))
    h_BxTxF = nn.gelu(in_BxTxF, approximate=False) * gate_BxTxF
    return Dense((d,), ("mlp", "embed"), self.out_std, dtype=self.dtype, name="Wo")(h_BxTxF)


def remat(block_cls: type[nn.Module], mode: str, *, prevent_cse: bool = True, static_argnums=()) -> type[nn.Module]:
  """`block_cls` under the config's `model.remat`: "none" (as is), "dots" (save the matmuls
  without batch dimensions, recompute the rest) or "full" (save only the block's inputs)."""
  # "auto" is resolved to none / dots / full by the train program (training/memory.py) before any
  # backward; it reaches here only for forwards (init, evaluation, export), where nothing is recomputed.
  if mode in ("none", "auto"):
    return block_cls
  policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable if mode == "dots" else None
  return nn.remat(block_cls, policy=policy, prevent_cse=prevent_cse, static_argnums=static_argnums)

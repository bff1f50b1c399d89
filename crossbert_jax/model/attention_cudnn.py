"""The cuDNN backend (`model.attention="cudnn"`): `jax.nn.dot_product_attention(implementation="cudnn")`.

cuDNN's fused attention from JAX takes a mask, a bias, or trailing padding (sequence lengths),
and a window only together with a causal mask (jax raises for a right window without one). The
module's mask (`attention.mask`: same non-pad segment, and in a local layer |pos_q - pos_k| <=
w // 2 by position id) is therefore passed whole, as a B x 1 x T x S bool (cuDNN reads it as a
bias): packed documents, pads, the two-sided window and cross-attention (T != S) all go through it,
but a local layer costs as much as a global one (no block is skipped). A query that sees no key
gets the kernel's average over masked keys, so its output is zeroed by `has_key` as the reference
does (its gradient is then zero too). This is the path the accelerator check's attention_speed
step timed as "cuDNN (reference)".

cuDNN runs bf16 / fp16 only: float32 inputs, and any platform but a GPU, run the same function with
`implementation="xla"` (the same mask, XLA's dense softmax), which is how the CPU tests check the
mask and the zeroing against the reference. Shape letters: B batch, T queries, S keys, H heads, K
head dim.
"""

import jax
import jax.numpy as jnp

Array = jax.Array
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def implementation(platform: str, dtype) -> str:
  """"cudnn" on a GPU for bf16 / fp16 inputs, else "xla"."""
  return "cudnn" if platform == "gpu" and jnp.dtype(dtype) in CUDNN_DTYPES else "xla"


def cudnn_attention(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, mask_BxTxS: Array, *, impl: str) -> Array:
  """Softmax attention (scale K**-0.5) under `mask_BxTxS`; keyless queries output zeros."""
  out_BxTxHxK = jax.nn.dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=mask_BxTxS[:, None],
                                             implementation=impl)
  has_key_BxTx1x1 = jnp.any(mask_BxTxS, axis=-1)[:, :, None, None]
  return out_BxTxHxK * has_key_BxTx1x1.astype(out_BxTxHxK.dtype)

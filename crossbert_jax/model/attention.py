"""One attention function for every layer, with backends chosen by `model.attention`.

The mask, the same for every backend: query t sees key s iff q_seg[t] == kv_seg[s] and
kv_seg[s] > 0 (packed documents; segment 0 is padding), and, with a local window w,
|q_pos[t] - kv_pos[s]| <= w // 2 (ModernBERT's window, by position ids). A query that sees no
key (a pad, or a reconstruction query whose document has no visible token) outputs zeros.

Backends: `xla` dense scores (the reference); `chunked` blocked online softmax in plain XLA with
a flash backward (`attention_chunked.py`); `splash` the TPU Pallas kernel (`attention_kernels.py`);
`gpu_flash` the Pallas GPU kernel; `cudnn` cuDNN's fused attention with the mask passed whole
(`attention_cudnn.py`); `auto` picks splash on TPU, gpu_flash on GPU, and dense or
chunked on CPU by length. Shape letters: B batch, T queries, S keys, H heads, K head dim.
"""

import dataclasses

import jax
import jax.numpy as jnp

from crossbert_jax.core import sections
from crossbert_jax.core import choices
from crossbert_jax.model import attention_chunked, attention_cudnn, attention_kernels

Array = jax.Array
BACKENDS = tuple(choices.values(choices.Attention))


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """Backend and block sizes (hashable; built from `config.model`)."""
  backend: str = "auto"
  block_q: int = 512
  block_kv: int = 512
  chunked_min_len: int = 1024
  # Run splash / gpu_flash off their platform in Pallas interpret mode (the CPU tests); otherwise
  # they fall back to chunked there (e.g. evaluating a TPU-trained config on a CPU host).
  interpret: bool = False

  @classmethod
  def from_config(cls, model_cfg: sections.Model) -> "AttentionSpec":
    return cls(backend=model_cfg.attention, block_q=model_cfg.attention_block_q, block_kv=model_cfg.attention_block_kv,
               chunked_min_len=model_cfg.attention_chunked_min_len)


def resolve_backend(spec: AttentionSpec, q_len: int, kv_len: int) -> str:
  """The concrete backend for `spec.backend` at these lengths on the target platform."""
  platform = attention_kernels.target_platform()
  home = {"splash": "tpu", "gpu_flash": "gpu", "cudnn": "gpu"}.get(spec.backend)
  if home is not None and platform != home and not spec.interpret:
    attention_kernels.warn_once(f"model.attention={spec.backend} needs a {home.upper()}; running the "
                                f"chunked kernel on {platform}")
    return "chunked"
  if spec.backend != "auto":
    return spec.backend
  if platform == "tpu":
    return "splash"
  if platform == "gpu":
    return "gpu_flash"
  return "chunked" if max(q_len, kv_len) >= spec.chunked_min_len else "xla"


def mask(q_seg_BxT: Array, kv_seg_BxS: Array, q_pos_BxT: Array | None = None, kv_pos_BxS: Array | None = None,
         window: int | None = None) -> Array:
  """BxTxS bool: same non-pad segment, and (if window) |q_pos - kv_pos| <= window // 2."""
  allowed = (q_seg_BxT[:, :, None] == kv_seg_BxS[:, None, :]) & (kv_seg_BxS[:, None, :] > 0)
  if window is not None:
    allowed &= jnp.abs(q_pos_BxT[:, :, None] - kv_pos_BxS[:, None, :]) <= window // 2
  return allowed


def dense(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, mask_BxTxS: Array) -> Array:
  """The reference: float32 BxHxTxS scores, softmax, weighted sum; keyless queries output zeros."""
  scale = q_BxTxHxK.shape[-1] ** -0.5
  # Heads-first operands: both batched matmuls then run on contiguous B*H row-major blocks
  # (one transpose each of q, k, v and the output; ~20% faster fwd+bwd on XLA:CPU at T=256).
  q_BxHxTxK, k_BxHxSxK, v_BxHxSxK = (jnp.swapaxes(a, 1, 2) for a in (q_BxTxHxK * scale, k_BxSxHxK, v_BxSxHxK))
  logits_BxHxTxS = jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxHxSxK, preferred_element_type=jnp.float32)
  logits_BxHxTxS = jnp.where(mask_BxTxS[:, None], logits_BxHxTxS, jnp.finfo(jnp.float32).min)
  probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1).astype(v_BxSxHxK.dtype)
  out_BxTxHxK = jnp.swapaxes(jnp.einsum("bhts,bhsk->bhtk", probs_BxHxTxS, v_BxHxSxK), 1, 2)
  # A fully masked row would spread uniform weight over every key, reading other documents (a
  # reconstruction query whose document has no visible token in this view): zero its output.
  # Done on the output, not the BxHxTxS probabilities: the same result, a much smaller tensor.
  has_key_BxTx1x1 = jnp.any(mask_BxTxS, axis=-1)[:, :, None, None]
  return out_BxTxHxK * has_key_BxTx1x1.astype(out_BxTxHxK.dtype)


def attention(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, q_seg_BxT: Array, kv_seg_BxS: Array | None = None,
              *, spec: AttentionSpec, q_pos_BxT: Array | None = None, kv_pos_BxS: Array | None = None,
              window: int | None = None) -> Array:
  """Softmax attention (scale K**-0.5) under the module's mask; BxTxHxK out, q's dtype.

  kv_seg_BxS (and kv_pos_BxS) None: self-attention, the keys' ids are the queries'.
  """
  shared = kv_seg_BxS is None
  kv_seg_BxS = q_seg_BxT if shared else kv_seg_BxS
  kv_pos_BxS = q_pos_BxT if kv_pos_BxS is None and shared else kv_pos_BxS
  if window is not None and (q_pos_BxT is None or kv_pos_BxS is None):
    raise ValueError("a local window needs q_pos_BxT and kv_pos_BxS")
  backend = resolve_backend(spec, q_BxTxHxK.shape[1], k_BxSxHxK.shape[1])
  args = (q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS)
  if backend == "xla":
    return dense(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask(q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS, window))
  if backend == "chunked":
    return attention_chunked.chunked_attention(*args, window=window, block_kv=spec.block_kv)
  if backend == "splash":
    return attention_kernels.splash_attention(*args, window=window, block_q=spec.block_q, block_kv=spec.block_kv,
                                              interpret=spec.interpret)
  if backend == "cudnn":
    impl = attention_cudnn.implementation(attention_kernels.target_platform(), q_BxTxHxK.dtype)
    if impl != "cudnn" and attention_kernels.target_platform() == "gpu":
      attention_kernels.warn_once(f"model.attention=cudnn needs bf16 or fp16 inputs, got {q_BxTxHxK.dtype}; running "
                                  "jax.nn.dot_product_attention's XLA implementation")
    return attention_cudnn.cudnn_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK,
                                           mask(q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS, window), impl=impl)
  if backend == "gpu_flash":
    return attention_kernels.gpu_flash_attention(*args, window=window, shared_segments=shared, block_q=spec.block_q,
                                                 block_kv=spec.block_kv, interpret=spec.interpret)
  raise ValueError(f"unknown attention backend {backend!r}; use one of {BACKENDS}")


def self_attention(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, seg_BxT: Array, pos_BxT: Array | None, *,
                   spec: AttentionSpec, window: int | None, is_global=True) -> Array:
  """Self-attention, global or windowed; `is_global` may be traced (scanned layers): then a cond."""
  if window is None or is_global is True:
    return attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, seg_BxT, spec=spec, q_pos_BxT=pos_BxT)
  local = lambda q, k, v, seg, pos: attention(q, k, v, seg, spec=spec, q_pos_BxT=pos, window=window)
  if is_global is False:
    return local(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, seg_BxT, pos_BxT)
  # A cond runs one branch, so a kernel whose mask is static (splash) gets its own block-sparse
  # local mask instead of a dense select between two masks.
  glob = lambda q, k, v, seg, pos: attention(q, k, v, seg, spec=spec, q_pos_BxT=pos)
  return jax.lax.cond(is_global, glob, local, q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, seg_BxT, pos_BxT)

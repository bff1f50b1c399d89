"""The bf16 vocabulary head (`model.head_dtype="bfloat16"`): cross-entropy with every head GEMM in bf16.

The float32 head (`losses.chunked_cross_entropy`) runs its forward matmul on the compute dtype's
inputs with float32 accumulation, but autodiff hands the backward the float32 gradient of the
logits, so both backward GEMMs (d hidden = dlogits @ W^T, d W = hidden^T @ dlogits) take float32
operands, and the backward recomputes each chunk's logits: four GEMMs, two of them float32.

Here a custom VJP computes the gradient in the forward pass, chunk by chunk (the fused linear
cross-entropy of Liger-Kernel / Apple's cut cross-entropy): each chunk's logits are a bf16 x bf16
GEMM accumulated in float32, the softmax, loss and logit gradient are float32, the logit gradient
is rounded to bf16 for the two gradient GEMMs (float32 accumulation), d W and d b accumulate in
float32 across chunks. The loss is a scalar, so its cotangent only scales what the forward
computed: three bf16 GEMMs, no recompute, and B x Q x V never exists whole (one B x chunk x V
tile at a time). The stats (counts) get no gradient, as before.

XLA:CPU has no bf16 x bf16 -> float32 dot for every layout ("Unsupported element type for
DotThunk"): on a CPU the bf16-rounded operands are multiplied as float32, which is the same
arithmetic (a product of two bf16 numbers is exact in float32; the sums are float32 either way).
Shape letters: B batch, Q predicted slots, C slots per chunk, D width, V vocab, N chunks.
"""

import functools

import jax
import jax.numpy as jnp

from crossbert_jax.model import attention_kernels
from crossbert_jax.training.objectives.losses import LossStats

Array = jax.Array


def _chunks(a: Array, n: int, chunk: int) -> Array:
  """B x Q ... -> N x B x C ... (zero padded: padded slots weigh 0)."""
  b, q = a.shape[:2]
  a = jnp.pad(a, [(0, 0), (0, n * chunk - q)] + [(0, 0)] * (a.ndim - 2))
  return jnp.moveaxis(a.reshape((b, n, chunk) + a.shape[2:]), 1, 0)


def _scan(x_BxQxD, w_DxV, b_V, targets_BxQ, weights_BxQ, chunk: int, dtype, native: bool, with_grads: bool):
  """(loss, stats) and, `with_grads`, (d x, d W, d b) of the summed loss, one chunk of slots at a time."""
  b, q, d = x_BxQxD.shape
  dtype = jnp.dtype(dtype)
  if native:
    dot = lambda spec, u, v: jnp.einsum(spec, u, v, preferred_element_type=jnp.float32)
  else:  # The same products and float32 sums, as float32 operands (XLA:CPU).
    dot = lambda spec, u, v: jnp.einsum(spec, u.astype(jnp.float32), v.astype(jnp.float32))
  n = -(-q // chunk)
  c = min(chunk, q)
  w_lo = w_DxV.astype(dtype)
  xs = (_chunks(x_BxQxD, n, c), _chunks(targets_BxQ, n, c), _chunks(weights_BxQ, n, c))

  def body(carry, xs_chunk):
    x_BxCxD, t_BxC, wt_BxC = xs_chunk
    x_lo = x_BxCxD.astype(dtype)
    logits_BxCxV = dot("bcd,dv->bcv", x_lo, w_lo) + b_V[None, None, :]
    shifted_BxCxV = logits_BxCxV - jnp.max(logits_BxCxV, axis=-1, keepdims=True)
    exp_BxCxV = jnp.exp(shifted_BxCxV)
    sum_BxC = jnp.sum(exp_BxCxV, axis=-1)
    target_BxC = jnp.take_along_axis(shifted_BxCxV, t_BxC[..., None], axis=-1)[..., 0]
    wt = wt_BxC.astype(jnp.float32)
    loss = jnp.sum((jnp.log(sum_BxC) - target_BxC) * wt)
    stats = LossStats(jnp.sum(wt), jnp.sum((target_BxC >= 0.0).astype(jnp.float32) * wt))
    if not with_grads:
      return jax.tree.map(jnp.add, carry, (loss, stats)), None
    # d loss / d logits = (softmax - onehot(target)) * weight, float32; rounded to bf16 for the GEMMs.
    is_target = jnp.arange(w_DxV.shape[1])[None, None, :] == t_BxC[..., None]
    dlogits_BxCxV = (exp_BxCxV / sum_BxC[..., None] - is_target) * wt[..., None]
    dl_lo = dlogits_BxCxV.astype(dtype)
    dx_BxCxD = dot("bcv,dv->bcd", dl_lo, w_lo).astype(x_BxCxD.dtype)
    dw_DxV = dot("bcd,bcv->dv", x_lo, dl_lo)
    (tot_loss, tot_stats), (dw, db) = carry
    totals = (tot_loss + loss, jax.tree.map(jnp.add, tot_stats, stats))
    return (totals, (dw + dw_DxV, db + jnp.sum(dlogits_BxCxV, (0, 1)))), dx_BxCxD

  zero = jnp.zeros((), jnp.float32)
  init = (zero, LossStats(zero, zero))
  if not with_grads:
    return jax.lax.scan(body, init, xs)[0]
  init = (init, (jnp.zeros(w_DxV.shape, jnp.float32), jnp.zeros(b_V.shape, jnp.float32)))
  (out, (dw, db)), dx_NxBxCxD = jax.lax.scan(body, init, xs)
  dx_BxQxD = jnp.moveaxis(dx_NxBxCxD, 0, 1).reshape(b, n * c, d)[:, :q]
  return out, (dx_BxQxD, dw, db)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _fused(x_BxQxD, w_DxV, b_V, targets_BxQ, weights_BxQ, chunk, dtype, native):
  return _scan(x_BxQxD, w_DxV, b_V, targets_BxQ, weights_BxQ, chunk, dtype, native, with_grads=False)


def _fused_fwd(x_BxQxD, w_DxV, b_V, targets_BxQ, weights_BxQ, chunk, dtype, native):
  out, (dx, dw, db) = _scan(x_BxQxD, w_DxV, b_V, targets_BxQ, weights_BxQ, chunk, dtype, native, with_grads=True)
  return out, (dx, dw.astype(w_DxV.dtype), db.astype(b_V.dtype))


def _fused_bwd(chunk, dtype, native, residuals, cotangents):
  del chunk, dtype, native
  g = cotangents[0]  # The summed loss's; the counts' cotangents are ignored (piecewise constant).
  scale = lambda a: (g * a.astype(jnp.float32)).astype(a.dtype)
  return (*map(scale, residuals), None, None)


_fused.defvjp(_fused_fwd, _fused_bwd)


def cross_entropy(x_BxQxD: Array, head: tuple[Array, Array | None], targets_BxQ: Array, weights_BxQ: Array, chunk: int,
                  dtype=jnp.bfloat16, native: bool | None = None) -> tuple[Array, LossStats]:
  """Summed cross-entropy and stats of logits x @ W + b with `dtype` GEMM inputs (float32 softmax
  and accumulation), `chunk` slots at a time; the gradient is computed in the forward pass.
  `native`: `dtype` dots with float32 results (default: unless compiling for a CPU)."""
  w_DxV, b_V = head
  bias = jnp.zeros((w_DxV.shape[1],), jnp.float32) if b_V is None else b_V
  if native is None:
    native = attention_kernels.target_platform() != "cpu"
  return _fused(x_BxQxD, w_DxV, bias, targets_BxQ, weights_BxQ, chunk, jnp.dtype(dtype).name, bool(native))

"""A Pallas GPU (Triton) flash attention with query and key segment ids and a two-sided local window.

Adapted from JAX's `jax.experimental.pallas.ops.gpu.attention` (`mha`: its forward kernel, and its
backward after the Triton fused-attention tutorial; jax 0.10.2), with these changes:
- separate query and key segment ids: query t sees key s iff q_seg[t] == kv_seg[s] (cross-attention,
  T != S; the caller gives pad keys an id no query has);
- an optional window by index, |t - s| <= half (splash's `LocalMask((T, S), (half, half), offset=0)`):
  the key loop of each query block, and the query loop of each key block in the dK/dV pass, runs
  only over the blocks that meet the window (`block_range`: `fori_loop` bounds from `program_id`),
  so a local layer does about (window + block) / S of a global one's work;
- masked probabilities are zeroed explicitly (as `attention_chunked`): a query that sees no key has
  normaliser 0 and outputs zeros, with zero gradients;
- the backward is two kernels (dK/dV over key blocks, dQ over query blocks) where the stock one is
  one fused kernel that needs T and S cut into the same number of blocks.
T and S must be multiples of the block sizes (the caller pads). Shape letters: B batch, T queries,
S keys, H heads, K head dim (padded to a power of 2 inside the kernels, as the stock kernel does).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

Array = jax.Array
# Masked scores: finite, so the running max never makes inf - inf (masked probabilities are zeroed).
_NEG = -1e30
_LOG2E = math.log2(math.e)  # Scores are taken base 2 (exp2), as the stock kernel does.


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Tile sizes (powers of 2, >= 16): forward query and key blocks, backward query and key blocks."""
  q: int = 64
  kv: int = 64
  q_bwd: int = 32
  kv_bwd: int = 32


def block_range(i, rows: int, cols: int, n_cols: int, half: int | None):
  """[lo, hi): the column blocks (`cols` wide, `n_cols` of them) that hold an index within `half` of
  row block i (`rows` tall); all of them when half is None. Works on traced i (a program id)."""
  if half is None:
    return 0, n_cols
  lo = lax.div(jnp.maximum(i * rows - half, 0), cols)
  hi = jnp.minimum(lax.div(i * rows + (rows - 1 + half), cols) + 1, n_cols)
  return lo, jnp.maximum(hi, lo)


def _mask(q_seg, kv_seg, q_start, kv_start, half):
  """Block mask: same segment and, with a window, |q index - kv index| <= half."""
  allowed = q_seg[:, None] == kv_seg[None, :]
  if half is not None:
    d = (q_start + jnp.arange(q_seg.shape[0]))[:, None] - (kv_start + jnp.arange(kv_seg.shape[0]))[None, :]
    allowed &= (d <= half) & (d >= -half)
  return allowed


def _fwd_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, o_ref, lse_ref, *, scale, half, block_kv, head_dim):
  block_q, kp = q_ref.shape
  i = pl.program_id(0)
  head_mask = (jnp.arange(kp) < head_dim)[None, :]
  q = plgpu.load(q_ref, mask=head_mask, other=0.0)
  q_seg = q_seg_ref[...]

  def body(j, carry):
    acc, m_prev, l_prev = carry
    ks = pl.ds(j * block_kv, block_kv)
    k = plgpu.load(k_ref.at[ks, :], mask=head_mask, other=0.0)
    allowed = _mask(q_seg, kv_seg_ref[ks], i * block_q, j * block_kv, half)
    s = jnp.where(allowed, plgpu.dot(q, k.T) * (scale * _LOG2E), _NEG)
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1))
    p = jnp.where(allowed, jnp.exp2(s - m_next[:, None]), 0.0)
    correction = jnp.exp2(m_prev - m_next)
    v = plgpu.load(v_ref.at[ks, :], mask=head_mask, other=0.0)
    acc = correction[:, None] * acc + plgpu.dot(p.astype(v.dtype), v)
    return acc, m_next, correction * l_prev + jnp.sum(p, axis=-1)

  lo, hi = block_range(i, block_q, block_kv, k_ref.shape[0] // block_kv, half)
  init = (jnp.zeros((block_q, kp), jnp.float32), jnp.full((block_q,), _NEG,
                                                          jnp.float32), jnp.zeros((block_q,), jnp.float32))
  acc, m, l = lax.fori_loop(lo, hi, body, init)
  has_key = l > 0.0
  l_safe = jnp.where(has_key, l, 1.0)
  lse_ref[...] = jnp.where(has_key, m + jnp.log2(l_safe), 0.0)
  plgpu.store(o_ref, (acc / l_safe[:, None]).astype(o_ref.dtype), mask=head_mask)


def _probs_and_ds(q, k, v, do, lse, delta, allowed, scale):
  """One tile of the backward: probabilities from the saved log-sum-exp, and dS (with the scale)."""
  s = plgpu.dot(q, k.T) * (scale * _LOG2E)
  p = jnp.where(allowed, jnp.exp2(s - lse[:, None]), 0.0)
  ds = p * (plgpu.dot(do, v.T) - delta[:, None]) * scale
  return p, ds


def _dkv_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, scale, half,
                block_q, head_dim):
  block_kv, kp = k_ref.shape
  j = pl.program_id(0)
  head_mask = (jnp.arange(kp) < head_dim)[None, :]
  k = plgpu.load(k_ref, mask=head_mask, other=0.0)
  v = plgpu.load(v_ref, mask=head_mask, other=0.0)
  kv_seg = kv_seg_ref[...]

  def body(i, carry):
    dk, dv = carry
    qs = pl.ds(i * block_q, block_q)
    q = plgpu.load(q_ref.at[qs, :], mask=head_mask, other=0.0)
    do = plgpu.load(do_ref.at[qs, :], mask=head_mask, other=0.0)
    allowed = _mask(q_seg_ref[qs], kv_seg, i * block_q, j * block_kv, half)
    p, ds = _probs_and_ds(q, k, v, do, lse_ref[qs], delta_ref[qs], allowed, scale)
    return dk + plgpu.dot(ds.astype(q.dtype).T, q), dv + plgpu.dot(p.astype(do.dtype).T, do)

  lo, hi = block_range(j, block_kv, block_q, q_ref.shape[0] // block_q, half)
  zeros = jnp.zeros((block_kv, kp), jnp.float32)
  dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
  plgpu.store(dk_ref, dk.astype(dk_ref.dtype), mask=head_mask)
  plgpu.store(dv_ref, dv.astype(dv_ref.dtype), mask=head_mask)


def _dq_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale, half, block_kv,
               head_dim):
  block_q, kp = q_ref.shape
  i = pl.program_id(0)
  head_mask = (jnp.arange(kp) < head_dim)[None, :]
  q = plgpu.load(q_ref, mask=head_mask, other=0.0)
  do = plgpu.load(do_ref, mask=head_mask, other=0.0)
  q_seg, lse, delta = q_seg_ref[...], lse_ref[...], delta_ref[...]

  def body(j, dq):
    ks = pl.ds(j * block_kv, block_kv)
    k = plgpu.load(k_ref.at[ks, :], mask=head_mask, other=0.0)
    v = plgpu.load(v_ref.at[ks, :], mask=head_mask, other=0.0)
    allowed = _mask(q_seg, kv_seg_ref[ks], i * block_q, j * block_kv, half)
    _, ds = _probs_and_ds(q, k, v, do, lse, delta, allowed, scale)
    return dq + plgpu.dot(ds.astype(k.dtype), k)

  lo, hi = block_range(i, block_q, block_kv, k_ref.shape[0] // block_kv, half)
  dq = lax.fori_loop(lo, hi, body, jnp.zeros((block_q, kp), jnp.float32))
  plgpu.store(dq_ref, dq.astype(dq_ref.dtype), mask=head_mask)


# BlockSpecs over a grid (blocks along a length, B, H): `tile` cuts that length, `whole` keeps it.
def _tile(n, kp):
  return pl.BlockSpec((None, n, None, kp), lambda i, b, h: (b, i, h, 0))


def _whole(n, kp):
  return pl.BlockSpec((None, n, None, kp), lambda i, b, h: (b, 0, h, 0))


def _seg(n, tiled):
  return pl.BlockSpec((None, n), (lambda i, b, h: (b, i)) if tiled else (lambda i, b, h: (b, 0)))


def _row(n, tiled):  # B x H x T statistics (log-sum-exp, delta).
  return pl.BlockSpec((None, None, n), (lambda i, b, h: (b, h, i)) if tiled else (lambda i, b, h: (b, h, 0)))


def _params(head_dim):
  return plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)


def _forward(q, k, v, q_seg, kv_seg, half, blocks, interpret):
  b, t, h, kd = q.shape
  s, kp = k.shape[1], pl.next_power_of_2(kd)
  bq, bkv = min(blocks.q, t), min(blocks.kv, s)
  kernel = functools.partial(_fwd_kernel, scale=kd ** -0.5, half=half, block_kv=bkv, head_dim=kd)
  return pl.pallas_call(kernel, grid=(t // bq, b, h),
                        in_specs=[_tile(bq, kp),
                                  _whole(s, kp),
                                  _whole(s, kp),
                                  _seg(bq, True),
                                  _seg(s, False)], out_specs=[_tile(bq, kp), _row(bq, True)],
                        out_shape=[q, jax.ShapeDtypeStruct((b, h, t), jnp.float32)], compiler_params=_params(kd),
                        interpret=interpret, name="window_mha_forward")(q, k, v, q_seg, kv_seg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attention(q, k, v, q_seg, kv_seg, half, blocks, interpret):
  return _forward(q, k, v, q_seg, kv_seg, half, blocks, interpret)[0]


def _attention_fwd(q, k, v, q_seg, kv_seg, half, blocks, interpret):
  out, lse = _forward(q, k, v, q_seg, kv_seg, half, blocks, interpret)
  return out, (q, k, v, q_seg, kv_seg, out, lse)


def _attention_bwd(half, blocks, interpret, residuals, do):
  q, k, v, q_seg, kv_seg, out, lse = residuals
  b, t, h, kd = q.shape
  s, kp = k.shape[1], pl.next_power_of_2(kd)
  bq, bkv = min(blocks.q_bwd, t), min(blocks.kv_bwd, s)
  # delta = rowsum(dO * O): the softmax Jacobian's correction, one number per query (BxHxT).
  delta = jnp.einsum("bthk,bthk->bht", do.astype(jnp.float32), out.astype(jnp.float32))
  args = (q, k, v, q_seg, kv_seg, do, lse, delta)
  common = dict(scale=kd ** -0.5, half=half, head_dim=kd)
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, block_q=bq, **common), grid=(s // bkv, b, h), in_specs=[
          _whole(t, kp),
          _tile(bkv, kp),
          _tile(bkv, kp),
          _seg(t, False),
          _seg(bkv, True),
          _whole(t, kp),
          _row(t, False),
          _row(t, False)], out_specs=[_tile(bkv, kp), _tile(bkv, kp)], out_shape=[k, v], compiler_params=_params(kd),
      interpret=interpret, name="window_mha_backward_dkv")(*args)
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, block_kv=bkv, **common), grid=(t // bq, b, h), in_specs=[
          _tile(bq, kp),
          _whole(s, kp),
          _whole(s, kp),
          _seg(bq, True),
          _seg(s, False),
          _tile(bq, kp),
          _row(bq, True),
          _row(bq, True)], out_specs=_tile(bq, kp), out_shape=jax.ShapeDtypeStruct(q.shape, jnp.float32),
      compiler_params=_params(kd), interpret=interpret, name="window_mha_backward_dq")(*args)
  return dq.astype(q.dtype), dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, q_seg_BxT: Array, kv_seg_BxS: Array, *,
                    window: int | None, blocks: Blocks = Blocks(), interpret: bool = False) -> Array:
  """softmax(q k^T / sqrt(K)) v where q_seg == kv_seg and (window) |t - s| <= window // 2; keyless rows 0."""
  half = None if window is None else window // 2
  t, s = q_BxTxHxK.shape[1], k_BxSxHxK.shape[1]
  for name, n, sizes in (("T", t, (blocks.q, blocks.q_bwd)), ("S", s, (blocks.kv, blocks.kv_bwd))):
    if any(n % min(size, n) for size in sizes):
      raise ValueError(f"{name}={n} must be a multiple of the block sizes {sizes}; pad it")
  return _attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, half, blocks, interpret)

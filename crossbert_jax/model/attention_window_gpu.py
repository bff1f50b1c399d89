"""A Pallas GPU (Triton) flash attention with query and key segment ids and a two-sided local window.

Adapted from JAX's `jax.experimental.pallas.ops.gpu.attention` (`mha`: its forward kernel, and its
backward after the Triton fused-attention tutorial; jax 0.10.2), with these changes:
- separate query and key segment ids: query t sees key s iff q_seg[t] == kv_seg[s] (cross-attention,
  T != S; the caller gives pad keys an id no query has);
- an optional window by position, |q_pos[t] - kv_pos[s]| <= half (positions default to the indices:
  splash's `LocalMask((T, S), (half, half), offset=0)`), so packed rows and CrossBERT's gathered
  visible tokens (which keep their original positions) are both exact;
- block skipping under the window: the key loop of each query block, and the query loop of each key
  block in the dK/dV pass, runs only over the blocks `window_bounds` gives it, [lo, hi) per row block
  and batch row, found by binary search on a sort key (segment, position) that is non-decreasing
  along a row wherever segments are numbered in order and positions rise within each (packed rows,
  gathered tokens); a row where it is not visits every block (still exact, no skipping). So a
  local layer does about (window + block) / S of a global one's work;
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


def sort_keys(seg_BxN: Array, pos_BxN: Array, stride: Array, pad_key: int) -> Array:
  """B x N int32 keys, segment * stride + position (pads: `pad_key`): with stride above every position
  plus the window, two tokens are within the window of one another and of one segment iff their keys
  differ by at most half."""
  return jnp.where(seg_BxN > 0, seg_BxN * stride + pos_BxN, pad_key)


def window_bounds(row_key_BxR: Array, col_key_BxC: Array, half: int | None, rows: int, cols: int):
  """(lo, hi), each B x (R / rows) int32: the column blocks (`cols` wide) that hold a column whose key is
  within `half` of a key in row block i, [lo, hi); every block without a window, or in a batch row
  whose column keys are not non-decreasing (the binary search needs them sorted)."""
  b, r = row_key_BxR.shape
  n_rows, n_cols = r // rows, col_key_BxC.shape[1] // cols
  if half is None:
    return jnp.zeros((b, n_rows), jnp.int32), jnp.full((b, n_rows), n_cols, jnp.int32)
  search = jax.vmap(lambda keys, x, side: jnp.searchsorted(keys, x, side=side), in_axes=(0, 0, None))
  first = search(col_key_BxC, row_key_BxR - half, "left").reshape(b, n_rows, rows).min(axis=-1)
  last = search(col_key_BxC, row_key_BxR + half, "right").reshape(b, n_rows, rows).max(axis=-1)  # Exclusive.
  lo, hi = first // cols, -(-last // cols)
  sorted_B1 = jnp.all(jnp.diff(col_key_BxC, axis=1) >= 0, axis=1)[:, None]
  lo = jnp.where(sorted_B1, lo, 0)
  hi = jnp.where(sorted_B1, jnp.maximum(hi, lo), n_cols)
  return lo.astype(jnp.int32), hi.astype(jnp.int32)


def _mask(q_seg, kv_seg, q_pos, kv_pos, half):
  """Block mask: same segment and, with a window, |q position - kv position| <= half."""
  allowed = q_seg[:, None] == kv_seg[None, :]
  if half is not None:
    d = q_pos[:, None] - kv_pos[None, :]
    allowed &= (d <= half) & (d >= -half)
  return allowed


def _fwd_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, q_pos_ref, kv_pos_ref, lo_ref, hi_ref, o_ref, lse_ref, *,
                scale, half, block_kv, head_dim):
  block_q, kp = q_ref.shape
  head_mask = (jnp.arange(kp) < head_dim)[None, :]
  q = plgpu.load(q_ref, mask=head_mask, other=0.0)
  q_seg, q_pos = q_seg_ref[...], q_pos_ref[...]

  def body(j, carry):
    acc, m_prev, l_prev = carry
    ks = pl.ds(j * block_kv, block_kv)
    k = plgpu.load(k_ref.at[ks, :], mask=head_mask, other=0.0)
    allowed = _mask(q_seg, kv_seg_ref[ks], q_pos, kv_pos_ref[ks], half)
    s = jnp.where(allowed, plgpu.dot(q, k.T) * (scale * _LOG2E), _NEG)
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1))
    p = jnp.where(allowed, jnp.exp2(s - m_next[:, None]), 0.0)
    correction = jnp.exp2(m_prev - m_next)
    v = plgpu.load(v_ref.at[ks, :], mask=head_mask, other=0.0)
    acc = correction[:, None] * acc + plgpu.dot(p.astype(v.dtype), v)
    return acc, m_next, correction * l_prev + jnp.sum(p, axis=-1)

  init = (jnp.zeros((block_q, kp), jnp.float32), jnp.full((block_q,), _NEG,
                                                          jnp.float32), jnp.zeros((block_q,), jnp.float32))
  acc, m, l = lax.fori_loop(lo_ref[0], hi_ref[0], body, init)
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


def _dkv_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, q_pos_ref, kv_pos_ref, lo_ref, hi_ref, do_ref, lse_ref,
                delta_ref, dk_ref, dv_ref, *, scale, half, block_q, head_dim):
  block_kv, kp = k_ref.shape
  head_mask = (jnp.arange(kp) < head_dim)[None, :]
  k = plgpu.load(k_ref, mask=head_mask, other=0.0)
  v = plgpu.load(v_ref, mask=head_mask, other=0.0)
  kv_seg, kv_pos = kv_seg_ref[...], kv_pos_ref[...]

  def body(i, carry):
    dk, dv = carry
    qs = pl.ds(i * block_q, block_q)
    q = plgpu.load(q_ref.at[qs, :], mask=head_mask, other=0.0)
    do = plgpu.load(do_ref.at[qs, :], mask=head_mask, other=0.0)
    allowed = _mask(q_seg_ref[qs], kv_seg, q_pos_ref[qs], kv_pos, half)
    p, ds = _probs_and_ds(q, k, v, do, lse_ref[qs], delta_ref[qs], allowed, scale)
    return dk + plgpu.dot(ds.astype(q.dtype).T, q), dv + plgpu.dot(p.astype(do.dtype).T, do)

  zeros = jnp.zeros((block_kv, kp), jnp.float32)
  dk, dv = lax.fori_loop(lo_ref[0], hi_ref[0], body, (zeros, zeros))
  plgpu.store(dk_ref, dk.astype(dk_ref.dtype), mask=head_mask)
  plgpu.store(dv_ref, dv.astype(dv_ref.dtype), mask=head_mask)


def _dq_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, q_pos_ref, kv_pos_ref, lo_ref, hi_ref, do_ref, lse_ref,
               delta_ref, dq_ref, *, scale, half, block_kv, head_dim):
  block_q, kp = q_ref.shape
  head_mask = (jnp.arange(kp) < head_dim)[None, :]
  q = plgpu.load(q_ref, mask=head_mask, other=0.0)
  do = plgpu.load(do_ref, mask=head_mask, other=0.0)
  q_seg, q_pos, lse, delta = q_seg_ref[...], q_pos_ref[...], lse_ref[...], delta_ref[...]

  def body(j, dq):
    ks = pl.ds(j * block_kv, block_kv)
    k = plgpu.load(k_ref.at[ks, :], mask=head_mask, other=0.0)
    v = plgpu.load(v_ref.at[ks, :], mask=head_mask, other=0.0)
    allowed = _mask(q_seg, kv_seg_ref[ks], q_pos, kv_pos_ref[ks], half)
    _, ds = _probs_and_ds(q, k, v, do, lse, delta, allowed, scale)
    return dq + plgpu.dot(ds.astype(k.dtype), k)

  dq = lax.fori_loop(lo_ref[0], hi_ref[0], body, jnp.zeros((block_q, kp), jnp.float32))
  plgpu.store(dq_ref, dq.astype(dq_ref.dtype), mask=head_mask)


# BlockSpecs over a grid (blocks along a length, B, H): `tile` cuts that length, `whole` keeps it.
def _tile(n, kp):
  return pl.BlockSpec((None, n, None, kp), lambda i, b, h: (b, i, h, 0))


def _whole(n, kp):
  return pl.BlockSpec((None, n, None, kp), lambda i, b, h: (b, 0, h, 0))


def _seg(n, tiled):  # B x T integers: segment ids, positions.
  return pl.BlockSpec((None, n), (lambda i, b, h: (b, i)) if tiled else (lambda i, b, h: (b, 0)))


def _bound():  # B x blocks: one row block's loop bound.
  return pl.BlockSpec((None, 1), lambda i, b, h: (b, i))


def _row(n, tiled):  # B x H x T statistics (log-sum-exp, delta).
  return pl.BlockSpec((None, None, n), (lambda i, b, h: (b, h, i)) if tiled else (lambda i, b, h: (b, h, 0)))


def _query_tiled(bq: int, s: int, kp: int) -> list[pl.BlockSpec]:
  """Specs of (q, k, v, q_seg, kv_seg, q_pos, kv_pos, lo, hi) over a grid of query blocks: the forward's, dQ's."""
  return [
      _tile(bq, kp),
      _whole(s, kp),
      _whole(s, kp),
      _seg(bq, True),
      _seg(s, False),
      _seg(bq, True),
      _seg(s, False),
      _bound(),
      _bound()]


def _key_tiled(t: int, bkv: int, kp: int) -> list[pl.BlockSpec]:
  """Specs of (q, k, v, q_seg, kv_seg, q_pos, kv_pos, lo, hi) over a grid of key blocks: dK/dV's."""
  return [
      _whole(t, kp),
      _tile(bkv, kp),
      _tile(bkv, kp),
      _seg(t, False),
      _seg(bkv, True),
      _seg(t, False),
      _seg(bkv, True),
      _bound(),
      _bound()]


def _params(head_dim):
  return plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)


def window_keys(q_seg, kv_seg, q_pos, kv_pos, half):
  """The queries' and keys' sort keys (`sort_keys`): pad queries and pad keys far from every real token
  and from each other, so their blocks visit nothing they do not need. No window: the segment ids
  (`window_bounds` then reads only their shapes)."""
  if half is None:
    return q_seg, kv_seg
  stride = jnp.maximum(jnp.max(q_pos), jnp.max(kv_pos)) + 2 * half + 2
  big = jnp.iinfo(jnp.int32).max // 2
  return sort_keys(q_seg, q_pos, stride, big), sort_keys(kv_seg, kv_pos, stride, big + 2 * half + 2)


def _forward(q, k, v, q_seg, kv_seg, q_pos, kv_pos, half, blocks, interpret):
  b, t, h, kd = q.shape
  s, kp = k.shape[1], pl.next_power_of_2(kd)
  bq, bkv = min(blocks.q, t), min(blocks.kv, s)
  q_key, kv_key = window_keys(q_seg, kv_seg, q_pos, kv_pos, half)
  lo, hi = window_bounds(q_key, kv_key, half, bq, bkv)
  kernel = functools.partial(_fwd_kernel, scale=kd ** -0.5, half=half, block_kv=bkv, head_dim=kd)
  return pl.pallas_call(kernel, grid=(t // bq, b, h), in_specs=_query_tiled(bq, s, kp),
                        out_specs=[_tile(bq, kp),
                                   _row(bq, True)], out_shape=[q, jax.ShapeDtypeStruct(
                                       (b, h, t), jnp.float32)], compiler_params=_params(kd), interpret=interpret,
                        name="window_mha_forward")(q, k, v, q_seg, kv_seg, q_pos, kv_pos, lo, hi)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _attention(q, k, v, q_seg, kv_seg, q_pos, kv_pos, half, blocks, interpret):
  return _forward(q, k, v, q_seg, kv_seg, q_pos, kv_pos, half, blocks, interpret)[0]


def _attention_fwd(q, k, v, q_seg, kv_seg, q_pos, kv_pos, half, blocks, interpret):
  out, lse = _forward(q, k, v, q_seg, kv_seg, q_pos, kv_pos, half, blocks, interpret)
  return out, (q, k, v, q_seg, kv_seg, q_pos, kv_pos, out, lse)


def _attention_bwd(half, blocks, interpret, residuals, do):
  q, k, v, q_seg, kv_seg, q_pos, kv_pos, out, lse = residuals
  b, t, h, kd = q.shape
  s, kp = k.shape[1], pl.next_power_of_2(kd)
  bq, bkv = min(blocks.q_bwd, t), min(blocks.kv_bwd, s)
  q_key, kv_key = window_keys(q_seg, kv_seg, q_pos, kv_pos, half)
  kv_lo, kv_hi = window_bounds(kv_key, q_key, half, bkv, bq)  # Each key block's query blocks.
  q_lo, q_hi = window_bounds(q_key, kv_key, half, bq, bkv)  # Each query block's key blocks.
  # delta = rowsum(dO * O): the softmax Jacobian's correction, one number per query (BxHxT).
  delta = jnp.einsum("bthk,bthk->bht", do.astype(jnp.float32), out.astype(jnp.float32))
  common = dict(scale=kd ** -0.5, half=half, head_dim=kd)
  dk, dv = pl.pallas_call(functools.partial(_dkv_kernel, block_q=bq,
                                            **common), grid=(s // bkv, b, h), in_specs=_key_tiled(t, bkv, kp) +
                          [_whole(t, kp), _row(t, False), _row(t, False)], out_specs=[_tile(bkv, kp),
                                                                                      _tile(bkv, kp)], out_shape=[k, v],
                          compiler_params=_params(kd), interpret=interpret,
                          name="window_mha_backward_dkv")(q, k, v, q_seg, kv_seg, q_pos, kv_pos, kv_lo, kv_hi, do, lse,
                                                          delta)
  dq = pl.pallas_call(functools.partial(_dq_kernel, block_kv=bkv,
                                        **common), grid=(t // bq, b, h), in_specs=_query_tiled(bq, s, kp) +
                      [_tile(bq, kp), _row(bq, True), _row(bq, True)], out_specs=_tile(bq, kp),
                      out_shape=jax.ShapeDtypeStruct(q.shape, jnp.float32), compiler_params=_params(kd),
                      interpret=interpret, name="window_mha_backward_dq")(q, k, v, q_seg, kv_seg, q_pos, kv_pos, q_lo,
                                                                          q_hi, do, lse, delta)
  return dq.astype(q.dtype), dk, dv, None, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, q_seg_BxT: Array, kv_seg_BxS: Array, *,
                    window: int | None, q_pos_BxT: Array | None = None, kv_pos_BxS: Array | None = None,
                    blocks: Blocks = Blocks(), interpret: bool = False) -> Array:
  """softmax(q k^T / sqrt(K)) v where q_seg == kv_seg and (window) |q_pos - kv_pos| <= window // 2 (positions
  default to the indices); keyless rows 0."""
  half = None if window is None else window // 2
  b, t, s = q_BxTxHxK.shape[0], q_BxTxHxK.shape[1], k_BxSxHxK.shape[1]
  for name, n, sizes in (("T", t, (blocks.q, blocks.q_bwd)), ("S", s, (blocks.kv, blocks.kv_bwd))):
    if any(n % min(size, n) for size in sizes):
      raise ValueError(f"{name}={n} must be a multiple of the block sizes {sizes}; pad it")
  index = lambda n: jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  q_pos = index(t) if q_pos_BxT is None else q_pos_BxT.astype(jnp.int32)
  kv_pos = index(s) if kv_pos_BxS is None else kv_pos_BxS.astype(jnp.int32)
  return _attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos, kv_pos, half, blocks, interpret)

"""Blocked online-softmax attention in plain XLA, with the flash backward (any backend).

A `lax.scan` over key blocks keeps a running max, normaliser and weighted sum per query, so the
forward never holds more than one BxHxTxC block of scores; the backward (a custom VJP) recomputes
each block's probabilities from the saved log-sum-exp, so it never holds more either (FlashAttention-2,
arXiv 2307.08691, Algorithm 2, in XLA). The mask is `attention.mask`'s. Shape letters: B batch,
T queries, S keys, N key blocks, C keys per block, H heads, K head dim.
"""

import functools

import jax
import jax.numpy as jnp

Array = jax.Array
# Masked scores: finite, so running-max arithmetic never makes inf - inf; probabilities of masked
# keys are zeroed explicitly, so a query with no key accumulates nothing (and outputs zeros).
_NEG = -1e30


def _block_mask(q_seg_BxT, q_pos_BxT, kv_seg_BxC, kv_pos_BxC, window):
  allowed_BxTxC = (q_seg_BxT[:, :, None] == kv_seg_BxC[:, None, :]) & (kv_seg_BxC[:, None, :] > 0)
  if window is not None:
    allowed_BxTxC &= jnp.abs(q_pos_BxT[:, :, None] - kv_pos_BxC[:, None, :]) <= window // 2
  return allowed_BxTxC[:, None]  # Bx1xTxC: shared by the heads.


def _to_blocks(x_BxSx, block: int, fill):
  """BxS... -> NxBxC... (S padded to N*C with `fill`)."""
  b, s = x_BxSx.shape[:2]
  n = -(-s // block)
  pad = [(0, 0), (0, n * block - s)] + [(0, 0)] * (x_BxSx.ndim - 2)
  x = jnp.pad(x_BxSx, pad, constant_values=fill)
  return jnp.moveaxis(x.reshape((b, n, block) + x_BxSx.shape[2:]), 1, 0)


def _scores(q_BxHxTxK, k_BxCxHxK):
  return jnp.einsum("bhtk,bchk->bhtc", q_BxHxTxK, k_BxCxHxK, preferred_element_type=jnp.float32)


def _forward(q_BxHxTxK, k_blocks, v_blocks, q_seg_BxT, q_pos_BxT, seg_blocks, pos_blocks, window):
  """Scaled queries -> (float32 output BxHxTxK, log-sum-exp BxHxT, has-key BxHxT)."""
  b, h, t, k = q_BxHxTxK.shape

  def body(carry, xs):
    m_BxHxT, l_BxHxT, acc_BxHxTxK = carry
    k_BxCxHxK, v_BxCxHxK, seg_BxC, pos_BxC = xs
    allowed = _block_mask(q_seg_BxT, q_pos_BxT, seg_BxC, pos_BxC, window)
    s_BxHxTxC = jnp.where(allowed, _scores(q_BxHxTxK, k_BxCxHxK), _NEG)
    m_new = jnp.maximum(m_BxHxT, jnp.max(s_BxHxTxC, axis=-1))
    p_BxHxTxC = jnp.where(allowed, jnp.exp(s_BxHxTxC - m_new[..., None]), 0.0)
    alpha_BxHxT = jnp.exp(m_BxHxT - m_new)
    l_BxHxT = alpha_BxHxT * l_BxHxT + jnp.sum(p_BxHxTxC, axis=-1)
    pv_BxHxTxK = jnp.einsum("bhtc,bchk->bhtk", p_BxHxTxC.astype(v_BxCxHxK.dtype), v_BxCxHxK,
                            preferred_element_type=jnp.float32)
    return (m_new, l_BxHxT, alpha_BxHxT[..., None] * acc_BxHxTxK + pv_BxHxTxK), None

  init = (jnp.full((b, h, t), _NEG, jnp.float32), jnp.zeros((b, h, t), jnp.float32), jnp.zeros((b, h, t, k),
                                                                                               jnp.float32))
  (m_BxHxT, l_BxHxT, acc_BxHxTxK), _ = jax.lax.scan(body, init, (k_blocks, v_blocks, seg_blocks, pos_blocks))
  has_key_BxHxT = l_BxHxT > 0.0
  l_safe = jnp.where(has_key_BxHxT, l_BxHxT, 1.0)
  out_BxHxTxK = acc_BxHxTxK / l_safe[..., None]
  lse_BxHxT = jnp.where(has_key_BxHxT, m_BxHxT + jnp.log(l_safe), 0.0)
  return out_BxHxTxK, lse_BxHxT


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _flash(q, k, v, q_seg, kv_seg, q_pos, kv_pos, window, block_kv):
  return _flash_fwd(q, k, v, q_seg, kv_seg, q_pos, kv_pos, window, block_kv)[0]


def _prepare(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, kv_seg_BxS, kv_pos_BxS, block_kv):
  scale = q_BxTxHxK.shape[-1] ** -0.5
  q_BxHxTxK = jnp.swapaxes(q_BxTxHxK * jnp.asarray(scale, q_BxTxHxK.dtype), 1, 2)
  blocks = (_to_blocks(k_BxSxHxK, block_kv, 0), _to_blocks(v_BxSxHxK, block_kv,
                                                           0), _to_blocks(kv_seg_BxS, block_kv,
                                                                          0), _to_blocks(kv_pos_BxS, block_kv, 0))
  return scale, q_BxHxTxK, blocks


def _flash_fwd(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS, window, block_kv):
  _, q_BxHxTxK, blocks = _prepare(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, kv_seg_BxS, kv_pos_BxS, block_kv)
  out_BxHxTxK, lse_BxHxT = _forward(q_BxHxTxK, blocks[0], blocks[1], q_seg_BxT, q_pos_BxT, blocks[2], blocks[3], window)
  out_BxTxHxK = jnp.swapaxes(out_BxHxTxK, 1, 2).astype(q_BxTxHxK.dtype)
  residuals = (q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS, out_BxTxHxK, lse_BxHxT)
  return out_BxTxHxK, residuals


def _flash_bwd(window, block_kv, residuals, dout_BxTxHxK):
  q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS, out, lse_BxHxT = residuals
  s_len = k_BxSxHxK.shape[1]
  scale, q_BxHxTxK, blocks = _prepare(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, kv_seg_BxS, kv_pos_BxS, block_kv)
  do_BxHxTxK = jnp.swapaxes(dout_BxTxHxK, 1, 2)
  # delta = rowsum(dO * O): the softmax Jacobian's correction term, one number per query.
  delta_BxHxT = jnp.einsum("bthk,bthk->bht", dout_BxTxHxK.astype(jnp.float32), out.astype(jnp.float32))

  def body(dq_BxHxTxK, xs):
    k_BxCxHxK, v_BxCxHxK, seg_BxC, pos_BxC = xs
    allowed = _block_mask(q_seg_BxT, q_pos_BxT, seg_BxC, pos_BxC, window)
    s_BxHxTxC = _scores(q_BxHxTxK, k_BxCxHxK)
    p_BxHxTxC = jnp.where(allowed, jnp.exp(s_BxHxTxC - lse_BxHxT[..., None]), 0.0)
    dv_BxCxHxK = jnp.einsum("bhtc,bhtk->bchk", p_BxHxTxC.astype(do_BxHxTxK.dtype), do_BxHxTxK,
                            preferred_element_type=jnp.float32)
    dp_BxHxTxC = jnp.einsum("bhtk,bchk->bhtc", do_BxHxTxK, v_BxCxHxK, preferred_element_type=jnp.float32)
    ds_BxHxTxC = (p_BxHxTxC * (dp_BxHxTxC - delta_BxHxT[..., None])).astype(q_BxHxTxK.dtype)
    dq_BxHxTxK = dq_BxHxTxK + jnp.einsum("bhtc,bchk->bhtk", ds_BxHxTxC, k_BxCxHxK, preferred_element_type=jnp.float32)
    dk_BxCxHxK = jnp.einsum("bhtc,bhtk->bchk", ds_BxHxTxC, q_BxHxTxK, preferred_element_type=jnp.float32)
    return dq_BxHxTxK, (dk_BxCxHxK, dv_BxCxHxK)

  dq_BxHxTxK, (dk_NxBxCxHxK, dv_NxBxCxHxK) = jax.lax.scan(body, jnp.zeros(q_BxHxTxK.shape, jnp.float32), blocks)
  unblock = lambda x: jnp.moveaxis(x, 0, 1).reshape((x.shape[1], -1) + x.shape[3:])[:, :s_len]
  dq = (jnp.swapaxes(dq_BxHxTxK, 1, 2) * scale).astype(q_BxTxHxK.dtype)
  return (dq, unblock(dk_NxBxCxHxK).astype(k_BxSxHxK.dtype), unblock(dv_NxBxCxHxK).astype(v_BxSxHxK.dtype), None, None,
          None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def chunked_attention(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, q_seg_BxT: Array, kv_seg_BxS: Array,
                      q_pos_BxT: Array | None, kv_pos_BxS: Array | None, *, window: int | None, block_kv: int) -> Array:
  """`attention.dense` semantics, one key block of scores at a time (forward and backward)."""
  if q_pos_BxT is None:  # No window: positions are never read; zeros keep one code path.
    q_pos_BxT, kv_pos_BxS = jnp.zeros_like(q_seg_BxT), jnp.zeros_like(kv_seg_BxS)
  block = min(block_kv, k_BxSxHxK.shape[1])
  return _flash(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS, window, block)

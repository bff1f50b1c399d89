"""The fused kernels behind `attention`: TPU splash (Pallas) and the Pallas GPU flash kernel.

Both run in Pallas interpret mode when `AttentionSpec.interpret` is set (the CPU tests).
How `attention.mask` maps onto each:
- segments: the kernels mask q_seg == kv_seg. Padding keys get segment -1 so that no query (pads
  have segment 0) matches them; a query that then sees nothing gets the kernel's uniform average,
  so its output is zeroed by `has_key` (as the dense reference does).
- local window: splash's LocalMask is by index, the reference by position id. They agree exactly
  when, in every segment, position - index is one constant (packed documents on the full
  sequence); that is checked on device and the chunked kernel runs otherwise (the gathered
  visible tokens of CrossBERT's encoder).
- gpu_flash: global self-attention runs JAX's stock Pallas GPU kernel (one segment-id array; pad
  queries match pad keys there and are zeroed); cross-attention and local windows run
  `attention_window_gpu` (query and key segment ids, a window by position that skips the key
  blocks outside it), exact on packed rows and gathered tokens alike: no position check.
Shape letters: B batch, T queries, S keys, H heads, K head dim.
"""

import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.model import attention_chunked

Array = jax.Array
_warned: set[str] = set()


def warn_once(message: str) -> None:
  if message not in _warned:
    _warned.add(message)
    logging.warning("attention: %s", message)


def target_platform() -> str:
  """The platform being compiled for: the mesh's devices (a TPU topology on a CPU host), else jax's."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  return device.platform if device is not None else jax.default_backend()


def has_key(q_seg_BxT: Array, kv_seg_BxS: Array) -> Array:
  """BxT bool: the query's segment is non-pad and has at least one key (O(S log S), no BxTxS)."""
  kv_sorted_BxS = jnp.sort(jnp.where(kv_seg_BxS > 0, kv_seg_BxS, -1), axis=-1)
  idx_BxT = jax.vmap(jnp.searchsorted)(kv_sorted_BxS, q_seg_BxT)
  found_BxT = jnp.take_along_axis(kv_sorted_BxS, jnp.minimum(idx_BxT, kv_seg_BxS.shape[1] - 1), axis=1)
  return (found_BxT == q_seg_BxT) & (q_seg_BxT > 0)


def positions_follow_indices(q_seg_BxT: Array, q_pos_BxT: Array, kv_seg_BxS: Array, kv_pos_BxS: Array) -> Array:
  """Scalar bool: in every non-pad segment, position - index is one constant over q and kv."""
  t, s = q_seg_BxT.shape[1], kv_seg_BxS.shape[1]
  seg_BxN = jnp.concatenate([q_seg_BxT, kv_seg_BxS], axis=1)
  off_BxN = jnp.concatenate([q_pos_BxT - jnp.arange(t)[None], kv_pos_BxS - jnp.arange(s)[None]], axis=1)
  n = t + s + 1
  real_BxN = seg_BxN > 0
  ids_BxN = jnp.where(real_BxN & (seg_BxN < n), seg_BxN, 0)
  big = jnp.iinfo(jnp.int32).max

  def row(ids_N, off_N, real_N):
    hi = jax.ops.segment_max(jnp.where(real_N, off_N, -big), ids_N, n)
    lo = jax.ops.segment_min(jnp.where(real_N, off_N, big), ids_N, n)
    return jnp.all(~real_N | (hi[ids_N] == lo[ids_N]))

  return jnp.all(seg_BxN < n) & jnp.all(jax.vmap(row)(ids_BxN, off_BxN, real_BxN))


def _pad_to(x, length: int, fill):
  pad = [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
  return jnp.pad(x, pad, constant_values=fill)


def _splash_kernel(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, q_seg_BxT, kv_seg_BxS, *, window, block_q, block_kv, interpret):
  """One shard: builds the kernel for the local head count and maps it over the local batch."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  h, t, s = q_BxHxTxK.shape[1], q_BxHxTxK.shape[2], k_BxHxSxK.shape[2]
  head_mask = (sm.FullMask((t, s)) if window is None else sm.LocalMask((t, s), (window // 2, window // 2), offset=0))
  sizes = sk.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv, block_q_dkv=block_q,
                        block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv, block_q_dq=block_q, block_kv_dq=block_kv)
  kernel = sk.make_splash_mha(sm.MultiHeadMask([head_mask] * h), block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              interpret=interpret)
  one = lambda q, k, v, qs, ks: kernel(q, k, v, segment_ids=sk.SegmentIds(q=qs, kv=ks))
  return jax.vmap(one)(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, q_seg_BxT, kv_seg_BxS)


def _sharded(fn, qkv_axes: tuple[str | None, ...], *args):
  """`fn(q, k, v, *rows)` over batch and heads under shard_map on the context mesh (logical rules give
  the specs); `rows`: B x length integers (segment ids, positions), split over the batch only."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return fn(*args)
  # The model's logical names through the active rules (nn.logical_axis_rules): this module
  # never names a mesh axis. Lengths and head dims stay whole inside each shard.
  qkv_spec = nn.logical_to_mesh_axes(qkv_axes)
  seg_spec = nn.logical_to_mesh_axes(("batch", None))
  return jax.shard_map(fn, in_specs=(qkv_spec,) * 3 + (seg_spec,) * (len(args) - 3), out_specs=qkv_spec,
                       check_vma=False)(*args)


def splash_attention(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, q_seg_BxT: Array, kv_seg_BxS: Array,
                     q_pos_BxT: Array | None, kv_pos_BxS: Array | None, *, window: int | None, block_q: int,
                     block_kv: int, interpret: bool) -> Array:
  """`attention.dense` semantics through the TPU splash kernel, sharded over batch and heads."""
  b, t, h, k = q_BxTxHxK.shape
  s = k_BxSxHxK.shape[1]
  # TPU tiles are multiples of 128 lanes; lengths are padded to a multiple of the block.
  bq, bkv = _round_up(min(block_q, t), 128), _round_up(min(block_kv, s), 128)
  tp, sp = _round_up(t, bq), _round_up(s, bkv)
  scale = jnp.asarray(k ** -0.5, q_BxTxHxK.dtype)
  heads_first = lambda x, n: jnp.swapaxes(_pad_to(x, n, 0), 1, 2)
  q = heads_first(q_BxTxHxK * scale, tp)
  kk, v = heads_first(k_BxSxHxK, sp), heads_first(v_BxSxHxK, sp)
  q_seg = _pad_to(q_seg_BxT, tp, 0)
  kv_seg = _pad_to(jnp.where(kv_seg_BxS > 0, kv_seg_BxS, -1), sp, -1)

  def run(win):
    fn = functools.partial(_splash_kernel, window=win, block_q=bq, block_kv=bkv, interpret=interpret)
    return _sharded(fn, ("batch", "heads", None, None), q, kk, v, q_seg, kv_seg)

  if window is None:
    out_BxHxTxK = run(None)
  else:
    fallback = lambda: jnp.swapaxes(
        _pad_to(
            attention_chunked.chunked_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT,
                                                kv_pos_BxS, window=window, block_kv=block_kv), tp, 0), 1, 2)
    exact = positions_follow_indices(q_seg_BxT, q_pos_BxT, kv_seg_BxS, kv_pos_BxS)
    out_BxHxTxK = jax.lax.cond(exact, lambda: run(window), fallback)
  out_BxTxHxK = jnp.swapaxes(out_BxHxTxK, 1, 2)[:, :t]
  return out_BxTxHxK * has_key(q_seg_BxT, kv_seg_BxS)[:, :, None, None].astype(out_BxTxHxK.dtype)


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _gpu_block(block: int, n: int, cap: int) -> int:
  """A Triton tile along a length of n: a power of 2 in [16, cap], at most `block`, no bigger than n needs."""
  return max(16, min(1 << (max(block, 1).bit_length() - 1), cap, 1 << max(n - 1, 1).bit_length()))


def gpu_flash_attention(q_BxTxHxK: Array, k_BxSxHxK: Array, v_BxSxHxK: Array, q_seg_BxT: Array, kv_seg_BxS: Array,
                        q_pos_BxT: Array | None, kv_pos_BxS: Array | None, *, window: int | None, shared_segments: bool,
                        block_q: int, block_kv: int, interpret: bool) -> Array:
  """`attention.dense` semantics through the Pallas GPU flash kernels."""
  if window is not None or not shared_segments:
    return _gpu_window_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS,
                                 window=window, block_q=block_q, block_kv=block_kv, interpret=interpret)
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention
  b, t, h, k = q_BxTxHxK.shape
  # The Triton kernel's tiles: up to 128 rows, at least 16; the length is padded to a multiple.
  blk = max(16, min(block_q, block_kv, 128, 1 << max(t - 1, 1).bit_length()))
  tp = _round_up(t, blk)
  sizes = gpu_attention.BlockSizes(block_q=blk, block_k=blk, block_q_dkv=min(blk, 32), block_kv_dkv=min(blk, 32),
                                   block_q_dq=min(blk, 32), block_kv_dq=min(blk, 32))
  pad = lambda x: _pad_to(x, tp, 0)
  mha = functools.partial(gpu_attention.mha, sm_scale=k ** -0.5, block_sizes=sizes, interpret=interpret)
  fn = lambda q, kk, v, seg, _: mha(q, kk, v, seg)
  # Shared segment ids: pad queries (segment 0) see pad keys; their output is zeroed below.
  seg = pad(q_seg_BxT)
  out_BxTxHxK = _sharded(fn, ("batch", None, "heads", None), pad(q_BxTxHxK), pad(k_BxSxHxK), pad(v_BxSxHxK), seg,
                         seg)[:, :t]
  return out_BxTxHxK * (q_seg_BxT > 0)[:, :, None, None].astype(out_BxTxHxK.dtype)


def _gpu_window_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_seg_BxT, kv_seg_BxS, q_pos_BxT, kv_pos_BxS, *, window,
                          block_q, block_kv, interpret):
  """Cross-attention and local windows through `attention_window_gpu` (a window by position: exact on
  packed rows and on CrossBERT's gathered tokens alike, skipping the key blocks outside it)."""
  from crossbert_jax.model import attention_window_gpu
  t, s = q_BxTxHxK.shape[1], k_BxSxHxK.shape[1]
  # Tiles of up to 128 (64 under a window: a query block then visits (window + 64) / S of the keys).
  cap = 128 if window is None else 64
  bq, bkv = _gpu_block(block_q, t, cap), _gpu_block(block_kv, s, cap)
  blocks = attention_window_gpu.Blocks(q=bq, kv=bkv, q_bwd=min(bq, 32), kv_bwd=min(bkv, 32))
  tp, sp = _round_up(t, bq), _round_up(s, bkv)
  q, kk, v = _pad_to(q_BxTxHxK, tp, 0), _pad_to(k_BxSxHxK, sp, 0), _pad_to(v_BxSxHxK, sp, 0)
  # Pad queries have segment 0, pad keys -1: no query sees a pad key, and a keyless query outputs 0.
  q_seg = _pad_to(q_seg_BxT, tp, 0)
  kv_seg = _pad_to(jnp.where(kv_seg_BxS > 0, kv_seg_BxS, -1), sp, -1)
  if window is None:
    fn = functools.partial(attention_window_gpu.flash_attention, window=None, blocks=blocks, interpret=interpret)
    return _sharded(fn, ("batch", None, "heads", None), q, kk, v, q_seg, kv_seg)[:, :t]
  q_pos, kv_pos = _pad_to(q_pos_BxT, tp, 0), _pad_to(kv_pos_BxS, sp, 0)

  def fn(q, kk, v, q_seg, kv_seg, q_pos, kv_pos):
    return attention_window_gpu.flash_attention(q, kk, v, q_seg, kv_seg, window=window, q_pos_BxT=q_pos,
                                                kv_pos_BxS=kv_pos, blocks=blocks, interpret=interpret)

  return _sharded(fn, ("batch", None, "heads", None), q, kk, v, q_seg, kv_seg, q_pos, kv_pos)[:, :t]

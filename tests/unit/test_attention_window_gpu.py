"""The Pallas GPU window kernel (`attention_window_gpu`, Pallas interpret mode on CPU).

Its loop bounds against the mask they must cover (no block with a visible entry skipped, every
block wholly outside the window skipped, and the fraction visited at ModernBERT's window; by index
and on CrossBERT's gathered tokens), the
kernel against the dense reference (windowed cross-attention with distinct query and key segments,
pads and a keyless query segment; forward and gradients), and that the kernels never read a block
outside the window (NaNs there would reach the output). `test_attention.py` checks `gpu_flash`
through `attention.attention` with the other backends.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crossbert_jax.model import attention as attn
from crossbert_jax.model import attention_kernels
from crossbert_jax.model import attention_window_gpu as wgpu
from tests.unit.test_attention import _qkv, _run  # Inputs and <out, dout>'s gradients, as there.

H, K = 2, 16
SMALL = wgpu.Blocks(q=16, kv=16, q_bwd=16, kv_bwd=16)


def _blocks_visited(row_key: np.ndarray, col_key: np.ndarray, rows: int, cols: int, half: int | None) -> np.ndarray:
  """B x row blocks x column blocks bool: the column blocks each row block's loop runs over (`window_bounds`)."""
  lo, hi = (np.asarray(a) for a in wgpu.window_bounds(jnp.asarray(row_key), jnp.asarray(col_key), half, rows, cols))
  cols_n = col_key.shape[1] // cols
  return (np.arange(cols_n)[None, None, :] >= lo[:, :, None]) & (np.arange(cols_n)[None, None, :] < hi[:, :, None])


def _visited(rows: int, cols: int, n_rows: int, n_cols: int, half: int | None) -> np.ndarray:
  """n_rows x n_cols bool: the blocks visited when positions are the indices (one segment)."""
  index = lambda n: np.arange(n, dtype=np.int32)[None, :]
  return _blocks_visited(index(n_rows * rows), index(n_cols * cols), rows, cols, half)[0]


@pytest.mark.parametrize("t, s, rows, cols, window", [(1024, 1024, 64, 64, 128), (1024, 1024, 32, 32, 128),
                                                      (96, 160, 16, 32, 8), (160, 96, 32, 16, 8), (64, 64, 16, 16, 0),
                                                      (64, 48, 16, 16, 200)])
def test_window_bounds_cover_exactly_the_window_by_index(t, s, rows, cols, window):
  """A block is visited iff some (row, col) in it has |row - col| <= window // 2 (rows and cols both ways)."""
  half = window // 2
  idx_r, idx_c = np.arange(t)[:, None], np.arange(s)[None, :]
  inside = np.abs(idx_r - idx_c) <= half
  needed = inside.reshape(t // rows, rows, s // cols, cols).any(axis=(1, 3))
  np.testing.assert_array_equal(_visited(rows, cols, t // rows, s // cols, half), needed)
  # The dK/dV pass: key blocks over query blocks (the window is symmetric).
  np.testing.assert_array_equal(_visited(cols, rows, s // cols, t // rows, half), needed.T)


def test_local_layer_visits_about_window_plus_block_over_length():
  """L = 1024, window 128, blocks of 64: 46 of 256 blocks, (128 + 64) / 1024 of a global layer, less the edges."""
  visited = _visited(64, 64, 16, 16, 64)
  assert int(visited.sum()) == 16 * 3 - 2, "each query block visits its own key block and one each side"
  assert abs(visited.mean() - (128 + 64) / 1024) < 0.01
  assert _visited(64, 64, 16, 16, None).all(), "no window: every block"
  # The backward's 32-row tiles: (128 + 32) / 1024.
  assert abs(_visited(32, 32, 32, 32, 64).mean() - (128 + 32) / 1024) < 0.01


def test_cross_attention_with_window_matches_dense():
  """T=48 queries, S=64 keys, distinct segment arrays, window 8; query segment 3 has no key, pads on both sides.

  (Without a window the kernel runs `test_attention.py`'s cross-attention case.)"""
  window = 8
  q_seg = jnp.asarray([[1] * 20 + [3] * 6 + [2] * 14 + [0] * 8, [1] * 30 + [2] * 10 + [0] * 8], jnp.int32)
  kv_seg = jnp.asarray([[1] * 30 + [2] * 30 + [0] * 4, [1] * 40 + [2] * 24], jnp.int32)
  pos_q, pos_k = jnp.broadcast_to(jnp.arange(48), (2, 48)), jnp.broadcast_to(jnp.arange(64), (2, 64))
  q, k, v, dout = _qkv(48, 64)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(q_seg, kv_seg, pos_q, pos_k, window))
  # Pad keys get an id no query has (as attention_kernels does).
  fn = lambda q, k, v: wgpu.flash_attention(q, k, v, q_seg, jnp.where(kv_seg > 0, kv_seg, -1), window=window, blocks=
                                            SMALL, interpret=True)
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(g, w, atol=2e-5 * max(1.0, float(jnp.max(jnp.abs(w)))), err_msg=name)
  keyless = (q_seg == 0) | (q_seg == 3)
  assert float(jnp.max(jnp.abs(got[0][keyless]))) == 0.0, "keyless queries output exactly 0 (no has_key needed)"
  assert float(jnp.max(jnp.abs(got[1][keyless]))) == 0.0, "and get no gradient"


@pytest.mark.parametrize("t, s", [(16, 128), (128, 16)], ids=["forward-dq", "dkv"])
def test_kernels_never_read_blocks_outside_the_window(t, s):
  """NaNs in the blocks no visited block range holds: any read of them would reach the results."""
  q, k, v, dout = _qkv(t, s, seed=1)
  seg_q, seg_k = jnp.ones((2, t), jnp.int32), jnp.ones((2, s), jnp.int32)
  # Window 8 (half 4): the first 16 rows or columns see indices < 20, blocks 0 and 1 of 16.
  far_q, far_k = jnp.arange(t)[None, :, None, None] >= 32, jnp.arange(s)[None, :, None, None] >= 32
  poison = lambda x, far: jnp.where(far, jnp.nan, x)
  fn = lambda q, k, v: wgpu.flash_attention(q, k, v, seg_q, seg_k, window=8, blocks=SMALL, interpret=True)
  run = jax.jit(lambda *a: _run(fn, *a))
  clean, dirty = run(q, k, v, dout), run(poison(q, far_q), poison(k, far_k), poison(v, far_k), poison(dout, far_q))
  near_q, near_k = ~far_q[0, :, 0, 0], ~far_k[0, :, 0, 0]
  for name, c, d, near in zip(("output", "dq", "dk", "dv"), clean, dirty, (near_q, near_q, near_k, near_k)):
    np.testing.assert_array_equal(d[:, near], c[:, near], err_msg=f"{name}: a block outside the window was read")


@pytest.mark.parametrize("window, t, s", [(128, 1000, 1000), (None, 154, 512)], ids=["local", "cross"])
def test_gpu_flash_lowers_to_triton_for_a_gpu(window, t, s):
  """gpu_flash's gradient lowered for CUDA from this CPU host: the Pallas Triton lowering (power-of-2
  tiles, supported primitives) takes the three kernels at the model's head size, bf16, odd lengths."""
  q = jax.ShapeDtypeStruct((2, t, 12, 64), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((2, s, 12, 64), jnp.bfloat16)
  q_seg, kv_seg = jax.ShapeDtypeStruct((2, t), jnp.int32), jax.ShapeDtypeStruct((2, s), jnp.int32)
  fn = functools.partial(attention_kernels.gpu_flash_attention, window=window, shared_segments=window is not None,
                         block_q=512, block_kv=512, interpret=False)
  loss = lambda q, k, v, qs, ks: jnp.sum(fn(q, k, v, qs, ks, qs, ks).astype(jnp.float32))
  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  text = grad.trace(q, kv, kv, q_seg, kv_seg).lower(lowering_platforms=("cuda",)).as_text()
  assert re.findall(r'name = "(window_mha_\w+)"',
                    text) == ["window_mha_forward", "window_mha_backward_dkv", "window_mha_backward_dq"]
  assert text.count("xla.gpu.triton") == 3


def _gathered_rows(length: int, keep: int, docs: tuple[int, ...], seed: int = 0):
  """B=2 rows of `keep` tokens: a sorted random subset of a packed row of `length` (CrossBERT's visible
  tokens keep their documents' positions), pads after the last document."""
  rng = np.random.default_rng(seed)
  segs, poss = [], []
  for _ in range(2):
    seg, pos, start = np.zeros(length, np.int32), np.zeros(length, np.int32), 0
    for i, n in enumerate(docs):
      seg[start:start + n], pos[start:start + n] = i + 1, np.arange(n)
      start += n
    idx = np.sort(rng.permutation(length)[:keep])
    segs.append(seg[idx])
    poss.append(pos[idx])
  return np.stack(segs), np.stack(poss)


def test_bounds_on_gathered_tokens_cover_the_window_and_skip_the_rest():
  """Half of a 1,024-token row kept (r = 0.5), window 128 by position: every block with a visible pair is
  visited, both ways, and a query block of 64 visits about (64 + 64) / 512 of the keys, not all."""
  seg, pos = _gathered_rows(1024, 512, (400, 300, 250))  # 74 pads at the end, some kept.
  q_key, kv_key = wgpu.window_keys(jnp.asarray(seg), jnp.asarray(np.where(seg > 0, seg, -1)), jnp.asarray(pos),
                                   jnp.asarray(pos), 64)
  allowed = np.asarray(attn.mask(jnp.asarray(seg), jnp.asarray(seg), jnp.asarray(pos), jnp.asarray(pos), 128))
  needed = allowed.reshape(2, 8, 64, 8, 64).any(axis=(2, 4))
  visited = _blocks_visited(np.asarray(q_key), np.asarray(kv_key), 64, 64, 64)
  assert not (needed & ~visited).any(), "a block holding a visible pair was skipped"
  back = _blocks_visited(np.asarray(kv_key), np.asarray(q_key), 64, 64, 64)  # dK/dV: key blocks over query blocks.
  assert not (needed.transpose(0, 2, 1) & ~back).any()
  assert visited.mean() < 0.4, visited.mean()  # Each query block: its own key block and about one each side.


def test_bounds_visit_every_block_where_keys_are_not_sorted():
  """Segments numbered out of order along a row: the binary search cannot be trusted, so no skipping."""
  seg = np.array([[2] * 32 + [1] * 32, [1] * 32 + [2] * 32], np.int32)
  pos = np.tile(np.arange(32, dtype=np.int32), (2, 2))
  q_key, kv_key = wgpu.window_keys(jnp.asarray(seg), jnp.asarray(seg), jnp.asarray(pos), jnp.asarray(pos), 4)
  visited = _blocks_visited(np.asarray(q_key), np.asarray(kv_key), 16, 16, 4)
  assert visited[0].all() and not visited[1].all()


def test_gathered_tokens_through_the_kernel_match_dense():
  """A local layer of CrossBERT's encoder (gathered tokens, window by position) in the kernel, with blocks
  skipped: forward and gradients against the dense reference."""
  seg_np, pos_np = _gathered_rows(256, 128, (100, 90, 40), seed=3)
  seg, pos = jnp.asarray(seg_np), jnp.asarray(pos_np)
  q, k, v, dout = _qkv(128, 128, seed=4)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(seg, seg, pos, pos, 16))
  fn = lambda q, k, v: wgpu.flash_attention(q, k, v, seg, jnp.where(seg > 0, seg, -1), window=16, q_pos_BxT=pos,
                                            kv_pos_BxS=pos, blocks=SMALL, interpret=True)
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(g, w, atol=2e-5 * max(1.0, float(jnp.max(jnp.abs(w)))), err_msg=name)
  q_key, kv_key = wgpu.window_keys(seg, jnp.where(seg > 0, seg, -1), pos, pos, 8)
  assert _blocks_visited(np.asarray(q_key), np.asarray(kv_key), 16, 16, 8).mean() < 0.5, "blocks were skipped"

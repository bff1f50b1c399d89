"""The Pallas GPU window kernel (`attention_window_gpu`, Pallas interpret mode on CPU).

Its loop bounds against the mask they must cover (no block with a visible entry skipped, every
block wholly outside the window skipped, and the fraction visited at ModernBERT's window), the
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


def _visited(rows: int, cols: int, n_rows: int, n_cols: int, half: int | None) -> np.ndarray:
  """n_rows x n_cols bool: the column blocks each row block's loop runs over (`block_range`)."""
  out = np.zeros((n_rows, n_cols), bool)
  for i in range(n_rows):
    lo, hi = wgpu.block_range(jnp.int32(i), rows, cols, n_cols, half)
    out[i, int(lo):int(hi)] = True
  return out


@pytest.mark.parametrize("t, s, rows, cols, window", [(1024, 1024, 64, 64, 128), (1024, 1024, 32, 32, 128),
                                                      (96, 160, 16, 32, 8), (160, 96, 32, 16, 8), (64, 64, 16, 16, 0),
                                                      (64, 48, 16, 16, 200)])
def test_block_range_covers_exactly_the_window(t, s, rows, cols, window):
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

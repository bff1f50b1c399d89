"""The chunked vocabulary cross-entropy against the one-pass loss: values, stats and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crossbert_jax.model import layers
from crossbert_jax.training import objectives

B, Q, D, V = 2, 37, 16, 64


def _inputs(dtype=jnp.float32, d: int = D, v: int = V):
  """B x Q hidden states of width d, a d x v head and targets below v (shared with test_bf16_head)."""
  kx, kw, kb, kt = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(kx, (B, Q, d)).astype(dtype)
  w = jax.random.normal(kw, (d, v)) * 0.3
  b = jax.random.normal(kb, (v,)) * 0.1
  targets = jax.random.randint(kt, (B, Q), 0, v)
  weights = jnp.arange(Q)[None, :] < jnp.asarray([[30], [Q]])  # Row 0 has 7 padding slots.
  return x, w, b, targets, weights


def _one_pass(x, w, b, targets, weights):
  """The previous loss: the whole BxQxV float32 logits, then the token losses."""
  logits = jnp.einsum("bqd,dv->bqv", x.astype(jnp.float32), w) + b[None, None]
  return objectives._token_losses(logits, targets, weights)


@pytest.mark.parametrize("chunk", [8, 37, 512], ids=["5_chunks_padded", "one_chunk", "larger"])
def test_chunked_cross_entropy_matches_one_pass(chunk):
  x, w, b, targets, weights = _inputs()
  chunked = lambda x, w, b: objectives.chunked_cross_entropy(x, (w, b), targets, weights, chunk)
  ref = lambda x, w, b: _one_pass(x, w, b, targets, weights)
  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(x, w, b)
  (loss, stats), grads = grad(chunked)
  (loss_ref, stats_ref), grads_ref = grad(ref)
  np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
  assert float(stats.num_targets) == float(stats_ref.num_targets) == 30 + Q
  assert float(stats.num_correct) == float(stats_ref.num_correct)
  for name, g, g_ref in zip(("x", "W", "b"), grads, grads_ref):
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6, err_msg=f"d loss / d {name}")


def test_chunks_never_hold_the_whole_logits():
  x, w, b, targets, weights = _inputs()
  loss = lambda chunk: lambda x, w, b: objectives.chunked_cross_entropy(x, (w, b), targets, weights, chunk)[0]
  hlo = lambda chunk: jax.jit(jax.grad(loss(chunk), argnums=(0, 1, 2))).lower(x, w, b).compile().as_text()
  assert f"f32[{B},{Q},{V}]" not in hlo(8) and f"f32[{B},8,{V}]" in hlo(8), (
      "the chunked loss (or its backward) materialised B x Q x V logits")
  assert f"f32[{B},{Q},{V}]" in hlo(512)


def test_bf16_head_accumulates_in_float32():
  """bf16 hidden states and head: the logits are the float32 product, not rounded to bf16."""
  x, w, b, _, _ = _inputs(jnp.bfloat16)
  got = layers.vocab_logits(x, w.astype(jnp.bfloat16), b)
  assert got.dtype == jnp.float32
  exact = jnp.einsum("bqd,dv->bqv", x.astype(jnp.float32), w.astype(jnp.bfloat16).astype(jnp.float32)) + b[None, None]
  rounded = exact.astype(jnp.bfloat16).astype(jnp.float32)
  err, err_rounded = float(jnp.max(jnp.abs(got - exact))), float(jnp.max(jnp.abs(rounded - exact)))
  assert err < 1e-4 < err_rounded, f"bf16 head error {err:.1e} (bf16 rounding of the logits: {err_rounded:.1e})"

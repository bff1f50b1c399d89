"""The bf16 vocabulary head (model.head_dtype=bfloat16) against the float32 one-pass loss."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crossbert_jax.training import objectives
from crossbert_jax.training.objectives import bf16_head
from tests.helpers import run_command
from tests.unit.test_chunked_loss import B, Q, _one_pass
from tests.unit.test_chunked_loss import _inputs as _chunked_inputs

D, V = 32, 96


def _inputs(dtype=jnp.float32):
  return _chunked_inputs(dtype, D, V)


def _value_and_grads(loss, x, w, b):
  # The train step's use: the summed loss over the target count.
  f = lambda x, w, b: (lambda out: (out[0] / out[1].num_targets, out))(loss(x, w, b))
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(x, w, b)


@pytest.mark.parametrize("chunk", [8, 37, 512], ids=["5_chunks_padded", "one_chunk", "larger"])
def test_fused_gradient_is_exact_in_float32(chunk):
  """The same algebra with float32 GEMMs: the forward-computed gradient equals autodiff's of the one-pass loss."""
  x, w, b, targets, weights = _inputs()
  fused = lambda x, w, b: bf16_head.cross_entropy(x, (w, b), targets, weights, chunk, jnp.float32)
  (mean, (loss, stats)), grads = _value_and_grads(fused, x, w, b)
  (mean_ref, (loss_ref, stats_ref)), grads_ref = _value_and_grads(lambda x, w, b: _one_pass(x, w, b, targets, weights),
                                                                  x, w, b)
  np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
  np.testing.assert_allclose(mean, mean_ref, rtol=1e-6)
  assert float(stats.num_targets) == float(stats_ref.num_targets) == 30 + Q
  assert float(stats.num_correct) == float(stats_ref.num_correct)
  for name, g, g_ref in zip(("x", "W", "b"), grads, grads_ref):
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6, err_msg=f"d loss / d {name}")


@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_bf16_head_within_bf16_tolerance_of_float32(x_dtype):
  """Loss within 1e-3 relative, every gradient within 2e-2 of its largest entry (bf16 has 8 mantissa
  bits: 3.9e-3 relative per rounding; measured: loss 1.5e-4, gradients 7.0e-3 at most), and without a bias."""
  x, w, b, targets, weights = _inputs(x_dtype)
  bf16 = lambda x, w, b: objectives.chunked_cross_entropy(x, (w, b), targets, weights, 8, head_dtype="bfloat16")
  (mean, (_, stats)), grads = _value_and_grads(bf16, x, w, b)
  (mean_ref, (_, stats_ref)), grads_ref = _value_and_grads(lambda x, w, b: _one_pass(x, w, b, targets, weights), x, w,
                                                           b)
  np.testing.assert_allclose(mean, mean_ref, rtol=1e-3)
  assert float(stats.num_targets) == float(stats_ref.num_targets)
  assert abs(float(stats.num_correct) - float(stats_ref.num_correct)) <= 1  # A near-tie may flip.
  for name, g, g_ref in zip(("x", "W", "b"), grads, grads_ref):
    assert g.dtype == g_ref.dtype if name != "x" else g.dtype == x.dtype
    err = float(jnp.max(jnp.abs(g.astype(jnp.float32) - g_ref.astype(jnp.float32))))
    scale = float(jnp.max(jnp.abs(g_ref.astype(jnp.float32))))
    assert err <= 2e-2 * scale, f"d loss / d {name}: {err:.2e} of {scale:.2e}"
  no_bias = jax.grad(lambda x: objectives.chunked_cross_entropy(x, (w, None), targets, weights, 8, "bfloat16")[0])(x)
  ref_no_bias = jax.grad(lambda x: _one_pass(x, w, jnp.zeros(V), targets, weights)[0])(x)
  assert float(jnp.max(jnp.abs(no_bias.astype(jnp.float32) - ref_no_bias.astype(jnp.float32)))) <= 2e-2 * float(
      jnp.max(jnp.abs(ref_no_bias.astype(jnp.float32))))


def _dot_operand_dtypes(fn, *args) -> list[tuple[str, str]]:
  """The operand dtypes of every dot_general in fn's jaxpr (nested jaxprs included)."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else [param]:
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            walk(sub.jaxpr)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def test_every_head_gemm_is_bf16():
  """bf16 hidden states: the bf16 head's three GEMMs (no recompute) take bf16 operands; the float32
  head's backward takes the float32 logit gradient (what the H200 trace showed as f32 GEMMs)."""
  x, w, b, targets, weights = _inputs(jnp.bfloat16)
  grad = lambda loss: jax.grad(lambda x, w, b: loss(x, w, b)[0], argnums=(0, 1, 2))
  # As compiled for a GPU or TPU (a CPU multiplies the same bf16 values as float32: XLA:CPU lacks the dot).
  bf16 = lambda x, w, b: bf16_head.cross_entropy(x, (w, b), targets, weights, 8, jnp.bfloat16, native=True)
  dots = _dot_operand_dtypes(grad(bf16), x, w, b)
  assert dots and all(d == ("bfloat16", "bfloat16") for d in dots) and len(dots) == 3, dots
  f32 = lambda x, w, b: objectives.chunked_cross_entropy(x, (w, b), targets, weights, 8, "float32")
  assert any("float32" in d for d in _dot_operand_dtypes(grad(f32), x, w, b))


def test_bf16_head_never_holds_the_whole_logits():
  x, w, b, targets, weights = _inputs()
  loss = lambda x, w, b: objectives.chunked_cross_entropy(x, (w, b), targets, weights, 8, "bfloat16")[0]
  hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, w, b).compile().as_text()
  assert f"f32[{B},{Q},{V}]" not in hlo and f"f32[{B},8,{V}]" in hlo


def _losses(workdir) -> list[float]:
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r["loss"] for r in rows if "loss" in r and "step" in r]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["crossbert", "bert"])
def test_short_run_tracks_the_float32_head(tmp_path, spm_model, config):
  """A 60-step tiny run (real train command, built-in corpus) with the bf16 head tracks the float32 head's
  loss curve: every logged loss within 2% (measured: 0.07% at most for bert, under 0.005% for crossbert, on one
  device), and both curves fall.

  Both runs are the train command in this process (`run_command`: the tests' 8 fake CPU devices, the same for
  both, so only the head differs); the process boundary is not what is tested, and a process start per run cost
  more than the run (the command's subprocess smoke test is the session's `tiny_run`)."""
  curves = {}
  for head_dtype in ("float32", "bfloat16"):
    workdir = tmp_path / head_dtype
    run_command("crossbert_jax.train", f"--config=configs/{config}.py:tiny", f"--workdir={workdir}",
                f"--config.data.tokenizer={spm_model}", "--config.model.vocab_size=512", "--config.train.steps=60",
                "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False",
                "--config.checkpoint.every_steps=60", f"--config.model.head_dtype={head_dtype}", check=True)
    curves[head_dtype] = np.asarray(_losses(workdir))
  ref, got = curves["float32"], curves["bfloat16"]
  assert len(ref) == len(got) >= 50
  assert ref[-5:].mean() < ref[:5].mean() - 0.5
  rel = np.abs(got - ref) / ref
  print(f"{config}: bf16 head's largest relative loss difference {rel.max():.4f} over {len(ref)} steps")
  assert rel.max() < 0.02, f"largest relative difference {rel.max():.4f} at logged step {rel.argmax()}"

"""The XLA:GPU flag presets: every flag known to the pinned jaxlib, applied only for a GPU, opt-in."""

import subprocess
import sys

import pytest

from crossbert_jax.core import xla_flags
from crossbert_jax.core.errors import UserError
from tests import helpers

_RUN = "import jax, jax.numpy as jnp; print(int(jax.jit(lambda x: x + 1)(jnp.int32(1))))"


def _xla_starts_with(flags: str) -> subprocess.CompletedProcess:
  env = helpers.cpu_env(XLA_FLAGS=flags)
  return subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, timeout=120)


def test_every_preset_flag_is_known_to_the_pinned_jaxlib():
  """XLA parses XLA_FLAGS for every backend and aborts on an unknown flag: a CPU start proves each exists."""
  every = sorted({flag for preset in xla_flags.GPU_PRESETS.values() for flag in preset})
  ok = _xla_starts_with(" ".join(every))
  assert ok.returncode == 0 and ok.stdout.strip() == "2", ok.stderr[-2000:]
  bad = _xla_starts_with("--xla_gpu_no_such_flag_anywhere=true")  # The check can fail.
  assert bad.returncode != 0 and "xla_gpu_no_such_flag_anywhere" in bad.stderr


def test_a_preset_is_applied_only_for_a_gpu_and_once(monkeypatch):
  monkeypatch.setattr(xla_flags, "_runs_on_gpu", lambda environ: True)
  env = {xla_flags.GPU_PRESET_ENV: "anchors", "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true"}
  flags = xla_flags.set_gpu_flags(env)
  assert flags == env["XLA_FLAGS"]
  assert "--xla_gpu_enable_triton_gemm=true" in flags and "triton_gemm=false" not in flags  # An explicit choice wins.
  assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags and "--xla_gpu_enable_command_buffer=" in flags
  assert xla_flags.set_gpu_flags(env) == flags  # Idempotent.
  assert xla_flags.set_gpu_flags({"XLA_FLAGS": "--a"}) == "--a"  # No preset asked: nothing.
  monkeypatch.setattr(xla_flags, "_runs_on_gpu", lambda environ: False)
  assert xla_flags.set_gpu_flags({xla_flags.GPU_PRESET_ENV: "anchors", "XLA_FLAGS": "--a"}) == "--a"


def test_no_gpu_here():
  """This CPU host: no CUDA plugin, or JAX_PLATFORMS=cpu."""
  assert not xla_flags._runs_on_gpu({"JAX_PLATFORMS": "cpu"})


def test_an_unknown_preset_is_one_line():
  with pytest.raises(UserError, match=f"{xla_flags.GPU_PRESET_ENV}=fast: use one of anchors"):
    xla_flags.set_gpu_flags({xla_flags.GPU_PRESET_ENV: "fast"})

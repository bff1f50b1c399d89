"""Running the project's commands in subprocesses, as the tests do: one CPU device, repo on the path."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def cpu_env(**extra: str) -> dict[str, str]:
  """This environment with one CPU device (no fake devices) and the repo importable."""
  return {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **extra}


def run_module(args, *, env: dict[str, str] | None = None, check: bool = True, wait: bool = True, timeout: int = 600):
  """`python -m <args>` from the repo root: its CompletedProcess (a Popen if not `wait`).

  `check` fails the test with the command's stderr tail when it exits non-zero.
  """
  cmd = [sys.executable, "-m", *args]
  env = cpu_env() if env is None else env
  if not wait:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  if check and proc.returncode != 0:
    pytest.fail(f"{args[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return proc

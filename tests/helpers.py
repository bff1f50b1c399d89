"""Running the project's commands: in this process (`run_main`: the command's flags and main, as its CLI
runs them), or in a subprocess (`run_module`: one CPU device, the repo on the path) where the process
boundary is the point (kill -9, signals, several processes, locks) and for each command's one smoke test."""

import os
import pathlib
import importlib
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


def run_main(module: str, *argv: str) -> int:
  """`python -m <module> <argv>` in this process: its exit status (0 when main returns).

  The command's flags are defined afresh (a command module's flags, and any other command's left by
  an earlier call, are dropped first: commands share flag names such as --config), parsed as its CLI
  parses them (`parse_flags_or_exit`: a bad flag or config is one line and exit 2), then its main
  runs; stdout and stderr are the caller's (capsys). The flags are reset afterwards.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  from crossbert_jax.core import errors  # pylint: disable=g-import-not-at-top

  fv = flags.FLAGS
  commands = {
      f.name for m, defined in fv.flags_by_module_dict().items() if m.startswith("crossbert_jax.") for f in defined}
  for name in commands & set(fv):
    delattr(fv, name)
  mod = importlib.reload(sys.modules[module]) if module in sys.modules else importlib.import_module(module)
  if hasattr(mod, "_define_flags"):
    mod._define_flags()  # pylint: disable=protected-access
  # ml_collections loads a --config file as module "config_config" into an existing one of that name: a
  # file without get_config would keep the last file's.
  sys.modules.pop("config_config", None)
  saved_argv, sys.argv = sys.argv, [module, *argv]  # ml_collections reads --config.key=value overrides here.
  saved_env, saved_quiet = dict(os.environ), errors._quiet_stderr  # pylint: disable=protected-access
  errors._quiet_stderr = lambda: None  # A command's exit silences fd 2: the test session's stderr here.
  try:
    mod.main(errors.parse_flags_or_exit(sys.argv))
  except SystemExit as e:
    return 0 if e.code is None else e.code
  finally:
    sys.argv = saved_argv
    os.environ.clear()
    os.environ.update(saved_env)  # main's XLA flags and the like stay the command's.
    errors._quiet_stderr = saved_quiet  # pylint: disable=protected-access
    fv.unparse_flags()
    fv.mark_as_parsed()
  return 0

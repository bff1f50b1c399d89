"""Running the project's commands: in this process (`run_main`: the command's flags and main, as its CLI
runs them), or in a subprocess (`run_module`: one CPU device, the repo on the path) where the process
boundary is the point (kill -9, signals, several processes, locks) and for each command's one smoke test."""

import os
import pathlib
import shutil
import signal
import contextlib
import importlib
import io
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# XLA:CPU's code generation for every program the suite compiles, in this process and in the commands it
# starts (docs/testing.md has the measurements):
# - LLVM at -O0: the tiny models' programs compile in about half the time (a cold 12-step tiny run: 25 s
#   -> 13 s on 2 cores, 2026-12-06) and run no slower at their sizes;
# - XLA:CPU's older (non-MLIR) fusion emitters: jaxlib 0.10's default emitters build an MLIR pipeline per
#   fusion; without them the same 12-step run takes 15.5 user CPU-s, not 20 (2026-12-07). Only with -O0: at
#   the default level they compile and run `small`'s step slower (bench: CrossBERT 4.9 s -> 5.8 s a step), so
#   the commands' own defaults (core/xla_flags.py) keep the new emitters.
# XLA's HLO passes (fusion decisions, layouts, sharding) are the same; only the machine code differs. A test
# compares floats only between programs built with the same flags.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"

# The suite's one compilation cache for every program (conftest.py): a test of a command's own default cache
# (under its workdir, programs over run/compile_cache.MIN_COMPILE_SECONDS) leaves both out of the environment.
SUITE_CACHE_VARS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


def users_cache_env(env: dict[str, str]) -> dict[str, str]:
  """`env` without the suite's compilation-cache variables: the cache a user's command gets by default."""
  return {k: v for k, v in env.items() if k not in SUITE_CACHE_VARS}


def cpu_env(**extra: str) -> dict[str, str]:
  """This environment with one CPU device (no fake devices) and the repo importable."""
  return {**os.environ, "XLA_FLAGS": TEST_XLA_FLAGS, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **extra}


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


def run_main(module: str, *argv: str, env: dict[str, str] | None = None) -> int:
  """`python -m <module> <argv>` in this process: its exit status (0 when main returns).

  The command's flags are defined afresh (a command module's flags, and any other command's left by
  an earlier call, are dropped first: commands share flag names such as --config), parsed as its CLI
  parses them (`parse_flags_or_exit`: a bad flag or config is one line and exit 2), then its main
  runs with `env` added to os.environ; stdout and stderr are the caller's (capsys, `run_command`). The
  flags, the environment and the SIGTERM/SIGINT handlers are reset afterwards. The command sees this
  process's devices (conftest's 8 fake CPU devices, where a subprocess sees 1): a batch that does not
  divide by 8 is refused for that.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  from crossbert_jax.core import errors  # pylint: disable=g-import-not-at-top

  fv = flags.FLAGS
  _drop_command_flags(fv)
  mod = importlib.reload(sys.modules[module]) if module in sys.modules else importlib.import_module(module)
  if hasattr(mod, "_define_flags"):
    mod._define_flags()  # pylint: disable=protected-access
  # ml_collections loads a --config file as module "config_config" into an existing one of that name: a
  # file without get_config would keep the last file's.
  sys.modules.pop("config_config", None)
  saved_argv, sys.argv = sys.argv, [module, *argv]  # ml_collections reads --config.key=value overrides here.
  saved_env, saved_quiet = dict(os.environ), errors._quiet_stderr  # pylint: disable=protected-access
  # A command may install SIGTERM/SIGINT handlers (the sweep's driver does): this process gets its own back.
  saved_handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  errors._quiet_stderr = lambda: None  # A command's exit silences fd 2: the test session's stderr here.
  os.environ.update(env or {})
  try:
    mod.main(errors.parse_flags_or_exit(sys.argv))
  except SystemExit as e:
    return 0 if e.code is None else e.code
  finally:
    sys.argv = saved_argv
    os.environ.clear()
    os.environ.update(saved_env)  # main's XLA flags and the like stay the command's.
    errors._quiet_stderr = saved_quiet  # pylint: disable=protected-access
    for sig, handler in saved_handlers.items():
      signal.signal(sig, handler)
    fv.unparse_flags()
    _drop_command_flags(fv)  # As before the call: a test that defines a command's flags itself can.
    fv.mark_as_parsed()
  return 0


def _drop_command_flags(fv) -> None:
  """Removes the flags that crossbert_jax's commands defined, with their --config.KEY overrides
  (ml_collections defines those while parsing); other libraries' flags (grain's) stay."""
  commands = {
      f.name for m, defined in fv.flags_by_module_dict().items() if m.startswith("crossbert_jax.") for f in defined}
  for name in [n for n in fv if n in commands or n.split(".")[0] in commands and "." in n]:
    delattr(fv, name)


def run_command(module: str, *argv: str, env: dict[str, str] | None = None,
                check: bool = False) -> subprocess.CompletedProcess:
  """`run_main` with its stdout and stderr captured: a CompletedProcess (returncode, stdout, stderr).

  `check` fails the test with the command's stderr tail when it exits non-zero (as `run_module`'s).
  """
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = run_main(module, *argv, env=env)
  if check and code != 0:
    pytest.fail(f"{module} failed ({code}):\n{err.getvalue()[-3000:]}")
  return subprocess.CompletedProcess([module, *argv], code, out.getvalue(), err.getvalue())


class BackgroundRun:
  """A `python -m crossbert_jax.train` started now; `finished()` waits for it and returns its workdir."""
  def __init__(self, workdir: pathlib.Path, args: list[str]):
    self.workdir = workdir
    self.proc = run_module(["crossbert_jax.train", f"--workdir={workdir}", *args], wait=False)
    self.stderr = None

  def finished(self) -> pathlib.Path:
    if self.stderr is None:
      _, self.stderr = self.proc.communicate(timeout=600)
    assert self.proc.returncode == 0, f"training failed ({self.proc.returncode}):\n{self.stderr[-3000:]}"
    return self.workdir

  def stop(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    if self.stderr is None:
      self.stderr = self.proc.communicate()[1]


def copy_run(run: pathlib.Path, parent: pathlib.Path) -> pathlib.Path:
  """A copy of a session run (conftest's tiny_run, tiny_bert_run: read-only) to write into, without its
  trace and W&B folders: parent/run."""
  return pathlib.Path(shutil.copytree(run, parent / "run", ignore=shutil.ignore_patterns("profile", "wandb")))

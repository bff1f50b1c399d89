"""Runs a planned ladder locally, one training subprocess after another, resumably.

A run's workdir is ROOT/runs/<run name>. The trainer resumes from a workdir's checkpoint, so an
interrupted run simply continues; a run that finished is recorded in ROOT/runs/<name>/sweep_done.json
and skipped. Subprocesses keep one run's crash (or memory) from taking the sweep down, and each
run's output goes to its train.log. A WSD stable run trains before its decay branches (the plan's
order), each branch forking from the stable run's kept checkpoint.

A SIGTERM reaches the running trainer, which saves and stops; then the sweep raises `Stopped`
(exit 75: rerun to resume). A child dies with the sweep, even a `kill -9` of it
(PR_SET_PDEATHSIG), and a run's wall time is written every few seconds, so an attempt that was
killed still counts; sweep_wall.json also names the machines its attempts ran on. Every state
file is written atomically (temp + rename).
"""

import ctypes
import functools
import json
import pathlib
import shlex
import signal
import subprocess
import sys
import time

from crossbert_jax.core import host
from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.run import metrics

WALL_FILE = "sweep_wall.json"
_WALL_EVERY_S = 5.0  # How often a running attempt's wall time is written.
_PR_SET_PDEATHSIG = 1


class Stopped(Exception):
  """The sweep was stopped by SIGTERM / SIGINT (its trainer saved first); rerun it to resume."""


def _die_with_parent() -> None:
  """preexec_fn: the child gets SIGKILL when the sweep dies, however it dies (Linux)."""
  try:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  except (OSError, AttributeError):  # Not Linux: the sweep's own signal handling remains.
    pass


def tokenizer_path(root: pathlib.Path) -> pathlib.Path:
  """Where the sweep's tokenizer lives: ROOT/tokenizer/spm.model."""
  return root / "tokenizer" / "spm.model"


def tokenizer_command(spec: dict, root: pathlib.Path, python: str = "python") -> list[str]:
  """argv training the sweep's SentencePiece model on the spec's data."""
  return [
      python, "-m", "crossbert_jax.tokenizer", f"--input={spec['data_path']}",
      f"--vocab_size={spec['tokenizer_vocab_size']}", f"--output={tokenizer_path(root)}"]


def read_rows(workdir: pathlib.Path) -> list[dict]:
  """A run's metrics rows; the one place the sweep and the report read them."""
  return metrics.read_metrics(str(workdir))


def _last_step(workdir: pathlib.Path) -> int:
  try:
    return max((int(r["step"]) for r in read_rows(workdir)), default=0)
  except UserError:
    return 0


def _run_logged(cmd: list[str], log: pathlib.Path, on_tick=None) -> tuple[int, str | None]:
  """(exit status, the stop signal's name or None): runs `cmd` to its end; a stop request reaches
  it so that it saves a checkpoint first. `on_tick()` is called every few seconds while it runs."""
  log.parent.mkdir(parents=True, exist_ok=True)
  stopped: list[str] = []
  with log.open("a") as f:
    f.write(f"$ {shlex.join(cmd)}\n")
    f.flush()
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def forward(signum, _):
      stopped.append(signal.Signals(signum).name)
      proc.send_signal(signum)

    # SIGTERM is forwarded; Ctrl-C already reaches the child through the terminal's process group,
    # so the sweep only notes it (a second SIGINT sent by us would make the trainer abort unsaved).
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
        signal.SIGINT: signal.signal(signal.SIGINT, lambda signum, _: stopped.append("SIGINT"))}
    try:
      while True:
        try:
          rc = proc.wait(timeout=_WALL_EVERY_S)
          break
        except subprocess.TimeoutExpired:
          if on_tick is not None:
            on_tick()
      return rc, (stopped[0] if stopped else None)
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)


def ensure_tokenizer(spec: dict, root: pathlib.Path, log=functools.partial(print, flush=True)) -> None:
  """Trains the sweep's tokenizer here unless ROOT/tokenizer/spm.model exists (every executor's first step)."""
  tok = tokenizer_path(root)
  if not tok.is_file():
    log(f"tokenizer: training {tok} on {spec['data_path']}")
    rc, signame = _run_logged(tokenizer_command(spec, root, sys.executable), root / "tokenizer" / "tokenizer.log")
    if signame is not None:
      raise Stopped(f"{signame} during tokenizer training; rerun the same sweep command to resume")
    if rc != 0:
      raise UserError(f"tokenizer training failed (exit {rc}): see {root / 'tokenizer' / 'tokenizer.log'}")


def run_sweep(spec: dict, runs: list[plan_lib.Run], root: pathlib.Path, log=functools.partial(print,
                                                                                              flush=True)) -> None:
  """Trains the tokenizer if missing, then every unfinished run in order.

  Raises `Stopped` after a stop signal, UserError for a run that failed.
  """
  python = sys.executable
  ensure_tokenizer(spec, root, log)
  for i, run in enumerate(runs, 1):
    run_dir = root / "runs" / run.name
    where = f"[{i}/{len(runs)}] {run.name}"
    if plan_lib.is_done(run_dir):
      log(f"{where}: done, skipped")
      continue
    if run.kind in ("branch", "contrast") and not plan_lib.is_done(root / "runs" / run.fork_from):
      raise UserError(f"{run.name} starts from {run.fork_from}, which has not finished; rerun the sweep to "
                      "train it first")
    start_step = _last_step(run_dir) if (run_dir / metrics.METRICS_FILE).exists() else 0
    origin = (f" (from {run.fork_from} at step {run.fork_step})" if run.kind == "branch" and not start_step else
              f" (the contrastive stage of {run.fork_from})" if run.kind == "contrast" and not start_step else "")
    log(f"{where}: {'resuming after step ' + str(start_step) if start_step else 'starting'}{origin}, "
        f"{run.end_step - max(start_step, run.fork_step)} steps to go, {run.cost_flops:.3g} FLOPs")
    wall_file = run_dir / WALL_FILE
    # Wall time (training + probes), summed over the attempts at this run, written as it runs, and the
    # machines the attempts ran on: tokens/s of runs are comparable only when they name one machine.
    before = plan_lib.read_json(wall_file, "the run's wall time") if wall_file.is_file() else {}
    previous = before.get("wall_s", 0.0)
    machines = list(dict.fromkeys([*before.get("machines", []), host.describe()]))
    t0 = time.time()
    write_wall = lambda: outputs.write_atomic(wall_file,
                                              json.dumps({"wall_s": previous + time.time() - t0, "machines": machines}))
    run_dir.mkdir(parents=True, exist_ok=True)
    write_wall()
    rc, signame = _run_logged(plan_lib.train_command(run, spec, str(run_dir), python), run_dir / "train.log",
                              on_tick=write_wall)
    write_wall()
    wall = previous + time.time() - t0
    last = _last_step(run_dir)
    if signame is not None:
      raise Stopped(f"{signame} received: {run.name} stopped at step {last} of {run.end_step} (trainer exit {rc}); "
                    "rerun the same sweep command to resume")
    if rc != 0 or last < run.end_step:
      raise UserError(f"{run.name} stopped at step {last} of {run.end_step} (exit {rc}); see {run_dir / 'train.log'}; "
                      "rerun the same sweep command to resume it")
    outputs.write_atomic(run_dir / plan_lib.DONE_FILE, json.dumps({"steps": run.end_step, "wall_s": wall}))
    log(f"{where}: finished in {wall:.0f} s")

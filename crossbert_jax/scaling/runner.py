"""Runs a planned ladder locally, one training subprocess after another, resumably.

A run's workdir is ROOT/runs/<run name>. The trainer resumes from a workdir's checkpoint, so an
interrupted run simply continues; a run that finished is recorded in ROOT/runs/<name>/sweep_done.json
and skipped. Subprocesses keep one run's crash (or memory) from taking the sweep down, and each
run's output goes to its train.log.
"""

import functools
import json
import pathlib
import shlex
import signal
import subprocess
import sys
import time

from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.run import metrics


def tokenizer_path(root: pathlib.Path) -> pathlib.Path:
  """Where the sweep's tokenizer lives: ROOT/tokenizer/spm.model."""
  return root / "tokenizer" / "spm.model"


def tokenizer_command(spec: dict, root: pathlib.Path, python: str = "python") -> list[str]:
  """argv training the sweep's SentencePiece model on the spec's data."""
  return [python, "-m", "crossbert_jax.tokenizer", f"--input={spec['data_path']}",
          f"--vocab_size={spec['tokenizer_vocab_size']}", f"--output={tokenizer_path(root)}"]


def read_rows(workdir: pathlib.Path) -> list[dict]:
  """A run's metrics rows; the one place the sweep and the report read them."""
  return metrics.read_metrics(str(workdir))


def _last_step(workdir: pathlib.Path) -> int:
  try:
    return max((int(r["step"]) for r in read_rows(workdir)), default=0)
  except UserError:
    return 0


def _run_logged(cmd: list[str], log: pathlib.Path) -> int:
  """Runs `cmd` to its end; a stop request reaches it so that it saves a checkpoint first."""
  log.parent.mkdir(parents=True, exist_ok=True)
  with log.open("a") as f:
    f.write(f"$ {shlex.join(cmd)}\n")
    f.flush()
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    # SIGTERM is forwarded; Ctrl-C already reaches the child through the terminal's process group,
    # so the sweep only waits (a second SIGINT sent by us would make the trainer abort unsaved).
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, _: proc.send_signal(signum)),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    try:
      return proc.wait()
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)


def run_sweep(spec: dict, runs: list[plan_lib.Run], root: pathlib.Path, log=functools.partial(print, flush=True)) -> None:
  """Trains the tokenizer if missing, then every unfinished run in order."""
  python = sys.executable
  tok = tokenizer_path(root)
  if not tok.is_file():
    log(f"tokenizer: training {tok} on {spec['data_path']}")
    if _run_logged(tokenizer_command(spec, root, python), root / "tokenizer" / "tokenizer.log") != 0:
      raise UserError(f"tokenizer training failed: see {root / 'tokenizer' / 'tokenizer.log'}")
  for i, run in enumerate(runs, 1):
    run_dir = root / "runs" / run.name
    where = f"[{i}/{len(runs)}] {run.name}"
    if plan_lib.is_done(run_dir):
      log(f"{where}: done, skipped")
      continue
    start_step = _last_step(run_dir) if (run_dir / metrics.METRICS_FILE).exists() else 0
    log(f"{where}: {'resuming after step ' + str(start_step) if start_step else 'starting'}, "
        f"{run.steps} steps, {run.flops:.3g} FLOPs")
    wall_file = run_dir / "sweep_wall.json"
    t0 = time.time()
    rc = _run_logged(plan_lib.train_command(run, spec, str(run_dir), python), run_dir / "train.log")
    # Wall time (training + probes), summed over the attempts at this run.
    previous = json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else 0.0
    wall_file.write_text(json.dumps({"wall_s": previous + time.time() - t0}))
    last = _last_step(run_dir)
    if rc != 0 or last < run.steps:
      raise UserError(f"{run.name} stopped at step {last} of {run.steps} (exit {rc}); see {run_dir / 'train.log'}; "
                      "rerun the same sweep command to resume it")
    (run_dir / plan_lib.DONE_FILE).write_text(json.dumps({"steps": run.steps, "wall_s": previous + time.time() - t0}))
    log(f"{where}: finished in {previous + time.time() - t0:.0f} s")

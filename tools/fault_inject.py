r"""Fault injection: N random `kill -9`s of a tiny training run, each followed by a resume.

  python tools/fault_inject.py --kills=50 --workdir=runs/fault_inject     (make fault-inject)

A reference run trains straight through. The faulted run is started, killed with SIGKILL at a
random moment (after 1-5 newly logged steps plus 0-`max_delay` seconds; often inside an async
checkpoint write: one every 2 steps), and restarted, `--kills` times; then it runs to the end. Passes (exit 0) when the final
params equal the reference's bitwise and every step's last metrics row matches the reference's
on the deterministic keys. Runs on CPU (JAX_PLATFORMS=cpu, one device).

  python tools/fault_inject.py --steps=12 --kill_after=5,6,7 \
      --override="--config.train.phases=({'steps': 6}, {'data.seq_len': 128})"

kills right after the given steps are logged (here around a phase boundary); `--override`
(repeatable) passes config flags to both runs.

  python tools/fault_inject.py --command=contrast --init_from=runs/cb --kills=5

does the same to the contrastive stage (configs/contrast.py:tiny_simcse on the built-in corpus, dropout on)
started from the pretraining run (or `export import` folder) `--init_from`.
"""

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Keys of a metrics row that must match bitwise (timing keys differ from run to run).
DETERMINISTIC = ("loss", "accuracy", "grad_norm", "learning_rate", "num_targets", "tokens_seen")


def _cmd(workdir: pathlib.Path, source: str, steps: int, overrides: list[str]) -> list[str]:
  """The command under test: tiny pretraining with the tokenizer `source`, or the contrastive stage (SimCSE)
  started from the run or import `source`."""
  if source.endswith(".model"):
    head = ["crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--config.data.tokenizer={source}"]
  else:
    head = [
        "crossbert_jax.contrast", "--config=configs/contrast.py:tiny_simcse", f"--config.contrast.init_from={source}",
        "--config.data.path=builtin", "--config.train.batch_size=8"]
  return [
      sys.executable, "-m", *head, f"--workdir={workdir}", f"--config.train.steps={steps}",
      "--config.train.warmup_steps=5", "--config.checkpoint.every_steps=2", "--config.checkpoint.keep=3",
      "--config.metrics.log_every=1", "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False",
      *overrides]


def one_cpu_env() -> dict[str, str]:
  """One CPU device; the caller's other XLA flags are kept (a fake device count is dropped)."""
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                   if not f.startswith("--xla_force_host_platform_device_count"))
  return {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def _rows(workdir: pathlib.Path) -> int:
  path = workdir / "metrics.jsonl"
  return len(path.read_bytes().splitlines()) if path.exists() else 0


def _last_step(workdir: pathlib.Path) -> int:
  """The step of the newest metrics row (the running process's latest step); 0 before any."""
  path = workdir / "metrics.jsonl"
  lines = path.read_bytes().splitlines() if path.exists() else []
  try:
    return json.loads(lines[-1])["step"] if lines else 0
  except ValueError:  # A row being written.
    return 0


def _last_rows(workdir: pathlib.Path) -> dict[int, dict]:
  from crossbert_jax.run import metrics
  return {r["step"]: r for r in metrics.read_metrics(str(workdir))}  # A re-run step: the last row wins.


def _params(workdir: pathlib.Path, step: int) -> dict:
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  state = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "state")
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(state["params"])}


def _saving(workdir: pathlib.Path) -> bool:
  ckpts = workdir / "checkpoints"
  return ckpts.exists() and any("tmp" in p.name for p in ckpts.iterdir())


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--command", choices=("train", "contrast"), default="train",
                      help="The command killed: tiny pretraining, or the contrastive stage (needs --init_from).")
  parser.add_argument("--init_from", default="",
                      help="--command=contrast: the pretraining run or import it starts from.")
  parser.add_argument("--kills", type=int, default=50)
  parser.add_argument("--steps", type=int, default=0, help="Train steps (0: 6 per kill + 10).")
  parser.add_argument("--workdir", default="runs/fault_inject")
  parser.add_argument("--max_delay", type=float, default=0.3, help="Extra random delay before a kill, seconds.")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--kill_after", default="", help="Comma-separated steps: kill once each is logged "
                      "(instead of --kills random kills).")
  parser.add_argument("--override", action="append", default=[], help="A config flag for both runs (repeatable).")
  args = parser.parse_args()
  if args.command == "contrast":  # Refused before anything is deleted or started.
    if not (pathlib.Path(args.init_from) / "config.json").is_file():
      print(
          f"fault_inject: --init_from={args.init_from!r} is not a pretraining run or import (no config.json); "
          "pass the workdir of a finished `train` run", file=sys.stderr)
      return 2
  elif args.init_from:
    print("fault_inject: --init_from is for --command=contrast; drop it or add --command=contrast", file=sys.stderr)
    return 2
  kill_after = [int(s) for s in args.kill_after.split(",") if s]
  if kill_after:
    args.kills = len(kill_after)
  rng = random.Random(args.seed)
  steps = args.steps or 6 * args.kills + 10
  root = pathlib.Path(args.workdir).resolve()
  shutil.rmtree(root, ignore_errors=True)
  root.mkdir(parents=True)
  if args.command == "contrast":
    source = str(pathlib.Path(args.init_from).resolve())
  else:
    from crossbert_jax.data import corpus, tokenizer
    source = str(root / "spm.model")
    tokenizer.train_tokenizer(corpus.builtin_documents()[:3000], 512, source)

  t0 = time.time()
  ref = subprocess.run(_cmd(root / "reference", source, steps, args.override), cwd=ROOT, env=one_cpu_env(),
                       capture_output=True, text=True)
  if ref.returncode != 0:
    print(f"fault_inject: the reference run failed ({ref.returncode}):\n{ref.stderr[-3000:]}")
    return 1
  faulted = root / "faulted"
  kills, during_save, kill_steps = 0, 0, []
  while kills < args.kills:
    target = _rows(faulted) + rng.randint(1, 5)
    done = (lambda: _last_step(faulted) >= kill_after[kills]) if kill_after else (lambda: _rows(faulted) >= target)
    proc = subprocess.Popen(_cmd(faulted, source, steps, args.override), cwd=ROOT, env=one_cpu_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not done():
      time.sleep(0.05)
    if proc.poll() is None:
      time.sleep(rng.uniform(0.0, args.max_delay))
    if proc.poll() is not None:  # Finished (or failed) before the kill.
      err = proc.stderr.read()
      if proc.returncode != 0:
        print(f"fault_inject: a resumed run failed ({proc.returncode}):\n{err[-3000:]}")
        return 1
      break
    saving = _saving(faulted)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    kills += 1
    during_save += saving
    kill_steps.append(max(_last_rows(faulted), default=0))
    print(f"kill {kills}/{args.kills}: after step {kill_steps[-1]}{' (during a checkpoint write)' if saving else ''}",
          flush=True)
  final = subprocess.run(_cmd(faulted, source, steps, args.override), cwd=ROOT, env=one_cpu_env(), capture_output=True,
                         text=True)
  if final.returncode != 0:
    print(f"fault_inject: the last resume failed ({final.returncode}):\n{final.stderr[-3000:]}")
    return 1

  problems = []
  a, b = _params(root / "reference", steps), _params(faulted, steps)
  import numpy as np
  diff = [k for k in a if k not in b or a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k])]
  if diff or a.keys() != b.keys():
    problems.append(f"final params differ: {diff[:5]}")
  ref_rows, got_rows = _last_rows(root / "reference"), _last_rows(faulted)
  if sorted(ref_rows) != sorted(got_rows):
    problems.append(f"logged steps differ: {sorted(set(ref_rows) ^ set(got_rows))[:10]}")
  for s in sorted(set(ref_rows) & set(got_rows)):
    bad = [k for k in DETERMINISTIC if ref_rows[s].get(k) != got_rows[s].get(k)]
    if bad:
      problems.append(
          f"step {s}: {bad} differ: {[ref_rows[s].get(k) for k in bad]} != {[got_rows[s].get(k) for k in bad]}")
      break
  summary = {
      "kills": kills, "during_checkpoint_write": during_save, "steps": steps, "seconds": round(time.time() - t0),
      "params_bitwise_equal": not diff, "metrics_rows_equal": not problems, "kill_steps": kill_steps}
  print("fault_inject: " + json.dumps(summary))
  if problems:
    print("fault_inject: FAILED: " + "; ".join(problems))
    return 1
  print(f"fault_inject: passed: {kills} kills ({during_save} during a checkpoint write), final params bitwise "
        f"equal and all {len(ref_rows)} metrics rows equal to the uninterrupted run")
  return 0


if __name__ == "__main__":
  sys.exit(main())

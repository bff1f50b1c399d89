r"""Fault injection for the sweep: N random `kill -9`s of a tiny 2-run sweep, each followed by a rerun.

  python tools/fault_inject_sweep.py --kills=20 --root=runs/fault_inject_sweep     (make fault-inject-sweep)

The sweep (two objectives at one tiny size, a checkpoint every 2 steps) is started, killed with
SIGKILL at a random moment once a trainer is running (0-`max_delay` seconds later; the sweep alone
is killed, as an OOM killer or a lost shell would), and rerun, `--kills` times; then it runs to
the end. Passes (exit 0) when after every kill no process of the sweep is left (its trainer died
with it), and at the end every planned run is recorded done exactly once, each step of each run
is in its metrics, a rerun skips every run, and every run's wall time is positive. The tokenizer
is trained before the faults (its own command). Runs on CPU (JAX_PLATFORMS=cpu, one device).
"""

import argparse
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.fault_inject import one_cpu_env  # noqa: E402  (one CPU device, the caller's other XLA flags)

# FLOPS: the size's budget (a number, or a list with WSD); WSD: the spec's wsd value (None: no branches).
SPEC = '''
SIZES = {"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=FLOPS)}


def get_spec():
  return dict(
      name="tiny_sweep", variant="tiny", data_path="builtin", tokenizer_vocab_size=512,
      common={"model.vocab_size": 512, "data.seq_len": 32, "train.batch_size": 8, "checkpoint.every_steps": 2,
              "metrics.tensorboard": False},
      sizes=SIZES,
      objectives={"bert_r15": dict(objective="mlm", ratio=0.15, views=1),
                  "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2)},
      seeds=[0], warmup_fraction=0.1, wsd=WSD,
      probes=dict(count=0, tasks="stsb", data_dir="", max_examples=50),
  )
'''


def train_tokenizer(root: pathlib.Path, existing: str = "") -> None:
  """The sweep's tokenizer (ROOT/tokenizer/spm.model), trained as the sweep would train it (or a copy
  of `existing`, a 512-piece model of the built-in corpus)."""
  from crossbert_jax.scaling import runner  # pylint: disable=g-import-not-at-top
  if existing:
    runner.tokenizer_path(root).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(existing, runner.tokenizer_path(root))
    return
  cmd = runner.tokenizer_command({"data_path": "builtin", "tokenizer_vocab_size": 512}, root, sys.executable)
  subprocess.run(cmd, cwd=ROOT, env=one_cpu_env(), check=True, capture_output=True, timeout=300)


def processes_under(root: pathlib.Path) -> list[int]:
  """Pids of live processes whose command line names `root` (the sweep's trainers and tokenizer)."""
  needle, out = str(root).encode(), []
  for p in pathlib.Path("/proc").iterdir():
    if not p.name.isdigit() or int(p.name) == os.getpid():
      continue
    try:
      cmdline = (p / "cmdline").read_bytes()
      state = next((l for l in (p / "status").read_text().splitlines() if l.startswith("State:")), "")
    except OSError:
      continue
    if needle in cmdline and "zombie" not in state:
      out.append(int(p.name))
  return out


def assert_no_orphans(root: pathlib.Path, timeout: float = 20.0) -> None:
  """Fails if a process of the sweep outlives it by more than `timeout` seconds."""
  deadline = time.time() + timeout
  while (left := processes_under(root)) and time.time() < deadline:
    time.sleep(0.2)
  if left:
    raise AssertionError(f"processes of the killed sweep in {root} are still running: {left}")


def wait_for_training(root: pathlib.Path, proc: subprocess.Popen, timeout: float = 300.0) -> bool:
  """Waits until a trainer of the sweep runs; False if the sweep exited first."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      return False
    if any("crossbert_jax.train" in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
           for pid in processes_under(root)
           if os.path.exists(f"/proc/{pid}/cmdline")):
      return True
    time.sleep(0.2)
  raise AssertionError(f"no trainer of the sweep in {root} started within {timeout:.0f} s")


def _sweep(spec: pathlib.Path, root: pathlib.Path) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "crossbert_jax.sweep", f"--spec={spec}", f"--root={root}"], cwd=ROOT,
                          env=one_cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(kills: int, root: pathlib.Path, seed: int, max_delay: float, flops: float, tokenizer: str = "") -> None:
  """The faulted sweep; raises AssertionError on a failed check."""
  from crossbert_jax.scaling import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from crossbert_jax.run import metrics  # pylint: disable=g-import-not-at-top

  rng = random.Random(seed)
  if root.exists():
    shutil.rmtree(root)
  root.mkdir(parents=True)
  spec = root.parent / f"{root.name}_spec.py"
  spec.write_text(SPEC.replace("FLOPS", repr(flops)).replace("WSD", "None"))
  train_tokenizer(root, tokenizer)
  done_kills = 0
  for k in range(kills):
    proc = _sweep(spec, root)
    if not wait_for_training(root, proc):
      proc.communicate()
      break
    time.sleep(rng.uniform(0, max_delay))
    proc.kill()
    proc.communicate(timeout=60)
    assert_no_orphans(root)
    done_kills += 1
    print(f"kill {k + 1}/{kills}: sweep killed; no process left", flush=True)
  proc = _sweep(spec, root)
  out, err = proc.communicate(timeout=1800)
  assert proc.returncode == 0, f"the final sweep failed ({proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}"
  _, runs = plan_lib.load_plan(root)
  names = sorted(p.name for p in (root / "runs").iterdir() if p.is_dir())
  assert names == sorted(r.name for r in runs), f"run folders {names} vs the plan's {[r.name for r in runs]}"
  for r in runs:
    run_dir = root / "runs" / r.name
    assert plan_lib.is_done(run_dir), f"{r.name} is not done"
    steps = {row["step"] for row in metrics.read_metrics(str(run_dir))}
    assert steps == set(range(1, r.end_step + 1)), f"{r.name}: steps {sorted(steps)}"
    wall = json.loads((run_dir / "sweep_wall.json").read_text())["wall_s"]
    assert wall > 0, f"{r.name}: wall time {wall}"
  again = _sweep(spec, root)
  out, _ = again.communicate(timeout=600)
  assert again.returncode == 0 and out.count("done, skipped") == len(runs), out
  print(f"ok: {done_kills} kills, {len(runs)} runs each finished exactly once, no orphans", flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--kills", type=int, default=20)
  parser.add_argument("--root", default="runs/fault_inject_sweep")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--max_delay", type=float, default=8.0, help="Seconds after a trainer starts, at most.")
  parser.add_argument("--flops", type=float, default=6e10, help="The size's FLOPs budget (more: longer runs).")
  args = parser.parse_args()
  try:
    run(args.kills, pathlib.Path(args.root).absolute(), args.seed, args.max_delay, args.flops)
  except AssertionError as e:
    print(f"FAILED: {e}", file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == "__main__":
  main()

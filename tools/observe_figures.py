r"""The figures of docs/training.md, "Observing a run": what the profiler costs, and goodput.

  python tools/observe_figures.py [idle] [window] [demo] [kill]    (from the repo root; default: all)

  idle  the tiny train step with the profiler configured but idle (its per-step calls, as
        Trainer.train makes them) vs without, side by side in one process: alternating blocks
        of 20 steps, 10 blocks each; the per-block ratio.
  window a tiny 120-step run tracing steps 110-112: the median step_time (metrics.jsonl) of
        steps 111-112 (110's holds start_trace) against steps 10-100's.
  demo  `make demo`'s training run (tiny CrossBERT, 300 steps, vocabulary 1024): its done line.
  kill  a tiny 200-step run killed (SIGKILL) after step 150 (its checkpoint: step 100), then
        resumed: the done line and each start's seconds by cause (WORKDIR/goodput.json).
Runs go to /tmp/observe_figures. The host's load average is printed before and after: quote the
figures only from an idle host.
"""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = "/tmp/observe_figures"
ENV = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}


def idle() -> None:
  """Profiler configured-but-idle vs off, in one process."""
  import jax  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top

  from crossbert_jax.core import config as config_lib, xla_flags  # pylint: disable=g-import-not-at-top
  xla_flags.set_cpu_flags()
  from crossbert_jax.run import profile  # pylint: disable=g-import-not-at-top
  from crossbert_jax.perf import benchmark  # pylint: disable=g-import-not-at-top
  from crossbert_jax.training import program as program_lib, sharding  # pylint: disable=g-import-not-at-top

  c = benchmark.case_config(config_lib.get_config("crossbert", "tiny"), lambda c: None, 0)
  program = program_lib.TrainProgram(c, sharding.make_mesh(c.mesh, devices=[jax.devices()[0]]))
  state, batch = program.init_state(), program.global_batch(benchmark.random_batch(c))
  window = config_lib.get_config("crossbert", "tiny").profile
  window.start_step = 299  # Configured, never reached.
  prof = profile.Profiler(window, epath.Path(OUT) / "idle", 1, print)

  def block(with_profiler: bool, n: int = 20) -> float:
    nonlocal state
    times = []
    for i in range(n):
      t0 = time.perf_counter()
      if with_profiler:
        prof.before_step(i)
        with prof.annotate(i):
          state, out = program.step(state, batch)
        prof.after_step(i, out)
        prof.traced(i)
      else:
        state, out = program.step(state, batch)
      jax.block_until_ready(out)
      times.append(time.perf_counter() - t0)
    return statistics.median(times)

  block(False)
  block(True)
  off, on = zip(*[(block(False), block(True)) for _ in range(10)])
  ratios = [b / a for a, b in zip(off, on)]
  print(f"idle: median ms per step, off {1e3 * statistics.median(off):.2f}, configured-idle "
        f"{1e3 * statistics.median(on):.2f}; idle/off per block median {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f})")


def _train(workdir: str, tok: str, *extra: str, wait: bool = True):
  cmd = [
      sys.executable, "-m", "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
      f"--config.data.tokenizer={tok}", "--config.metrics.progress_bar=False", *extra]
  if not wait:
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, check=True)


def _last_step(workdir: str) -> int:
  path = os.path.join(workdir, "metrics.jsonl")
  return max((json.loads(line)["step"] for line in open(path)), default=0) if os.path.exists(path) else 0


def _done(proc) -> str:
  return next(line for line in proc.stdout.splitlines() if line.startswith("done:"))


def goodput(which: list[str]) -> None:
  tok = f"{OUT}/tok/spm.model"
  subprocess.run([
      sys.executable, "-m", "crossbert_jax.tokenizer", "--input=builtin", "--vocab_size=1024", f"--output={tok}"],
                 cwd=ROOT, env=ENV, check=True, capture_output=True)
  if "window" in which:
    _train(f"{OUT}/window", tok, "--config.train.steps=120", "--config.profile.start_step=110")
    rows = {r["step"]: r for r in map(json.loads, open(f"{OUT}/window/metrics.jsonl")) if "step_time" in r}
    outside = statistics.median(rows[s]["step_time"] for s in range(10, 101))
    inside = statistics.median(rows[s]["step_time"] for s in (111, 112))
    print(f"window: median step ms, steps 10-100 {1e3 * outside:.1f}, traced steps 111-112 {1e3 * inside:.1f}")
  if "demo" in which:
    print("demo:", _done(_train(f"{OUT}/demo", tok)))
  if "kill" in which:
    run = f"{OUT}/kill"
    proc = _train(run, tok, "--config.train.steps=200", wait=False)
    while _last_step(run) < 150:
      time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = _last_step(run)
    print(f"kill: killed after step {killed};", _done(_train(run, tok, "--config.train.steps=200")))
    for attempt in json.load(open(f"{run}/goodput.json"))["attempts"]:
      print("  ", attempt["status"], {k: round(v, 2) for k, v in attempt["seconds"].items()})


def main() -> None:
  which = sys.argv[1:] or ["idle", "window", "demo", "kill"]
  shutil.rmtree(OUT, ignore_errors=True)
  os.makedirs(OUT)
  print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg())
  if "idle" in which:
    idle()
  if {"window", "demo", "kill"} & set(which):
    goodput(which)
  print("load", os.getloadavg())


if __name__ == "__main__":
  main()

r"""Run a scaling sweep: a ladder of sizes x objectives x seeds at equal FLOPs per size.

  python -m crossbert_jax.sweep --spec=experiments/gutenberg_cpu.py --root=runs/sweeps/gutenberg_cpu \
      [--dry_run] [--print_commands] [--flops_scale=0.01] [--executor=local|ray|slurm] [--ray_address=HOST:PORT]

Run it from the repo root (a spec's paths are relative to it). Library: crossbert_jax.scaling.
Manual: docs/scaling_sweeps.md.
"""

import functools
import math
import os
import pathlib
import shlex
import signal
import sys

from absl import app, flags

from crossbert_jax.core.errors import (EXIT_STOPPED, UserError, exit_on_user_error, no_positional, parse_flags_or_exit,
                                       require)
from crossbert_jax.scaling import lease
from crossbert_jax.scaling import placement
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import spec as spec_lib
from crossbert_jax.scaling import runner

_SPEC = flags.DEFINE_string("spec", None, "Sweep spec file, e.g. experiments/gutenberg_cpu.py.")
_ROOT = flags.DEFINE_string("root", None, "Sweep directory: plan.json, tokenizer/, runs/<name>/.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Plan and print the runs (steps, FLOPs, tokens); train nothing.")
_PRINT = flags.DEFINE_bool("print_commands", False, "Print the tokenizer and per-run train commands; run nothing.")
_SCALE = flags.DEFINE_float("flops_scale", 1.0, "Multiply every size's FLOPs budget (e.g. 0.01 for a smoke run).")
_EXECUTOR = flags.DEFINE_string(
    "executor", "local", "local: one run after another here; ray: every run on a Ray "
    "cluster, runs at once; slurm: every run as a batch job (docs/scaling_sweeps.md).")
_RAY_ADDRESS = flags.DEFINE_string(
    "ray_address", "", "--executor=ray: the cluster (host:port); default RAY_ADDRESS, "
    "else the cluster this machine is part of ('auto').")


@exit_on_user_error
def main(argv):
  no_positional(argv, "; use --spec=... --root=...")
  require("spec", "root", advice=", e.g. --spec=experiments/gutenberg_cpu.py --root=runs/sweeps/x")
  if not (_SCALE.value > 0 and math.isfinite(_SCALE.value)):
    raise UserError(f"--flops_scale={_SCALE.value}: must be a positive finite number (e.g. 0.01 for a smoke run)")
  root = pathlib.Path(_ROOT.value).absolute()
  if root.exists() and not root.is_dir():
    raise UserError(f"--root={_ROOT.value} is a file: give a folder for the sweep")
  executor = placement.check_executor(_EXECUTOR.value)
  spec = spec_lib.load_spec(_SPEC.value)
  placement.check_spec(spec)
  for size in spec["sizes"].values():
    scaled = [b * _SCALE.value for b in plan_lib.budgets(size)]
    size["flops"] = scaled if isinstance(size["flops"], (list, tuple)) else scaled[0]
  runs = plan_lib.plan(spec, str(runner.tokenizer_path(root)))
  if _PRINT.value:
    print(shlex.join(runner.tokenizer_command(spec, root)))
    for run in runs:
      print(shlex.join(plan_lib.train_command(run, spec, str(root / "runs" / run.name))))
    return
  print(f"{'run':<40} {'kind':<6} {'steps':>11} {'FLOPs':>9} {'tokens':>9}")
  for run in runs:
    span = f"{run.fork_step}-{run.steps}" if run.kind == "branch" else str(run.end_step)
    print(f"{run.name:<40} {run.kind:<6} {span:>11} {run.cost_flops:>9.3g} {run.end_step * run.tokens_per_step:>9.3g}")
  cost, independent = plan_lib.total_cost(runs)
  if any(r.kind == "stable" for r in runs):
    stable = sum(r.cost_flops for r in runs if r.kind == "stable")
    print(f"total cost: {cost:.3g} FLOPs (stable runs {stable:.3g} + decay branches {cost - stable:.3g}); "
          f"as independent runs: {independent:.3g} FLOPs ({independent / cost:.2f}x)")
  else:
    print(f"total cost: {cost:.3g} FLOPs in {len(runs)} independent runs")
  places = placement.placements(spec, runs) if executor != "local" else []
  if executor == "slurm":
    from crossbert_jax.scaling import slurm_executor  # pylint: disable=g-import-not-at-top
    slurm_executor.check_placements(places)
    if not _DRY_RUN.value:
      from crossbert_jax.run import slurm_jobs  # pylint: disable=g-import-not-at-top
      slurm_jobs.check_tools()
  if _DRY_RUN.value:  # What the real run would say of the root's plan (a refusal is the same line).
    if added := plan_lib.check_plan(root, spec, runs, _SPEC.value):
      print(f"would extend the root's plan: {added} new run(s); its {len(runs) - added} runs are unchanged")
    if executor != "local":
      print("\n".join(placement.plan_lines(places, executor, spec)))
    if executor == "slurm":
      slurm_executor.submit(places, spec, root, os.getcwd(), sys.executable, dry_run=True)
    return
  if executor != "local":
    _run_on_cluster(executor, spec, runs, places, root)
    return
  with lease.hold(root):
    _run_here(spec, runs, root)


def _run_here(spec: dict, runs: list, root: pathlib.Path) -> None:
  """--executor=local: every run here, one after another (the driver's lease held)."""
  _save(root, spec, runs)

  def stop_between_runs(signum, _):  # While a trainer runs, the runner forwards the signal to it instead.
    raise runner.Stopped(f"{signal.Signals(signum).name} received between runs; rerun the same sweep command to resume")

  signal.signal(signal.SIGTERM, stop_between_runs)
  signal.signal(signal.SIGINT, stop_between_runs)
  try:
    runner.run_sweep(spec, runs, root)
  except runner.Stopped as e:
    print(f"stopped: {e} (exit {EXIT_STOPPED})", file=sys.stderr, flush=True)
    sys.exit(EXIT_STOPPED)
  print(f"sweep done: {len(runs)} runs in {root}; report: python -m crossbert_jax.report --root={root} --output=DIR")


def _run_on_cluster(executor: str, spec: dict, runs: list, places: list, root: pathlib.Path) -> None:
  """--executor=ray|slurm: refuses what the cluster cannot run before starting anything, then dispatches."""
  if executor == "slurm":
    from crossbert_jax.scaling import slurm_executor  # pylint: disable=g-import-not-at-top
    with lease.hold(root):
      _save(root, spec, runs)
      runner.ensure_tokenizer(spec, root)
      failed = slurm_executor.submit(places, spec, root, os.getcwd(), sys.executable)
    _end(
        failed, f"sweep submitted: {len(runs)} runs in {root}; rerun the same command to see which are done "
        "and to resubmit stopped ones")
    return
  from crossbert_jax.scaling import ray_executor  # pylint: disable=g-import-not-at-top
  if _RAY_ADDRESS.value:
    address, source = _RAY_ADDRESS.value, f"--ray_address={_RAY_ADDRESS.value}"
  elif env := os.environ.get("RAY_ADDRESS"):
    address, source = env, f"RAY_ADDRESS={env} (from the environment; --ray_address overrides it)"
  else:
    address, source = "auto", "--ray_address=auto (no --ray_address, no RAY_ADDRESS: the cluster on this machine)"
  ray_executor.connect(address, source)
  ray_executor.check_capacity(places, address)
  ray_executor.check_shared_root(root)
  with lease.hold(root):
    _drive_ray(ray_executor, spec, runs, places, root)


def _drive_ray(ray_executor, spec: dict, runs: list, places: list, root: pathlib.Path) -> None:
  """Trains the tokenizer, then drives every run on the cluster. A stop signal only notes itself (raising in a
  handler would raise inside Ray's C++ wait); the driver acts on it between waits: SIGTERM to every trainer
  (each saves), their attempts closed as "stopped", exit 75."""
  requested: list[str] = []
  note = lambda signum, _: requested.append(signal.Signals(signum).name)
  signal.signal(signal.SIGTERM, note)
  signal.signal(signal.SIGINT, note)
  driver = None
  try:
    _save(root, spec, runs)
    runner.ensure_tokenizer(spec, root)  # Its trainer's stop raises Stopped itself.
    if requested:
      raise runner.Stopped(f"{requested[0]} received; rerun the same sweep command to resume")
    driver = ray_executor.Driver(spec, places, root, functools.partial(print, flush=True), requested)
    failed = driver.drive()
  except runner.Stopped as e:
    if driver is not None:
      driver.stop(str(e).split(";")[0])
    print(f"stopped: {e} (exit {EXIT_STOPPED})", file=sys.stderr, flush=True)
    sys.exit(EXIT_STOPPED)
  _end(failed, f"sweep done: {len(runs)} runs in {root}; report: python -m crossbert_jax.report --root={root} "
       "--output=DIR")


def _save(root: pathlib.Path, spec: dict, runs: list) -> None:
  if added := plan_lib.save_plan(root, spec, runs, _SPEC.value):
    print(f"plan extended: {added} new run(s); the root's {len(runs) - added} runs are unchanged")


def _end(failed: list[str], ok: str) -> None:
  """The sweep's last line: `ok`, or the failed runs in one line and exit 1."""
  if failed:
    print(f"sweep failed: {len(failed)} run(s): {'; '.join(failed)}", file=sys.stderr, flush=True)
    sys.exit(1)
  print(ok, flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)

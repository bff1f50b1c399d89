r"""Scaling sweep: a ladder of sizes x objectives x seeds at equal FLOPs per size.

  python -m crossbert_jax.sweep --spec=experiments/gutenberg_cpu.py --root=runs/sweeps/gutenberg_cpu \
      [--dry_run] [--print_commands] [--flops_scale=0.01]

Writes ROOT/plan.json, trains ROOT/tokenizer/spm.model if missing, then each run in
ROOT/runs/<name> one after another (finished runs skipped, interrupted ones resumed). Run it from
the repo root (the spec's paths are relative to it). `--print_commands` prints the per-run
commands for a pod launcher instead. Details: docs/scaling_sweeps.md.
"""

import pathlib
import shlex

from absl import app, flags

from crossbert_jax.core.errors import UserError, exit_on_user_error, parse_flags_or_exit
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import runner

_SPEC = flags.DEFINE_string("spec", None, "Sweep spec file, e.g. experiments/gutenberg_cpu.py.")
_ROOT = flags.DEFINE_string("root", None, "Sweep directory: plan.json, tokenizer/, runs/<name>/.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Plan and print the runs (steps, FLOPs, tokens); train nothing.")
_PRINT = flags.DEFINE_bool("print_commands", False, "Print the tokenizer and per-run train commands; run nothing.")
_SCALE = flags.DEFINE_float("flops_scale", 1.0, "Multiply every size's FLOPs budget (e.g. 0.01 for a smoke run).")


@exit_on_user_error
def _main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; use --spec=... --root=...")
  if not _SPEC.value or not _ROOT.value:
    raise UserError("--spec and --root are required, e.g. --spec=experiments/gutenberg_cpu.py --root=runs/sweeps/x")
  if not _SCALE.value > 0:
    raise UserError(f"--flops_scale={_SCALE.value}: must be positive")
  spec = plan_lib.load_spec(_SPEC.value)
  for size in spec["sizes"].values():
    size["flops"] *= _SCALE.value
  root = pathlib.Path(_ROOT.value).absolute()
  runs = plan_lib.plan(spec, str(runner.tokenizer_path(root)))
  if _PRINT.value:
    print(shlex.join(runner.tokenizer_command(spec, root)))
    for run in runs:
      print(shlex.join(plan_lib.train_command(run, spec, str(root / "runs" / run.name))))
    return
  print(f"{'run':<34} {'steps':>6} {'FLOPs':>9} {'tokens':>9}")
  for run in runs:
    print(f"{run.name:<34} {run.steps:>6} {run.flops:>9.3g} {run.steps * run.tokens_per_step:>9.3g}")
  if _DRY_RUN.value:
    return
  plan_lib.save_plan(root, spec, runs)
  runner.run_sweep(spec, runs, root)
  print(f"sweep done: {len(runs)} runs in {root}; report: python -m crossbert_jax.report --root={root} --output=DIR")


def main():
  app.run(_main, flags_parser=parse_flags_or_exit)


if __name__ == "__main__":
  main()

r"""Fine-tuned GLUE: ModernBERT's recipe, trained in JAX, one column per encoder, the frozen score beside it.

  python -m crossbert_jax.finetune --task=rte --workdir=RUN --output_dir=runs/ft --data_dir=../shared/data
  python -m crossbert_jax.finetune --task=all --hf=answerdotai/ModernBERT-base-folder --output_dir=runs/ft_mb

Every trial (a task, one point of the --learning_rates x --epochs x --weight_decays grid, a seed) is a folder
under --output_dir/trials that resumes exactly and is never trained again once finished; the command with its
grid narrowed to one point runs one trial (for an executor); --executor=ray runs each trial as its own process on
a Ray cluster (finetuning/dispatch.py), --executor=slurm as its own batch job (finetuning/slurm.py). Writes --output_dir/glue_finetuned.{json,md}.
Library: crossbert_jax.finetuning. Manual: docs/evaluation.md#fine-tuned-glue-.
"""

import functools
import os
import shlex
import sys
from typing import Sequence

import jax
from absl import app
from absl import flags
from absl import logging
from etils import epath

from crossbert_jax.core.errors import (EXIT_STOPPED, UserError, exit_on_user_error, no_positional, parse_flags_or_exit,
                                       require)
from crossbert_jax.evaluation.columns import check_distinct
from crossbert_jax.finetuning import classifier, driver, recipe, sources, table
from crossbert_jax.finetuning import trial as trial_lib

_R = recipe


def _define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importers get no stray flags)."""
  if "task" in flags.FLAGS:
    return
  flags.DEFINE_string("task", None, "GLUE task(s), comma-separated (cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte) or all.")
  flags.DEFINE_multi_string("workdir", [], "A pretraining run to fine-tune (repeatable: one column each).")
  flags.DEFINE_multi_string("hf", [], "A ModernBERT folder to fine-tune (repeatable).")
  flags.DEFINE_string("output_dir", None, "Where the trials and glue_finetuned.{json,md} go (resumable).")
  flags.DEFINE_string(
      "data_dir", "", "A local copy of nyu-mll/glue (<config>/<split>-*.parquet) or the shared "
      "data root; default: the Hub or its datasets cache.")
  flags.DEFINE_string("tokenizer", "", "--workdir: the run's tokenizer where it is now (default: its data.tokenizer).")
  flags.DEFINE_string("learning_rates", ",".join(f"{v:g}" for v in _R.LEARNING_RATES), "Grid: peak learning rates.")
  flags.DEFINE_string("epochs", ",".join(map(str, _R.EPOCHS)), "Grid: epochs.")
  flags.DEFINE_string("weight_decays", ",".join(f"{v:g}" for v in _R.WEIGHT_DECAYS), "Grid: AdamW weight decays.")
  flags.DEFINE_string("seeds", ",".join(str(s) for s in range(_R.SEEDS)), "Seeds of every grid point.")
  flags.DEFINE_integer("batch_size", _R.BATCH_SIZE, "Rows per step (the recipe: 64).")
  flags.DEFINE_integer("max_length", _R.MAX_LENGTH, "Tokens per row at most, pairs included (the recipe: 256).")
  flags.DEFINE_integer("max_steps", 0, "Steps per trial at most (0: all its epochs); for smoke runs.")
  flags.DEFINE_bool(
      "from_mnli", True, "RTE, MRPC and STS-B start from the best MNLI trial (the recipe); "
      "--nofrom_mnli: from the pretrained encoder.")
  flags.DEFINE_bool(
      "print_trials", False, "Print each trial's own command (one per line, MNLI's first) and exit: "
      "what an executor dispatches, one trial per device; with --executor=slurm, each trial's sbatch line and "
      "batch script.")
  flags.DEFINE_enum("pooling", "mean", list(classifier.POOLINGS), "classifier_pooling: mean or the [CLS] state.")
  flags.DEFINE_enum(
      "executor", "local", ["local", "ray", "slurm"], "local: every trial in this process, one after "
      "another; ray: each trial its own process on a Ray cluster (finetuning/dispatch.py); slurm: each trial its "
      "own batch job, submitted from a login node; rerun to build the table (finetuning/slurm.py).")
  flags.DEFINE_string("ray_address", "auto", "--executor=ray: the cluster's head (host:port); auto: the one here.")
  flags.DEFINE_float("trial_cpus", 1, "--executor=ray|slurm: CPUs each trial holds.")
  flags.DEFINE_float("trial_gpus", 0, "--executor=ray|slurm: GPUs each trial holds (1: one trial per GPU).")
  flags.DEFINE_integer("max_retries", 2, "--executor=ray: starts again of a trial that crashed or lost its host.")
  flags.DEFINE_bool(
      "wandb", False, "Each trial's curves also in Weights & Biases: a run per trial (<task>/<trial>), grouped "
      "by <output folder>/<encoder>/<task>; WANDB_MODE=offline works.")
  flags.DEFINE_string("wandb_project", "crossbert_jax", "--wandb: the W&B project.")
  flags.DEFINE_string("wandb_entity", "", "--wandb: the W&B entity (default: W&B's own).")


def _check(f) -> None:
  if f.batch_size < 1 or f.max_length < 8 or f.max_steps < 0:
    raise UserError(f"--batch_size={f.batch_size} --max_length={f.max_length} --max_steps={f.max_steps}: give a "
                    "batch of 1 or more, a length of 8 or more and max_steps >= 0")


def _trial_commands(f, tasks, grid: recipe.Grid, python: str) -> list[tuple[recipe.Trial, list[str]]]:
  """Each trial and its own command (`python` runs it), MNLI's first (RTE, MRPC and STS-B start from its best)."""
  common = [f"--workdir={w}" for w in f.workdir] + [f"--hf={h}" for h in f.hf] + [
      f"--output_dir={f.output_dir}", f"--batch_size={f.batch_size}", f"--max_length={f.max_length}",
      f"--max_steps={f.max_steps}", f"--pooling={f.pooling}"]
  common += [f"--{k}={getattr(f, k)}" for k in ("data_dir", "tokenizer") if getattr(f, k)]
  common += [] if f.from_mnli else ["--nofrom_mnli"]
  if f.wandb:
    common += [
        "--wandb", f"--wandb_project={f.wandb_project}", *[f"--wandb_entity={f.wandb_entity}"] * bool(f.wandb_entity)]
  return [(t, recipe.trial_argv(t, common, python))
          for name in sorted(tasks, key=lambda t: (t != "mnli", list(tasks).index(t)))
          for t in recipe.trials(name, grid)]


def _mnli_start(f, tasks, mnli: bool) -> bool:
  """Whether RTE, MRPC and STS-B wait for MNLI's trials run by the same command."""
  return mnli and f.from_mnli and "mnli" in tasks


def _jobs(f, tasks, grid: recipe.Grid, srcs: list[sources.Source], python: str = sys.executable) -> list:
  """A dispatch.Job for each trial some encoder has not finished (every trial when `srcs` is empty), its log in
  --output_dir/logs/<task>/<trial>.log."""
  from crossbert_jax.finetuning import dispatch  # pylint: disable=g-import-not-at-top

  out = epath.Path(f.output_dir).absolute()
  return [
      dispatch.Job(t, argv, str(out / "logs" / t.task / f"{t.name}.log"))
      for t, argv in _trial_commands(f, tasks, grid, python)
      if not srcs or not all((out / "trials" / s.key / t.task / t.name / trial_lib.RESULT_FILE).exists() for s in srcs)]


def _failed(failed: list, of: int) -> SystemExit:
  return SystemExit(f"finetune: {len(failed)} of {of} trial(s) failed: " +
                    "; ".join(f"{j.trial.task} {j.trial.name} ({j.outcome})" for j in failed[:5]) +
                    " (their logs under --output_dir/logs); the finished trials are kept: rerun to retry the rest")


def _dispatch(f, tasks, grid: recipe.Grid, srcs: list[sources.Source], mnli: bool) -> None:
  """--executor=ray: the trials not finished yet, each its own process on the cluster (finetuning/dispatch.py)."""
  from crossbert_jax.finetuning import dispatch  # pylint: disable=g-import-not-at-top  (imports Ray)
  from crossbert_jax.scaling import ray_executor, ray_host  # pylint: disable=g-import-not-at-top

  jobs = _jobs(f, tasks, grid, srcs, ray_host.PYTHON)
  if not jobs:
    return
  ray_executor.connect(f.ray_address)
  failed = dispatch.run_on_ray(jobs, ray_host.train, cwd=os.getcwd(), cpus=f.trial_cpus, gpus=f.trial_gpus,
                               max_retries=f.max_retries, mnli_start=_mnli_start(f, tasks, mnli),
                               grace_s=ray_host.STOP_GRACE_S, log=functools.partial(print, flush=True))
  if failed:
    raise _failed(failed, len(jobs))


def _submit_slurm(f, tasks, grid: recipe.Grid, srcs: list[sources.Source], mnli: bool) -> int:
  """--executor=slurm: submits the trials not finished yet (finetuning/slurm.py); how many SLURM holds now."""
  from crossbert_jax.finetuning import slurm  # pylint: disable=g-import-not-at-top
  from crossbert_jax.run import slurm_jobs  # pylint: disable=g-import-not-at-top

  jobs = _jobs(f, tasks, grid, srcs)
  if not jobs:
    return 0
  slurm_jobs.check_tools()
  out = epath.Path(f.output_dir).absolute()
  out.mkdir(parents=True, exist_ok=True)
  submitted = slurm.submit(jobs, out, repo=os.getcwd(), cpus=int(f.trial_cpus), gpus=int(f.trial_gpus),
                           mnli_start=_mnli_start(f, tasks, mnli), log=functools.partial(print, flush=True))
  if submitted.failed:
    raise _failed(submitted.failed, len(jobs))
  print(
      f"finetune: {submitted.held} trial(s) queued or running on SLURM; rerun the same command when they end: it "
      f"builds {f.output_dir}/{table.NAME}.json from the finished trials and resubmits stopped ones", flush=True)
  return submitted.held


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  no_positional(argv, "; every option is a --flag", joined=True)
  f = flags.FLAGS
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save and restore at INFO.
  require("task", "output_dir", advice=" (see `python -m crossbert_jax.finetune --help`)")
  if not f.workdir and not f.hf:
    raise UserError("nothing to fine-tune: pass --workdir=RUN (a pretraining run) and/or --hf=DIR")
  check_distinct([("workdir", w) for w in f.workdir] + [("hf", h) for h in f.hf])
  _check(f)
  if jax.process_count() > 1:
    raise UserError(f"finetune runs on one process ({jax.process_count()} here): a trial builds its batch whole; "
                    "run it on one host (its local devices share the mesh)")
  names, named = driver.parse_tasks(f.task)
  grid = recipe.parse_grid(f.learning_rates, f.epochs, f.weight_decays, f.seeds)
  opts = driver.Options(f.output_dir, f.data_dir, f.batch_size, f.max_length, f.max_steps, f.pooling, f.from_mnli,
                        f.wandb, f.wandb_project, f.wandb_entity)
  driver.check_output_dir(opts, [("--workdir", w) for w in f.workdir] + [("--hf", h) for h in f.hf])
  tasks, skipped, mnli = driver.load_tasks(names, named, f.data_dir, print)
  if f.executor == "slurm":
    from crossbert_jax.finetuning import slurm  # pylint: disable=g-import-not-at-top
    slurm.check_resources(f.trial_cpus, f.trial_gpus)
  if f.print_trials:
    if f.executor == "slurm":
      slurm.submit(_jobs(f, tasks, grid, []),
                   epath.Path(f.output_dir).absolute(), repo=os.getcwd(), cpus=int(f.trial_cpus),
                   gpus=int(f.trial_gpus), mnli_start=_mnli_start(f, tasks, mnli), dry_run=True,
                   log=functools.partial(print, flush=True))
      return
    for _, argv in _trial_commands(f, tasks, grid, sys.executable):
      print(shlex.join(argv), flush=True)
    return
  srcs = [sources.from_workdir(w, f.tokenizer) for w in f.workdir] + [sources.from_hf(h) for h in f.hf]
  srcs = sources.distinct_labels(srcs)
  try:
    if f.executor == "ray":
      driver.check_mnli_start(srcs, tasks, opts, mnli)
      _dispatch(f, tasks, grid, srcs, mnli)  # Then the table below reads every trial back.
    elif f.executor == "slurm":
      driver.check_mnli_start(srcs, tasks, opts, mnli)
      if _submit_slurm(f, tasks, grid, srcs, mnli):
        return  # Trials are queued or running: the table is built by the same command once they end.
    result = driver.run(srcs, tasks, skipped, grid, opts, mnli)
  except trial_lib.Stopped as e:
    print(f"stopped: {e}; rerun the same command to resume (exit {EXIT_STOPPED})", file=sys.stderr, flush=True)
    sys.exit(EXIT_STOPPED)
  print(table.markdown(result), flush=True)
  print(f"wrote {f.output_dir}/{table.NAME}.json and .md", flush=True)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

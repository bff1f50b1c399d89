"""The finetune command's work: tasks and their data checked, the encoders loaded, every trial run or read back,
the MNLI start resolved, the table written.

Everything a bad input can break is checked before the first file is written: the tasks, each task's data
(labels in range, a train split), the encoders, the grid, and an --output_dir holding trials of other
settings. Trials live in O/trials/<encoder key>/<task>/<trial name>/; the table is built from every finished
trial there, so trials dispatched one by one (recipe.trial_argv) and a later run of the whole grid agree.
"""

import dataclasses
import json
from typing import Any, Callable

from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import glue, glue_data
from crossbert_jax.evaluation import tasks as eval_tasks
from crossbert_jax.finetuning import batches as batches_lib
from crossbert_jax.finetuning import recipe, sources, table as table_lib, trial as trial_lib
from crossbert_jax.finetuning import classifier
from crossbert_jax.finetuning.classifier import HeadSpec

SETTINGS_FILE = "finetune_settings.json"


@dataclasses.dataclass(frozen=True)
class Options:
  """The command's settings besides the encoders and the grid."""
  output_dir: str
  data_dir: str = ""
  batch_size: int = recipe.BATCH_SIZE
  max_length: int = recipe.MAX_LENGTH
  max_steps: int = 0  # 0: every epoch of every trial; else at most this many steps per trial (smoke runs).
  pooling: str = "mean"
  from_mnli: bool = True  # RTE, MRPC and STS-B start from the best MNLI trial (when MNLI has data).
  wandb: bool = False  # Each trial's curves also in W&B: a run per trial, grouped by output folder, encoder and task.
  wandb_project: str = "crossbert_jax"
  wandb_entity: str = ""  # "": W&B's default entity.

  def settings(self) -> dict[str, Any]:
    return {
        "batch_size": self.batch_size, "max_length": self.max_length, "max_steps": self.max_steps,
        "pooling": self.pooling}


def parse_tasks(text: str) -> tuple[list[str], bool]:
  """(the tasks, whether they were named one by one): 'all' or names in GLUE's order; unknown names refused."""
  names = [t.strip().lower() for t in str(text).split(",") if t.strip()]
  if not names:
    raise UserError(f"--task={text!r} names no task: give one of {','.join(glue.TASKS)} or all")
  if names == ["all"]:
    return list(glue.TASKS), False
  for n in names:
    if n not in glue.TASKS:
      raise UserError(f"--task: {n!r} is not a GLUE task; use one of {','.join(glue.TASKS)}, or all")
  return [t for t in glue.TASKS if t in names], True


def _has_train(name: str, source: str, data_dir: str) -> bool:
  if source == "copy":
    return "train" in glue_data.local_copy_files(glue.TASKS[name], data_dir)
  if source == "readers":
    return "train" in glue_data.READERS[name][1]
  return True


def load_tasks(names: list[str], named: bool, data_dir: str,
               log: Callable[[str], None]) -> tuple[dict[str, eval_tasks.Task], dict[str, str], bool]:
  """({task: its splits} of the tasks that have data and a train split, {task: why not} of the rest, whether
  MNLI has data: the start of RTE, MRPC and STS-B)."""
  wants_mnli = "mnli" not in names and any(n in recipe.FROM_MNLI for n in names)
  plan, skipped = glue_data.plan(names + ["mnli"] * wants_mnli, data_dir)
  mnli = "mnli" in plan and _has_train("mnli", plan["mnli"], data_dir)
  if wants_mnli:
    plan.pop("mnli", None)
    skipped.pop("mnli", None)
  for name, source in list(plan.items()):
    if not _has_train(name, source, data_dir):
      skipped[name] = "no train split in --data_dir"
      del plan[name]
  if named and skipped:
    name, why = next(iter(skipped.items()))
    raise UserError(f"--task={name} has no data to fine-tune on ({why}): give --data_dir a copy of "
                    f"{glue.HUB_REPO} with its train split, or reach the Hub")
  if not plan:
    raise UserError(f"no GLUE task has data to fine-tune on: give --data_dir a copy of {glue.HUB_REPO} "
                    "(or the shared data root), or reach the Hub")
  if skipped:
    log(f"skipping {len(skipped)} GLUE task(s) without data: " + "; ".join(f"{t} ({w})" for t, w in skipped.items()))
  loaded = {name: glue_data.load(name, source, data_dir) for name, source in plan.items()}
  for name, task in loaded.items():  # Its files changed since the plan looked (e.g. moved away meanwhile).
    if "train" not in task.splits:
      raise UserError(f"--task={name}: its train split is gone from {data_dir or 'its source'} since this command "
                      "started; restore it and rerun")
  return loaded, skipped, mnli


def encode(task: eval_tasks.Task, tok, max_length: int) -> trial_lib.TaskData:
  spec = glue.TASKS[task.name]
  return trial_lib.TaskData(task.name, batches_lib.encode(tok, task.splits["train"], max_length),
                            {row: batches_lib.encode(tok, task.splits[split], max_length) for row, split in spec.rows})


def check_output_dir(opts: Options, inputs: list[tuple[str, str]]) -> epath.Path:
  """The output folder: not an input's place; one holding our trials must have been made with these settings."""
  out = epath.Path(opts.output_dir)
  settings = out / SETTINGS_FILE
  if settings.exists():
    for flag, path in inputs:
      if outputs.relation(outputs.absolute(out), outputs.absolute(path)):
        raise UserError(f"--output_dir {out} overlaps {flag} {path}: choose a folder outside it")
    saved = json.loads(settings.read_text())
    if saved != opts.settings():
      key = next(k for k in opts.settings() if saved.get(k) != opts.settings()[k])
      raise UserError(f"--output_dir {out} holds trials made with {key}={saved.get(key)!r}, not "
                      f"{opts.settings()[key]!r}: give that value again, or choose another --output_dir")
    return out
  outputs.check_added_to(out, "--output_dir", inputs)
  return out


def finished(folder: epath.Path) -> list[dict[str, Any]]:
  """The results of the finished trials under a task's folder, by trial name."""
  if not folder.exists():
    return []
  return [
      json.loads((d / trial_lib.RESULT_FILE).read_text())
      for d in sorted(folder.iterdir())
      if (d / trial_lib.RESULT_FILE).exists()]


def _start(src: sources.Source, name: str, tasks_dir: epath.Path, opts: Options, mnli_ok: bool,
           log: Callable[[str], None]) -> tuple[str, dict[str, Any]]:
  """(what a task's trials start from, its params): the best MNLI trial for RTE/MRPC/STS-B when MNLI runs."""
  start = {"encoder": src.params["encoder"]}
  if "classifier" in src.params and src.params["classifier"]["bias"].shape[0] == trial_lib.num_labels(name):
    start.update(head=src.params["head"], classifier=src.params["classifier"])
  if name not in recipe.FROM_MNLI:
    return "pretrained", start
  if not mnli_ok:
    log(f"{name}: MNLI has no data here (skipped), so {name} starts from the pretrained encoder, not from the "
        "MNLI fine-tuned checkpoint as the recipe does")
    return "pretrained", start
  done = finished(tasks_dir / "mnli")  # MNLI ran first (or `run` checked its trials).
  point, trials = table_lib.best_point(done)
  best = tasks_dir / "mnli" / recipe.Trial(**trials[0]["trial"]).name
  params = trial_lib.read_params(best, classifier.abstract_params(src.spec, HeadSpec(3, opts.pooling)))
  return f"mnli {point} seed {trials[0]['trial']['seed']}", {"encoder": params["encoder"], "head": params["head"]}


def check_mnli_start(srcs: list[sources.Source], tasks: dict[str, eval_tasks.Task], opts: Options, mnli: bool) -> None:
  """RTE, MRPC or STS-B asked without MNLI, while MNLI has data: each encoder must have a finished MNLI trial."""
  out = epath.Path(opts.output_dir)
  waiting = [t for t in tasks if t in recipe.FROM_MNLI] if mnli and opts.from_mnli and "mnli" not in tasks else []
  for src in srcs:
    if waiting and not finished(out / "trials" / src.key / "mnli"):
      raise UserError(f"--task={waiting[0]} starts from the MNLI fine-tuned checkpoint, and {src.label} has no "
                      f"finished MNLI trial in {out}: run --task=mnli first (or --task=all), or pass --nofrom_mnli")


def run(srcs: list[sources.Source], tasks: dict[str, eval_tasks.Task], skipped: dict[str, str], grid: recipe.Grid,
        opts: Options, mnli: bool, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Every trial of every task for every encoder (finished ones read back); the table, written after each task."""
  out = epath.Path(opts.output_dir)
  check_mnli_start(srcs, tasks, opts, mnli)  # Refused before anything is written.
  out.mkdir(parents=True, exist_ok=True)
  outputs.write_atomic(out / SETTINGS_FILE, json.dumps(opts.settings()) + "\n")  # Dispatched trials start at once.
  order = sorted(tasks, key=lambda t: (t != "mnli", list(glue.TASKS).index(t)))
  results: dict[str, dict[str, list]] = {s.label: {} for s in srcs}
  starts: dict[str, dict[str, str]] = {s.label: {} for s in srcs}
  frozen = {
      s.label: table_lib.frozen_scores(epath.Path(s.path) / "glue_table.json" if s.kind == "workdir" else None)
      for s in srcs}
  table = None
  for src in srcs:
    tasks_dir = out / "trials" / src.key
    for name in order:
      data = encode(tasks[name], src.tokenizer, opts.max_length)
      start_label, start = _start(src, name, tasks_dir, opts, mnli and opts.from_mnli, log)
      head = HeadSpec(trial_lib.num_labels(name), opts.pooling)
      todo = recipe.trials(name, grid)
      wandb = trial_lib.Wandb(opts.wandb_project, opts.wandb_entity, f"{out.name}/{src.key}/{name}") if opts.wandb \
          else None
      for i, t in enumerate(todo, 1):
        info = trial_lib.trial_info(t, src.spec, head, start=start_label, source=_source_info(src),
                                    batch_size=opts.batch_size, max_length=opts.max_length, max_steps=opts.max_steps)
        r = trial_lib.run(tasks_dir / name / t.name, info, data, start, log, wandb)
        log(f"[{src.label} {name} {i}/{len(todo)}] {t.name}: " +
            ", ".join(f"{row} {100 * glue.row_score(m):.1f}" for row, m in r["dev"].items()))
      results[src.label][name] = finished(tasks_dir / name)
      starts[src.label][name] = start_label
      table = table_lib.summary(results, starts, frozen, skipped, {**opts.settings(), "seeds": len(grid.seeds)},
                                {t: task.note for t, task in tasks.items()})
      table_lib.write(out, table)
  return table


def _source_info(src: sources.Source) -> dict[str, Any]:
  return {
      "kind": src.kind, "path": src.path, "identity": src.identity, "label": src.label, "tokenizer": src.tokenizer_path,
      "seq_len": src.seq_len}

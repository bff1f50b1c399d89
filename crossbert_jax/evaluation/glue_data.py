"""GLUE task data from, in this order: a local copy in the Hub's layout, the Hub (or its cache), today's files.

1. `--data_dir` holding `<config>/<split>-*.parquet` (what `hf download nyu-mll/glue --repo-type=dataset`
   writes), read by `datasets`' parquet builder;
2. `datasets.load_dataset("nyu-mll/glue", config, revision=HUB_REVISION)`, when the Hub is reachable, or
   offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) when the datasets cache holds the config;
3. `--data_dir` as the shared data root, through evaluation/tasks.py's readers (no MNLI, no QQP there).

A task found nowhere is skipped (named in one line), or refused under --strict.
"""

import glob
import os

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import hub_data
from crossbert_jax.evaluation import glue
from crossbert_jax.evaluation import mteb_run
from crossbert_jax.evaluation import tasks as eval_tasks

# Today's readers per GLUE task: (reader, {our split: the reader's split}, a note on the protocol).
READERS = {
    "cola": ("cola", {"train": "train", "validation": "dev"}, ""),
    "sst2": ("sst2", {"train": "train", "validation": "dev"}, ""),
    "mrpc": ("mrpc", {"train": "train", "validation": "test"},
             "SentEval's MRPC files: fitted on MSR train (4,076), reported on MSR test (1,725), not GLUE's dev"),
    "stsb": ("stsb", {"train": "train", "validation": "dev"}, ""),
    "qnli": ("qnli", {"validation": "dev"}, ""),
    "rte": ("rte", {"train": "train", "validation": "dev"}, ""),}
CV_NOTE = "no train split: 5-fold cross-validation on dev (each fold chooses its own C / k)"


def _offline() -> bool:
  return any(
      os.environ.get(v, "0") not in ("0", "", "false", "False") for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def hub_cached(config: str) -> bool:
  """Whether the datasets cache holds nyu-mll/glue's `config` (what an offline load_dataset reads)."""
  import datasets  # Local: slow to import.

  root = os.path.join(os.path.expanduser(str(datasets.config.HF_DATASETS_CACHE)), "nyu-mll___glue", config)
  return bool(glob.glob(os.path.join(root, "*", "*", "dataset_info.json")))


def _split(task: glue.GlueTask, ds, split: str, where: str, files: list[str] | None = None) -> eval_tasks.Split:
  """One split's texts and labels; `files`: the local copy's parquet files of the split (to name a bad row's)."""
  missing = [c for c in task.columns + ("label",) if c not in ds.column_names]
  if missing:
    raise UserError(f"{where}: {task.config} {split} has no column {missing[0]!r} (columns: "
                    f"{', '.join(ds.column_names)}); give nyu-mll/glue's parquet files as the Hub has them")
  if not len(ds):
    raise UserError(f"{where}: {task.config} {split} has no rows; give nyu-mll/glue's files as the Hub has them")
  for column in task.columns + ("label",):
    values = ds[column]
    row = next((i for i, v in enumerate(values) if v is None), None)
    if row is not None:  # str(None) would be embedded as the text "None".
      at = _file_row(files, row) if files else f"{task.config} {split} row {row}"
      raise UserError(f"{where}: {at} has no {column!r} (null): GLUE has none; copy the file again from "
                      f"{glue.HUB_REPO}, or drop that row")
  labels = np.asarray(ds["label"], np.float32 if not task.num_classes else np.float64)
  glue.check_labels(task, split, labels, where)
  labels = labels if not task.num_classes else labels.astype(np.int64)
  texts = [str(t) for t in ds[task.columns[0]]]
  pairs = [str(t) for t in ds[task.columns[1]]] if task.is_pair else None
  return eval_tasks.Split(texts, labels, pairs)


def _file_row(files: list[str], row: int) -> str:
  """'<config>/<file> row N': the parquet file holding the split's row `row`, and its row there."""
  import pyarrow.parquet as pq  # Local: with datasets.

  for f in files:
    n = pq.ParquetFile(f).metadata.num_rows
    if row < n:
      return f"{epath.Path(f).name} row {row}"
    row -= n
  return f"{files[-1]} row {row}"  # Not reached: the rows came from these files.


def _task(task: glue.GlueTask, splits: dict[str, eval_tasks.Split], where: str, note: str = "") -> eval_tasks.Task:
  """Our Task: fitted on train, scored on the dev split(s); without train, cross-validation on dev.

  A classification task whose fitted split has one class is refused (no probe can be fitted to it)."""
  kind = eval_tasks.REGRESSION if not task.num_classes else (
      eval_tasks.PAIR_CLASSIFICATION if task.is_pair else eval_tasks.CLASSIFICATION)
  metrics = (task.select,) + tuple(m for m in task.metrics if m != task.select)
  if "train" in splits:
    out = eval_tasks.Task(task.name, kind, metrics, splits, "train", tuple(s for _, s in task.rows), note)
  else:
    (dev,) = [s for _, s in task.rows]  # Only single-row tasks can lose train (checked by the callers).
    out = eval_tasks.Task(task.name, kind, metrics, splits, dev, (), "; ".join(n for n in (note, CV_NOTE) if n))
  classes = np.unique(splits[out.fit].labels)
  if task.num_classes and len(classes) < 2:
    raise UserError(f"{where}: {task.config} {out.fit} has one class (every label is {int(classes[0])}), which no "
                    f"probe can be fitted to; give {glue.HUB_REPO}'s {out.fit} split whole")
  return out


def local_copy_files(task: glue.GlueTask, data_dir: str) -> dict[str, list[str]]:
  """{split: parquet files} of the task in a Hub-layout copy under data_dir ({} when it has none)."""
  if not data_dir:
    return {}
  folder = epath.Path(data_dir) / task.config
  files = {s: sorted(glob.glob(str(folder / f"{s}-*.parquet"))) for s in task.splits}
  return {s: f for s, f in files.items() if f}


def from_local_copy(task: glue.GlueTask, data_dir: str) -> eval_tasks.Task:
  """The task from `<data_dir>/<config>/<split>-*.parquet` through datasets' parquet builder."""
  import datasets  # Local: slow to import.

  files = local_copy_files(task, data_dir)
  where = f"--data_dir {data_dir}"
  for _, split in task.rows:
    if split not in files:
      raise UserError(f"{where}: {task.config}/{split}-*.parquet is missing (the reported split); copy it from "
                      f"{glue.HUB_REPO} (hf download {glue.HUB_REPO} --repo-type=dataset) or remove {task.config}/")
  if "train" not in files and len(task.rows) > 1:
    raise UserError(f"{where}: {task.config}/train-*.parquet is missing; copy it from {glue.HUB_REPO}")
  datasets.disable_progress_bars()  # Local files: no download to follow, and quiet logs.
  for split, paths in files.items():
    _check_files(task, split, paths, where)
  splits = {}
  for split, paths in files.items():  # One split at a time: splits may differ in their other columns.
    with hub_data.quiet():
      try:
        loaded = datasets.load_dataset("parquet", data_files={split: paths}, split=split)
      except Exception as e:  # A damaged or foreign file: datasets / pyarrow raise many types.  # noqa: BLE001
        cause = e.__cause__ or e.__context__ or e  # DatasetGenerationError wraps the real fault.
        raise UserError(f"{where}: {task.config}/{split}-*.parquet could not be read ({type(cause).__name__}: "
                        f"{' '.join(str(cause).split())[:160]}); copy the files again from {glue.HUB_REPO}") from None
    splits[split] = _split(task, loaded, split, f"{where}/{task.config}", paths)
  return _task(task, splits, f"{where}/{task.config}")


def _check_files(task: glue.GlueTask, split: str, paths: list[str], where: str) -> None:
  """Each parquet file of a split readable, with the task's columns, and the split not empty: one line naming
  the file and the fault, before datasets reads them (its errors blame the format, over many lines)."""
  import pyarrow.parquet as pq  # Local: with datasets.

  rows = 0
  for path in paths:
    name = f"{task.config}/{epath.Path(path).name}"
    try:
      meta = pq.ParquetFile(path).metadata
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError...  # noqa: BLE001
      raise UserError(f"{where}: {name} is not a readable parquet file ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:120]}); copy it again from {glue.HUB_REPO}") from None
    columns = meta.schema.to_arrow_schema().names
    missing = [c for c in task.columns + ("label",) if c not in columns]
    if missing:
      raise UserError(f"{where}: {name} has no column {missing[0]!r} (columns: {', '.join(columns)}); give "
                      f"{glue.HUB_REPO}'s parquet files as the Hub has them")
    rows += meta.num_rows
  if not rows:
    raise UserError(
        f"{where}: {task.config}/{split}-*.parquet has no rows ({', '.join(epath.Path(p).name for p in paths)}"
        f"); copy the files again from {glue.HUB_REPO}")


def from_hub(task: glue.GlueTask) -> eval_tasks.Task:
  """The task through datasets.load_dataset(nyu-mll/glue, config, revision=the pinned one)."""
  import datasets  # Local: slow to import.

  where = f"{glue.HUB_REPO}@{glue.HUB_REVISION[:8]}"
  try:
    loaded = datasets.load_dataset(glue.HUB_REPO, task.config, revision=glue.HUB_REVISION)
  except Exception as e:  # Network, cache or Hub errors: one line, with the way round.  # noqa: BLE001
    raise UserError(f"{where}: {task.config} could not be loaded ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:160]}); retry, or give --data_dir a local copy") from None
  missing = [s for s in task.splits if s not in loaded]
  if missing:
    raise UserError(f"{where}: {task.config} has no split {missing[0]!r}; give --data_dir a local copy")
  return _task(task, {s: _split(task, loaded[s], s, where) for s in task.splits}, where)


def from_readers(task: glue.GlueTask, data_dir: str) -> eval_tasks.Task | None:
  """The task from the shared data root through today's readers (None when they lack it or its files)."""
  if task.name not in READERS or not data_dir:
    return None
  reader, names, note = READERS[task.name]
  try:
    read = eval_tasks.READERS[reader](epath.Path(data_dir))
  except eval_tasks.MissingTaskFile:
    return None
  splits = {ours: read.splits[theirs] for ours, theirs in names.items()}
  for name, split in splits.items():
    glue.check_labels(task, name, split.labels, f"--data_dir {data_dir}")
  return _task(task, splits, f"--data_dir {data_dir}", note)


def plan(names: list[str], data_dir: str, online: bool | None = None) -> tuple[dict[str, str], dict[str, str]]:
  """({task: source} of the tasks that can run, {task: why not} of the rest), before anything is loaded.

  source is "copy", "hub" or "readers"; nothing is read yet.
  """
  if data_dir and not epath.Path(data_dir).is_dir():
    raise UserError(f"--data_dir {data_dir} is not a folder: give a copy of {glue.HUB_REPO} (its <config>/ "
                    "folders) or the shared data root")
  online = (not _offline() and mteb_run.hub_reachable()) if online is None else online
  sources, skipped = {}, {}
  for name in names:
    task = glue.TASKS[name]
    if local_copy_files(task, data_dir):
      sources[name] = "copy"
    elif online or hub_cached(task.config):
      sources[name] = "hub"
    elif name in READERS and data_dir and _reader_files_exist(name, data_dir):
      sources[name] = "readers"
    else:
      skipped[name] = "no data in --data_dir" + ("" if online else ", Hub unreachable and not in the datasets cache")
  return sources, skipped


def checked_plan(names: list[str], data_dir: str, strict: bool, log=print,
                 online: bool | None = None) -> tuple[dict[str, str], dict[str, str]]:
  """`plan`, with the skipped tasks named in one line, or refused (strict); refuses a plan with no task."""
  sources, skipped = plan(names, data_dir, online)
  if skipped and strict:
    raise UserError(f"--strict: {len(skipped)} GLUE task(s) have no data: {', '.join(skipped)}; put a copy of "
                    f"{glue.HUB_REPO} in --data_dir (or reach the Hub), or drop --strict")
  if skipped:
    log(f"skipping {len(skipped)} GLUE task(s) with no data ({next(iter(skipped.values()))}): {', '.join(skipped)}")
  if not sources:
    raise UserError(f"no GLUE task has data: give --data_dir (a copy of {glue.HUB_REPO} or the shared data root) "
                    "or reach the Hub")
  return sources, skipped


def _reader_files_exist(name: str, data_dir: str) -> bool:
  try:
    eval_tasks.READERS[READERS[name][0]](epath.Path(data_dir))
    return True
  except eval_tasks.MissingTaskFile:
    return False


def load(name: str, source: str, data_dir: str) -> eval_tasks.Task:
  """The task from the source `plan` chose."""
  task = glue.TASKS[name]
  if source == "copy":
    return from_local_copy(task, data_dir)
  if source == "hub":
    return from_hub(task)
  out = from_readers(task, data_dir)
  assert out is not None, name  # plan() checked the files.
  return out


def source_label(source: str, data_dir: str) -> str:
  """Where a task's data came from, as the table states it."""
  return {
      "copy": f"local copy of {glue.HUB_REPO} ({data_dir})", "hub": f"{glue.HUB_REPO}@{glue.HUB_REVISION}",
      "readers": f"shared data files ({data_dir})"}[source]

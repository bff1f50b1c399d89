"""Frozen GLUE by name: the task registry, GLUE's official metrics, label checks and the GLUE average.

Nine reported rows from eight loaded tasks (MNLI is fitted once on its train split and reported on
its matched and mismatched dev splits; WNLI is left out, as BERT's and ModernBERT's tables do).
Dev splits are reported (GLUE's test labels are hidden). A row's score is the mean of its metrics
(MRPC and QQP: F1 and accuracy; STS-B: Pearson and Spearman; CoLA: Matthews; the rest: accuracy),
and the GLUE average is the mean of the nine row scores, as the GLUE leaderboard computes it.
"""

import dataclasses

import numpy as np

from crossbert_jax.core.errors import UserError

HUB_REPO = "nyu-mll/glue"
# The Hub's parquet conversion of nyu-mll/glue (files <config>/<split>-00000-of-00001.parquet).
HUB_REVISION = "bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c"
METRIC_LABELS = {"matthews": "MCC", "accuracy": "acc", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman"}


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """One loaded GLUE task: Hub config, text columns, classes (0: regression), metrics and rows.

  rows maps each reported row name to its dev split; `select` is the metric probes choose C / k by.
  """
  name: str
  config: str
  columns: tuple[str, ...]
  num_classes: int
  metrics: tuple[str, ...]
  rows: tuple[tuple[str, str], ...]
  select: str

  @property
  def splits(self) -> tuple[str, ...]:
    return ("train",) + tuple(split for _, split in self.rows)

  @property
  def is_pair(self) -> bool:
    return len(self.columns) == 2


def _t(name, config, columns, classes, metrics, rows=None, select=None) -> GlueTask:
  return GlueTask(name, config, columns, classes, metrics, rows or ((name, "validation"),), select or metrics[0])


TASKS: dict[str, GlueTask] = {
    t.name: t for t in (
        _t("cola", "cola", ("sentence",), 2, ("matthews",)),
        _t("sst2", "sst2", ("sentence",), 2, ("accuracy",)),
        _t("mrpc", "mrpc", ("sentence1", "sentence2"), 2, ("f1", "accuracy")),
        _t("stsb", "stsb", ("sentence1", "sentence2"), 0, ("pearson", "spearman"), select="spearman"),
        _t("qqp", "qqp", ("question1", "question2"), 2, ("f1", "accuracy")),
        _t("mnli", "mnli", ("premise", "hypothesis"), 3, ("accuracy",), rows=(("mnli-m", "validation_matched"),
                                                                              ("mnli-mm", "validation_mismatched"))),
        _t("qnli", "qnli", ("question", "sentence"), 2, ("accuracy",)),
        _t("rte", "rte", ("sentence1", "sentence2"), 2, ("accuracy",)),
    )}
ROWS = tuple(row for t in TASKS.values() for row, _ in t.rows)  # The nine reported rows, GLUE's order.
ROW_TITLES = {
    "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli-m": "MNLI-m",
    "mnli-mm": "MNLI-mm", "qnli": "QNLI", "rte": "RTE"}
STSB_RANGE = (0.0, 5.0)


def parse_tasks(text: str | None) -> list[str]:
  """None (no --tasks) / 'all' -> every task; 'cola,rte' -> those, in GLUE's order; an unknown name, or a
  --tasks that names nothing ('' or ','), is refused."""
  if text is None:
    return list(TASKS)
  names = [t.strip().lower() for t in text.split(",") if t.strip()]
  if not names:
    raise UserError(f"--tasks={text!r} names no task: give GLUE tasks ({','.join(TASKS)}) or all, or drop --tasks "
                    "for the whole benchmark")
  if names == ["all"]:
    return list(TASKS)
  for n in names:
    if n not in TASKS:
      hint = " (mnli reports both mnli-m and mnli-mm)" if n.startswith("mnli") else ""
      raise UserError(f"--tasks: {n!r} is not a GLUE task{hint}; use any of {','.join(TASKS)} or all")
  return [t for t in TASKS if t in names]


def check_labels(task: GlueTask, split: str, labels: np.ndarray, where: str) -> None:
  """Refuses labels outside the task's classes (e.g. the -1 of GLUE's hidden test labels) or STS-B's 0..5."""
  labels = np.asarray(labels)
  if task.num_classes:
    bad = labels[(labels < 0) | (labels >= task.num_classes) | (labels != np.round(labels))]
    allowed = f"0..{task.num_classes - 1}"
  else:
    bad = labels[~((labels >= STSB_RANGE[0]) & (labels <= STSB_RANGE[1]))]
    allowed = "scores in [0, 5]"
  if len(bad):
    raise UserError(f"{where}: {task.name} {split} has label {float(bad[0]):g} outside the task's classes ({allowed}); "
                    "give labelled splits (GLUE's test labels are hidden: use train and validation)")


def row_score(metrics: dict[str, float]) -> float:
  """A row's GLUE score: the mean of its metrics (one metric: itself)."""
  return float(np.mean(list(metrics.values())))


def glue_average(rows: dict[str, float | None]) -> float | None:
  """The GLUE average: the mean of the nine row scores; None unless every row has one."""
  values = [rows.get(r) for r in ROWS]
  return None if any(v is None for v in values) else float(np.mean(values))


def partial_average(rows: dict[str, float | None]) -> tuple[float | None, int]:
  """(mean over the rows that have a score, how many): for a benchmark run with tasks skipped."""
  values = [rows[r] for r in ROWS if rows.get(r) is not None]
  return (float(np.mean(values)) if values else None), len(values)

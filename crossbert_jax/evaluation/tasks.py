"""Readers for the frozen-evaluation task data (layouts as in shared/data/SOURCES.md).

Every reader returns a `Task`: named splits of texts (and, for pair tasks, second texts) with
labels, the task type, its metrics and the protocol the probes follow (`fit` split -> `scored`
splits, or cross-validation on one split where no train split exists).
"""

import csv
import dataclasses
import sys
from typing import Callable

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError

CLASSIFICATION, PAIR_CLASSIFICATION, REGRESSION = "classification", "pair_classification", "regression"
KINDS = (CLASSIFICATION, PAIR_CLASSIFICATION, REGRESSION)

# Some STS Benchmark / SST lines are long; the csv module's default field limit is 128 KiB.
csv.field_size_limit(sys.maxsize)


@dataclasses.dataclass
class Split:
  """Texts, optional second texts (pair tasks) and labels (int classes or float scores)."""
  texts: list[str]
  labels: np.ndarray
  pairs: list[str] | None = None

  def __len__(self) -> int:
    return len(self.texts)

  def subset(self, n: int, seed: int) -> "Split":
    """A fixed, seeded subset of at most n rows (kept in file order)."""
    if n <= 0 or n >= len(self):
      return self
    idx = np.sort(np.random.default_rng(seed).permutation(len(self))[:n])
    return Split([self.texts[i] for i in idx], self.labels[idx],
                 None if self.pairs is None else [self.pairs[i] for i in idx])


@dataclasses.dataclass
class Task:
  """A probing task: splits, type, metrics (the first is the headline) and protocol."""
  name: str
  kind: str
  metrics: tuple[str, ...]
  splits: dict[str, Split]
  fit: str  # The split probes are fitted on.
  scored: tuple[str, ...]  # Splits probes report on; () means cross-validation on `fit`.
  note: str = ""  # Anything unusual about the protocol, shown in the output.
  cosine_splits: tuple[str, ...] = ()  # Splits scored by zero-shot cosine Spearman (STS).

  @property
  def is_pair(self) -> bool:
    return self.splits[self.fit].pairs is not None

  @property
  def labels(self) -> np.ndarray:
    return self.splits[self.fit].labels


class MissingTaskFile(UserError):
  """A task's data file is absent under the data root (`load_task` names the flag or config key)."""
  def __init__(self, root: epath.Path, rel: str):
    super().__init__(f"--data_dir {root}: {rel} is missing; point --data_dir at the shared data root "
                     "(the folder holding SOURCES.md)")
    self.root, self.rel = root, rel


def probe_view(task: Task, splits: str) -> Task:
  """The task as in-training probes score it: eval.splits "first" keeps only its first scored split."""
  if splits == "all":
    return task
  return Task(task.name, task.kind, task.metrics, task.splits, task.fit, task.scored[:1], task.note,
              task.cosine_splits[:1])


def _path(root: epath.Path, rel: str) -> epath.Path:
  p = root / rel
  if not p.exists():
    raise MissingTaskFile(root, rel)
  return p


def _lines(path: epath.Path) -> list[str]:
  """The file's lines, split on "\n" only (`str.splitlines` also splits on U+2028, U+0085, ...)."""
  text = path.read_text(encoding="utf-8-sig")
  return [line.removesuffix("\r") for line in text.split("\n")][:-1 if text.endswith("\n") else None]


def _rows(path: epath.Path, header: bool, quoting: int = csv.QUOTE_NONE) -> list[list[str]]:
  rows = list(csv.reader(_lines(path), delimiter="\t", quoting=quoting))
  return rows[1:] if header else rows


def read_cola(root: epath.Path) -> Task:
  """CoLA: train = in_domain_train (8,551); dev = in_domain_dev + out_of_domain_dev (1,043)."""
  def split(*names):
    rows = [r for n in names for r in _rows(_path(root, f"glue/CoLA/raw/{n}.tsv"), header=False)]
    return Split([r[3] for r in rows], np.array([int(r[1]) for r in rows], np.int64))

  return Task("cola", CLASSIFICATION, ("matthews", "accuracy"),
              {"train": split("in_domain_train"), "dev": split("in_domain_dev", "out_of_domain_dev")}, fit="train",
              scored=("dev",))


def read_glue_stsb(root: epath.Path, split: str) -> Split:
  """GLUE STS-B train (5,749) or dev (1,500): sentence1, sentence2, score in [0, 5]."""
  rows = _rows(_path(root, f"glue/STS-B/{split}.tsv"), header=True)
  return Split([r[7] for r in rows], np.array([float(r[9]) for r in rows], np.float32), [r[8] for r in rows])


def read_sts_benchmark(root: epath.Path, split: str) -> Split:
  """STS Benchmark csv (train 5,749 / dev 1,500 / test 1,379), read with quoting disabled."""
  rows = _rows(_path(root, f"sts/STSBenchmark/sts-{split}.csv"), header=False)
  return Split([r[5] for r in rows], np.array([float(r[4]) for r in rows], np.float32), [r[6] for r in rows])


def read_stsb(root: epath.Path) -> Task:
  """STS-B: probes fit on GLUE train, report on GLUE dev and the STS Benchmark test (as MTEB)."""
  return Task("stsb", REGRESSION, ("spearman", "pearson"), {
      "train": read_glue_stsb(root, "train"), "dev": read_glue_stsb(root, "dev"), "test": read_sts_benchmark(
          root, "test")}, fit="train", scored=("dev", "test"), cosine_splits=("dev", "test"))


def read_qnli(root: epath.Path) -> Task:
  """QNLI dev (5,463): question, sentence, 1 = entailment. No train split here."""
  rows = _rows(_path(root, "glue/QNLI/dev.tsv"), header=True)
  labels = np.array([int(r[3] == "entailment") for r in rows], np.int64)
  return Task("qnli", PAIR_CLASSIFICATION, ("accuracy",),
              {"dev": Split([r[1] for r in rows], labels, [r[2] for r in rows])}, fit="dev", scored=(),
              note="no QNLI train split in the data: 5-fold cross-validation on dev")


def read_rte(root: epath.Path) -> Task:
  """RTE (HF export): train 2,490 / dev 277; label 0 = entailment, 1 = not_entailment."""
  def split(name):
    rows = _rows(_path(root, f"glue/RTE/{name}.tsv"), header=True)
    return Split([r[0] for r in rows], np.array([int(r[2]) for r in rows], np.int64), [r[1] for r in rows])

  return Task("rte", PAIR_CLASSIFICATION, ("accuracy",), {"train": split("train"), "dev": split("dev")}, fit="train",
              scored=("dev",))


def read_sst2(root: epath.Path) -> Task:
  """SentEval SST-2 binary: train 67,349 / dev 872 / test 1,821; 'sentence<TAB>label'."""
  def split(name):
    rows = _rows(_path(root, f"senteval/downstream/SST/binary/sentiment-{name}"), header=False)
    return Split([r[0].strip() for r in rows], np.array([int(r[1]) for r in rows], np.int64))

  return Task("sst2", CLASSIFICATION, ("accuracy",),
              {"train": split("train"), "dev": split("dev"), "test": split("test")}, fit="train",
              scored=("dev", "test"))


def read_sst5(root: epath.Path) -> Task:
  """SentEval SST fine-grained (5 classes, 0 = very negative): train 8,544 / dev 1,101 / test 2,210.

  Lines are 'label sentence'.
  """
  def split(name):
    lines = [l for l in _lines(_path(root, f"senteval/downstream/SST/fine/sentiment-{name}")) if l.strip()]
    labels, texts = zip(*(l.split(" ", 1) for l in lines))
    return Split([t.strip() for t in texts], np.array([int(x) for x in labels], np.int64))

  return Task("sst5", CLASSIFICATION, ("accuracy",),
              {"train": split("train"), "dev": split("dev"), "test": split("test")}, fit="train",
              scored=("dev", "test"))


def read_mrpc(root: epath.Path) -> Task:
  """SentEval MRPC (MSR files): train 4,076 / test 1,725; 1 = paraphrase."""
  def split(name):
    rows = _rows(_path(root, f"senteval/downstream/MRPC/msr_paraphrase_{name}.txt"), header=True)
    return Split([r[3] for r in rows], np.array([int(r[0]) for r in rows], np.int64), [r[4] for r in rows])

  return Task("mrpc", PAIR_CLASSIFICATION, ("f1", "accuracy"), {"train": split("train"), "test": split("test")},
              fit="train", scored=("test",))


SNLI_LABELS = ("entailment", "neutral", "contradiction")


def read_snli(root: epath.Path) -> Task:
  """SentEval SNLI dev 9,842 / test 9,824 (0 entailment, 1 neutral, 2 contradiction)."""
  def split(name):
    base = "senteval/downstream/SNLI/"
    s1, s2, labels = (_lines(_path(root, base + f"{part}.{name}")) for part in ("s1", "s2", "labels"))
    return Split([s.strip() for s in s1], np.array([SNLI_LABELS.index(l.strip()) for l in labels], np.int64),
                 [s.strip() for s in s2])

  return Task("snli", PAIR_CLASSIFICATION, ("accuracy",), {"dev": split("dev"), "test": split("test")}, fit="dev",
              scored=("test",), note="no SNLI train split in the data: probes fit on dev, report on test")


READERS: dict[str, Callable[[epath.Path], Task]] = {
    "cola": read_cola,
    "sst2": read_sst2,
    "sst5": read_sst5,
    "mrpc": read_mrpc,
    "stsb": read_stsb,
    "qnli": read_qnli,
    "rte": read_rte,
    "snli": read_snli,}
ALL_TASKS = tuple(READERS)


def load_task(name: str, data_dir: str | epath.Path, data_flag: str = "--data_dir") -> Task:
  """The named task read from `data_dir` (the shared data root); errors name `data_flag`."""
  if name not in READERS:
    raise UserError(f"--tasks: unknown task {name!r}; use any of {','.join(ALL_TASKS)} "
                    "(or --generic_train / --task_file for your own data)")
  root = epath.Path(str(data_dir))
  if not root.exists():
    raise UserError(f"{data_flag} {root} does not exist: point it at the shared data root (e.g. ../shared/data)")
  try:
    return READERS[name](root)
  except MissingTaskFile as e:
    raise UserError(f"{data_flag} {root}: {e.rel} (task {name}) is missing; point {data_flag} at the shared "
                    "data root (the folder holding SOURCES.md)") from None


def parse_tasks(tasks: str, flag: str = "--tasks") -> list[str]:
  """'a,b' -> ['a', 'b'] checked against the known tasks ('all' = every task); errors name `flag`."""
  names = [t.strip() for t in tasks.split(",") if t.strip()]
  if names == ["all"]:
    return list(ALL_TASKS)
  for n in names:
    if n not in READERS:
      raise UserError(f"{flag}: unknown task {n!r}; use any of {','.join(ALL_TASKS)} or 'all'")
  return names

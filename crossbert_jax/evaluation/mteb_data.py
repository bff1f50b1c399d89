"""Local data for mteb's own task objects: `DIR/<TaskName>/` in one layout per task type.

  STS, PairClassification   <split>.tsv (header sentence1, sentence2, score | label) or <split>.jsonl
  Classification            <split>.jsonl with text, label (the train split included)
  Clustering                <split>.jsonl with sentences, labels (one row per clustering set)
  Retrieval, Reranking      BEIR: corpus.jsonl, queries.jsonl, qrels/<split>.tsv

A multilingual task reads `DIR/<TaskName>/<subset>/` per subset it evaluates (e.g. `en`). The data
is filled into `task.dataset` (the shape mteb's own `load_data` gives) and `task.data_loaded` set,
so mteb's evaluators score it with no network. Reranking candidates are each query's judged
documents (those its qrels name, relevant or not).
"""

import csv
import io
import json
from typing import Any

from etils import epath

from crossbert_jax.core.errors import UserError

TABLE_TYPES = ("STS", "PairClassification")
LAYOUT_TYPES = TABLE_TYPES + ("Classification", "Clustering", "Retrieval", "Reranking")


def _rows(folder: epath.Path, split: str) -> list[dict] | None:
  """Rows of <split>.jsonl or <split>.tsv (header line), or None when neither exists."""
  jsonl, tsv = folder / f"{split}.jsonl", folder / f"{split}.tsv"
  if jsonl.is_file():
    return [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines() if line.strip()]
  if tsv.is_file():
    return list(csv.DictReader(io.StringIO(tsv.read_text(encoding="utf-8")), delimiter="\t",
                               quoting=csv.QUOTE_NONE))
  return None


def _columns(rows: list[dict], names: tuple[str, ...], where: epath.Path) -> dict[str, list]:
  missing = [n for n in names if rows and n not in rows[0]]
  if missing or not rows:
    raise UserError(f"--data_dir: {where} lacks column {(missing or names)[0]!r}; this task type needs "
                    f"{', '.join(names)}")
  return {n: [r[n] for r in rows] for n in names}


def _split_data(task_type: str, folder: epath.Path, split: str):
  """One split of a non-retrieval task as a datasets.Dataset (None when its file is absent)."""
  import datasets  # Local: slow to import.

  rows = _rows(folder, split)
  if rows is None:
    return None
  where = folder / split
  if task_type == "STS":
    cols = _columns(rows, ("sentence1", "sentence2", "score"), where)
    cols["score"] = [float(s) for s in cols["score"]]
  elif task_type == "PairClassification":
    cols = _columns(rows, ("sentence1", "sentence2", "label"), where)
    cols = {"sentence1": cols["sentence1"], "sentence2": cols["sentence2"], "labels": [int(l) for l in cols["label"]]}
  elif task_type == "Classification":
    cols = _columns(rows, ("text", "label"), where)
  else:  # Clustering.
    cols = _columns(rows, ("sentences", "labels"), where)
  return datasets.Dataset.from_dict(cols)


def _needed_splits(task) -> list[str]:
  splits = list(task.metadata.eval_splits)
  if task.metadata.type == "Classification" and getattr(task, "train_split", "train") not in splits:
    splits.append(task.train_split)
  return splits


def _read_qrels(path: epath.Path) -> dict[str, dict[str, int]]:
  qrels: dict[str, dict[str, int]] = {}
  for line in path.read_text(encoding="utf-8").splitlines()[1:]:
    if line.strip():
      q, d, score = line.split("\t")[:3]
      qrels.setdefault(q, {})[d] = int(float(score))
  return qrels


def _jsonl(path: epath.Path) -> list[dict]:
  if not path.is_file():
    raise UserError(f"--data_dir: {path} is missing; a retrieval task's folder holds corpus.jsonl, "
                    "queries.jsonl and qrels/<split>.tsv")
  return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _retrieval_split(folder: epath.Path, split: str, reranking: bool) -> dict[str, Any]:
  """mteb's retrieval split: corpus / queries Datasets, relevant_docs, top_ranked."""
  import datasets

  qrels = _read_qrels(folder / "qrels" / f"{split}.tsv")
  corpus = _jsonl(folder / "corpus.jsonl")
  queries = [r for r in _jsonl(folder / "queries.jsonl") if str(r["_id"]) in qrels]
  return {
      "corpus": datasets.Dataset.from_dict({"id": [str(r["_id"]) for r in corpus],
                                            "title": [r.get("title", "") for r in corpus],
                                            "text": [r.get("text", "") for r in corpus]}),
      "queries": datasets.Dataset.from_dict({"id": [str(r["_id"]) for r in queries],
                                             "text": [r["text"] for r in queries]}),
      "relevant_docs": qrels,
      "top_ranked": {q: list(docs) for q, docs in qrels.items()} if reranking else None,
  }


def _subset_data(task, folder: epath.Path):
  """One subset's data in the shape mteb's load_data gives, or None when a needed file is absent."""
  import datasets

  task_type = task.metadata.type
  if task_type in ("Retrieval", "Reranking"):
    splits = task.metadata.eval_splits
    if not all((folder / "qrels" / f"{s}.tsv").is_file() for s in splits):
      return None
    return {s: _retrieval_split(folder, s, task_type == "Reranking") for s in splits}
  data = {s: _split_data(task_type, folder, s) for s in _needed_splits(task)}
  if any(d is None for d in data.values()):
    return None
  return datasets.DatasetDict(data)


def has_local_data(task, data_dir: str) -> bool:
  """Whether DIR/<TaskName>/ exists for this task (its files are checked when read)."""
  return bool(data_dir) and (epath.Path(data_dir) / task.metadata.name).is_dir()


def fill_local(task, data_dir: str):
  """`task` (an mteb task object) with its dataset read from DIR/<TaskName>/; data_loaded set."""
  name, task_type = task.metadata.name, task.metadata.type
  if task_type not in LAYOUT_TYPES:
    raise UserError(f"--data_dir: {name} is a {task_type} task, which has no local layout; "
                    f"local data covers {', '.join(LAYOUT_TYPES)}")
  folder = epath.Path(data_dir) / name
  retrieval = task_type in ("Retrieval", "Reranking")
  if task.metadata.is_multilingual:
    dataset = {sub: _subset_data(task, folder / sub) for sub in task.hf_subsets}
    absent = [sub for sub, d in dataset.items() if d is None]
  else:
    data = _subset_data(task, folder)
    dataset, absent = ({"default": data} if retrieval else data), ([] if data is not None else ["."])
  if absent:
    expected = ("qrels/<split>.tsv" if retrieval else "<split>.tsv or <split>.jsonl") + \
               f" for splits {', '.join(_needed_splits(task))}"
    raise UserError(f"--data_dir: {folder / absent[0]} lacks {expected}; see docs/evaluation.md for the layout")
  task.dataset = dataset
  task.data_loaded = True
  return task

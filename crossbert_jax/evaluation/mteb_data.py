"""Local data for mteb's own task objects: `DIR/<TaskName>/` in one layout per task type.

  STS, PairClassification   <split>.tsv (header sentence1, sentence2, score | label) or <split>.jsonl
  Classification            <split>.jsonl with text, label (the train split included)
  Clustering                <split>.jsonl with sentences, labels (one row per clustering set)
  Retrieval, Reranking      BEIR: corpus.jsonl, queries.jsonl, qrels/<split>.tsv

A multilingual task reads `DIR/<TaskName>/<subset>/` per subset it evaluates (e.g. `en`). The data
is filled into `task.dataset` (the shape mteb's own `load_data` gives) and `task.data_loaded` set,
so mteb's evaluators score it with no network. Reranking candidates are each query's judged
documents (those its qrels name, relevant or not).

Files are read strictly (generic.read_records: a TSV row has exactly its header's fields, a JSONL
line is one object with every key), because mteb would turn a bad row into a traceback or a silent
nan: every bad row is one line naming the file and line. STS scores are finite, inside the task's
range and not all equal; pair labels 0 or 1, both present; qrels scores whole numbers, every judged
query in queries.jsonl; no file is empty.
"""

import math
from typing import Any

from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import generic

TABLE_TYPES = ("STS", "PairClassification")
LAYOUT_TYPES = TABLE_TYPES + ("Classification", "Clustering", "Retrieval", "Reranking")
COLUMNS = {
    "STS": ("sentence1", "sentence2", "score"), "PairClassification": ("sentence1", "sentence2", "label"),
    "Classification": ("text", "label"), "Clustering": ("sentences", "labels")}
BEIR_FILES = "a retrieval task's folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv"


def _number(path: str, n: int, value: Any, what: str) -> float:
  """`value` as a finite float, else one line naming the file and line."""
  try:
    x = float(value) if not isinstance(value, bool) else math.nan
  except (TypeError, ValueError):
    x = math.nan
  if not math.isfinite(x):
    raise UserError(f"{path} line {n}: {what} {value!r} is not a finite number; fix or drop the row")
  return x


def _varied(path: str, values: list, what: str, why: str) -> None:
  if len(set(values)) < 2:
    raise UserError(f"{path}: every {what} is {values[0]!r}; {why}")


def _sts_scores(task, path: str, rows: list[tuple[int, dict]]) -> list[float]:
  """The gold scores: finite, inside the task's range (min_score..max_score, which mteb normalises by), varied."""
  low, high = task.min_score, task.max_score
  scores = []
  for n, row in rows:
    x = _number(path, n, row["score"], "score")
    if not low <= x <= high:
      raise UserError(f"{path} line {n}: score {x:g} is outside {task.metadata.name}'s range {low}..{high}; "
                      "rescale the scores to it")
    scores.append(x)
  _varied(path, scores, "score", "Spearman and Pearson of constant scores are undefined (nan): the pairs need "
          "different gold scores")
  return scores


def _pair_labels(path: str, rows: list[tuple[int, dict]]) -> list[int]:
  labels = []
  for n, row in rows:
    x = _number(path, n, row["label"], "label")
    if x not in (0, 1):
      raise UserError(f"{path} line {n}: label {row['label']!r} is not 0 or 1; a pair is a paraphrase (1) or not (0)")
    labels.append(int(x))
  _varied(path, labels, "label", "average precision needs both 0 and 1 pairs")
  return labels


def _clusters(path: str, rows: list[tuple[int, dict]]) -> None:
  for n, row in rows:
    sentences, labels = row["sentences"], row["labels"]
    if not isinstance(sentences, list) or not isinstance(labels, list) or len(sentences) != len(labels):
      raise UserError(f"{path} line {n}: sentences and labels must be two lists of the same length (one label per "
                      "sentence); write the clustering sets as JSONL")


def _split_data(task, folder: epath.Path, split: str):
  """One split of a non-retrieval task as a datasets.Dataset (None when its file is absent)."""
  import datasets  # Local: slow to import.

  path = next((str(p) for p in (folder / f"{split}.jsonl", folder / f"{split}.tsv") if p.is_file()), None)
  if path is None:
    return None
  task_type = task.metadata.type
  rows = generic.read_records(path, COLUMNS[task_type])  # Each bad row is one line naming the file and line.
  cols = {name: [row[name] for _, row in rows] for name in COLUMNS[task_type]}
  if task_type == "STS":
    cols["score"] = _sts_scores(task, path, rows)
  elif task_type == "PairClassification":
    cols = {"sentence1": cols["sentence1"], "sentence2": cols["sentence2"], "labels": _pair_labels(path, rows)}
  elif task_type == "Clustering":
    _clusters(path, rows)
  return datasets.Dataset.from_dict(cols)


def _needed_splits(task) -> list[str]:
  splits = list(task.metadata.eval_splits)
  if task.metadata.type == "Classification" and getattr(task, "train_split", "train") not in splits:
    splits.append(task.train_split)
  return splits


def _read_qrels(path: epath.Path) -> dict[str, tuple[int, dict[str, int]]]:
  """{query id: (its first line, {document id: relevance})} of a qrels file (a header line, then
  query-id, corpus-id, score)."""
  qrels: dict[str, tuple[int, dict[str, int]]] = {}
  lines = [(n, line.removesuffix("\r")) for n, line in enumerate(generic.decode(str(path)).split("\n"), 1)]
  for n, line in lines[1:]:
    if not line.strip():
      continue
    fields = line.split("\t")
    if len(fields) < 3:
      raise UserError(f"{path} line {n} has {len(fields)} tab-separated field(s); a qrels row is query-id, "
                      "corpus-id, score")
    score = _number(str(path), n, fields[2], "score")
    if score != int(score):
      raise UserError(f"{path} line {n}: score {fields[2]!r} is not a whole number; relevance is a grade (0, 1, 2...)")
    qrels.setdefault(fields[0], (n, {}))[1][fields[1]] = int(score)
  if not qrels:
    raise UserError(f"{path} holds no judgements (a header line, then query-id, corpus-id, score rows)")
  return qrels


def _jsonl(path: epath.Path, keys: tuple[str, ...]) -> list[dict]:
  """The rows of a BEIR .jsonl file; each holds `keys`."""
  if not path.is_file():
    raise UserError(f"--data_dir: {path} is missing; {BEIR_FILES}")
  return [row for _, row in generic.read_records(str(path), keys)]


def _judged_queries(folder: epath.Path, qrels_path: epath.Path, qrels: dict) -> list[dict]:
  """The queries that qrels judges; refused when a judged query is not in queries.jsonl, or none is judged."""
  path = folder / "queries.jsonl"
  queries = _jsonl(path, ("_id", "text"))
  ids = {str(q["_id"]) for q in queries}
  absent = [(n, q) for q, (n, _) in qrels.items() if q not in ids]
  if absent:
    raise UserError(f"{qrels_path} line {absent[0][0]}: query {absent[0][1]!r} is not in {path}; the qrels and "
                    "queries files must be of one data set")
  return [q for q in queries if str(q["_id"]) in qrels]


def _retrieval_split(folder: epath.Path, split: str, reranking: bool) -> dict[str, Any]:
  """mteb's retrieval split: corpus / queries Datasets, relevant_docs, top_ranked."""
  import datasets

  qrels_path = folder / "qrels" / f"{split}.tsv"
  judged = _read_qrels(qrels_path)
  corpus = _jsonl(folder / "corpus.jsonl", ("_id", "text"))
  queries = _judged_queries(folder, qrels_path, judged)
  qrels = {q: docs for q, (_, docs) in judged.items()}
  return {
      "corpus": datasets.Dataset.from_dict({
          "id": [str(r["_id"]) for r in corpus], "title": [r.get("title", "") for r in corpus],
          "text": [r["text"] for r in corpus]}),
      "queries": datasets.Dataset.
                 from_dict({"id": [str(r["_id"]) for r in queries], "text": [r["text"] for r in queries]}),
      "relevant_docs": qrels,
      "top_ranked": {q: list(docs) for q, docs in qrels.items()} if reranking else None,}


def _subset_data(task, folder: epath.Path):
  """One subset's data in the shape mteb's load_data gives, or None when a needed file is absent."""
  import datasets

  task_type = task.metadata.type
  if task_type in ("Retrieval", "Reranking"):
    splits = task.metadata.eval_splits
    if not all((folder / "qrels" / f"{s}.tsv").is_file() for s in splits):
      return None
    return {s: _retrieval_split(folder, s, task_type == "Reranking") for s in splits}
  data = {s: _split_data(task, folder, s) for s in _needed_splits(task)}
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

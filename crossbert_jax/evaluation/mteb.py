"""MTEB through its own code: an encoder wrapper (`encode`, `similarity`) and offline local tasks.

`local_tasks` builds mteb's own task objects (STSBenchmark, SciFact) whose data comes from the
shared files instead of the Hugging Face Hub, so mteb's evaluators score them with no network.
The CLI is `crossbert_jax.mteb_eval`.
"""

import json
from typing import Any, Callable

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import generic
from crossbert_jax.evaluation import tasks as eval_tasks


def _texts(inputs: Any) -> list[str]:
  """Sentences from a list of strings or from mteb 2.x's DataLoader of {"text": [...]} batches."""
  if isinstance(inputs, str):
    return [inputs]
  items = list(inputs)
  if items and isinstance(items[0], dict):
    return [str(t) for batch in items for t in batch["text"]]
  return [str(t) for t in items]


class MtebEncoder:
  """Wraps an `Embedder` in mteb's EncoderProtocol: `encode(inputs, ...) -> NxD numpy`."""

  def __init__(self, emb: embedder_lib.Embedder, name: str = "crossbert_jax/local", normalize: bool = True):
    self.embedder, self.normalize, self.name = emb, normalize, name

  @property
  def mteb_model_meta(self):
    """mteb's ModelMeta for the results (imported here: mteb is slow to import)."""
    from mteb.models import ModelMeta

    return ModelMeta.create_empty({"name": self.name, "revision": "local"})

  def encode(self, inputs: Any, *, batch_size: int = 32, task_metadata: Any = None, hf_split: str | None = None,
             hf_subset: str | None = None, prompt_type: Any = None, **kwargs: Any) -> np.ndarray:
    """NxD float32 embeddings (unit length when normalize); batching is the embedder's own."""
    del batch_size, task_metadata, hf_split, hf_subset, prompt_type, kwargs
    out = self.embedder.embed(_texts(inputs))
    if self.normalize:
      out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out

  def similarity(self, embeddings1, embeddings2):
    """Cosine similarity matrix (as sentence-transformers)."""
    import torch

    a, b = (torch.nn.functional.normalize(torch.as_tensor(np.asarray(e)), dim=-1) for e in (embeddings1, embeddings2))
    return a @ b.T

  def similarity_pairwise(self, embeddings1, embeddings2):
    """Row-wise cosine similarity."""
    import torch

    a, b = (torch.nn.functional.normalize(torch.as_tensor(np.asarray(e)), dim=-1) for e in (embeddings1, embeddings2))
    return (a * b).sum(-1)


# ----------------------------------------------------------------------------- offline tasks

def _sts_benchmark(root: epath.Path):
  """mteb's STSBenchmark (test, 1,379 pairs) with its data read from sts/STSBenchmark/sts-test.csv."""
  import datasets  # Local: mteb and datasets are slow to import.
  import mteb

  test = eval_tasks.read_sts_benchmark(root, "test")
  task = mteb.get_task("STSBenchmark")
  task.dataset = datasets.DatasetDict({"test": datasets.Dataset.from_dict(
      {"sentence1": test.texts, "sentence2": test.pairs, "score": [float(x) for x in test.labels]})})
  task.data_loaded = True
  return task


def _jsonl_rows(path: epath.Path) -> list[dict]:
  if not path.is_file():
    raise UserError(f"--data_dir: {path} is missing; point --data_dir at the shared data root")
  return [json.loads(line) for line in generic.decode(str(path)).split("\n") if line.strip()]


def _scifact(root: epath.Path):
  """mteb's SciFact (test: 300 queries, 5,183 documents) read from the BEIR folder beir/scifact."""
  import datasets
  import mteb

  folder = root / "beir" / "scifact"
  qrels: dict[str, dict[str, int]] = {}
  for line in generic.decode(str(folder / "qrels" / "test.tsv")).split("\n")[1:]:
    if line.strip():
      q, d, score = line.split("\t")
      qrels.setdefault(q, {})[d] = int(score)
  corpus = _jsonl_rows(folder / "corpus.jsonl")
  queries = [r for r in _jsonl_rows(folder / "queries.jsonl") if str(r["_id"]) in qrels]
  task = mteb.get_task("SciFact")
  task.dataset = {"default": {"test": {
      "corpus": datasets.Dataset.from_dict({"id": [str(r["_id"]) for r in corpus],
                                            "title": [r.get("title", "") for r in corpus],
                                            "text": [r.get("text", "") for r in corpus]}),
      "queries": datasets.Dataset.from_dict({"id": [str(r["_id"]) for r in queries],
                                             "text": [r["text"] for r in queries]}),
      "relevant_docs": qrels, "top_ranked": None}}}
  task.data_loaded = True
  return task


LOCAL_TASKS: dict[str, Callable[[epath.Path], Any]] = {"STSBenchmark": _sts_benchmark, "SciFact": _scifact}


def local_tasks(data_dir: str, names: tuple[str, ...] = tuple(LOCAL_TASKS)) -> list:
  """mteb task objects for `names`, their data loaded from the shared data root (no network)."""
  unknown = [n for n in names if n not in LOCAL_TASKS]
  if unknown:
    raise UserError(f"--tasks: {unknown[0]!r} has no local copy; offline tasks are {', '.join(LOCAL_TASKS)}")
  root = epath.Path(data_dir)
  if not (root / "SOURCES.md").is_file():
    raise UserError(f"--data_dir={data_dir} is not the shared data root (no SOURCES.md there)")
  return [LOCAL_TASKS[n](root) for n in names]


def main_scores(result) -> dict[str, float]:
  """{task name: mteb's main score} of an `mteb.evaluate` result."""
  return {r.task_name: float(r.get_score()) for r in result.task_results}

"""BEIR-format retrieval by exact cosine search: nDCG@10, MAP@100, recall@100.

A BEIR folder holds corpus.jsonl ({_id, title, text}), queries.jsonl ({_id, text}) and
qrels/<split>.tsv (query-id, corpus-id, score with a header). Documents are embedded as
"title text"; only queries with at least one relevant (score > 0) document are scored.
nDCG uses linear gains (rel / log2(rank + 1)), as trec_eval / pytrec_eval, which BEIR reports.
Shape letters: Q queries, N documents, D embed, K retrieved.
"""

import dataclasses
import json
import math

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import probes

TOP_K = 100


@dataclasses.dataclass
class BeirData:
  """Corpus (ids, texts), queries (ids, texts) and qrels {query id: {doc id: relevance}}."""
  doc_ids: list[str]
  docs: list[str]
  query_ids: list[str]
  queries: list[str]
  qrels: dict[str, dict[str, int]]


def _jsonl(path: epath.Path) -> list[dict]:
  if not path.exists():
    raise UserError(f"--retrieval: {path} is missing; a BEIR folder holds corpus.jsonl, queries.jsonl "
                    "and qrels/test.tsv")
  return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_beir(folder: str | epath.Path, split: str = "test") -> BeirData:
  """The corpus, the queries that appear in qrels/<split>.tsv, and those qrels."""
  root = epath.Path(str(folder))
  qrels_path = root / "qrels" / f"{split}.tsv"
  if not qrels_path.exists():
    raise UserError(f"--retrieval={folder}: qrels/{split}.tsv is missing; point it at a BEIR folder")
  qrels: dict[str, dict[str, int]] = {}
  for line in qrels_path.read_text(encoding="utf-8").splitlines()[1:]:
    if line.strip():
      q, d, s = line.split("\t")
      qrels.setdefault(q, {})[d] = int(s)
  corpus = _jsonl(root / "corpus.jsonl")
  doc_ids = [str(r["_id"]) for r in corpus]
  docs = [(r.get("title", "") + " " + r.get("text", "")).strip() for r in corpus]
  by_id = {str(r["_id"]): r["text"] for r in _jsonl(root / "queries.jsonl")}
  missing = [q for q in qrels if q not in by_id]
  if missing:
    raise UserError(f"--retrieval={folder}: qrels/{split}.tsv names query {missing[0]!r} that "
                    "queries.jsonl lacks; fix the folder")
  query_ids = [q for q in qrels if any(r > 0 for r in qrels[q].values())]
  return BeirData(doc_ids, docs, query_ids, [by_id[q] for q in query_ids], qrels)


def search(doc_emb_NxD: np.ndarray, query_emb_QxD: np.ndarray, k: int = TOP_K) -> np.ndarray:
  """QxK indices of the most cosine-similar documents, best first (exact, in batches)."""
  idx_QxK, _ = probes.nearest(doc_emb_NxD, query_emb_QxD, k, chunk=256)
  return idx_QxK


def ndcg_at(ranked: list[str], rels: dict[str, int], k: int = 10) -> float:
  """nDCG@k with linear gains; the ideal ranking sorts all judged relevances."""
  dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
  ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:k]
  idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
  return dcg / idcg if idcg > 0 else 0.0


def average_precision_at(ranked: list[str], rels: dict[str, int], k: int = TOP_K) -> float:
  """AP@k: mean over all relevant documents of precision at each one's rank (0 if not in top k)."""
  n_rel = sum(1 for r in rels.values() if r > 0)
  hits, total = 0, 0.0
  for i, d in enumerate(ranked[:k]):
    if rels.get(d, 0) > 0:
      hits += 1
      total += hits / (i + 1)
  return total / n_rel if n_rel else 0.0


def recall_at(ranked: list[str], rels: dict[str, int], k: int = TOP_K) -> float:
  """Fraction of the relevant documents retrieved in the top k."""
  relevant = {d for d, r in rels.items() if r > 0}
  return len(relevant.intersection(ranked[:k])) / len(relevant) if relevant else 0.0


def score_rankings(rankings: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
  """Mean nDCG@10, MAP@100 and recall@100 over the ranked queries."""
  qs = list(rankings)
  return {
      "ndcg@10": float(np.mean([ndcg_at(rankings[q], qrels[q], 10) for q in qs])),
      "map@100": float(np.mean([average_precision_at(rankings[q], qrels[q], TOP_K) for q in qs])),
      "recall@100": float(np.mean([recall_at(rankings[q], qrels[q], TOP_K) for q in qs])),}


def evaluate_beir(embedder: embedder_lib.Embedder, folder: str | epath.Path, *, split: str = "test",
                  cache_dir: str | epath.Path | None = None, max_docs: int = 0) -> dict[str, float]:
  """Retrieval scores of `embedder` on a BEIR folder (max_docs > 0: judged docs + the first max_docs)."""
  data = read_beir(folder, split)
  doc_ids, docs = data.doc_ids, data.docs
  if max_docs > 0:  # The judged documents plus the first others: a smaller, easier corpus for smoke tests.
    judged = {d for rels in data.qrels.values() for d in rels}
    keep = [i for i, d in enumerate(doc_ids) if d in judged or i < max_docs]
    doc_ids, docs = [doc_ids[i] for i in keep], [docs[i] for i in keep]
  name = epath.Path(str(folder)).name
  cache = {"cache_dir": cache_dir, "task": f"beir_{name}"}
  doc_emb = embedder_lib.embed_cached(embedder, docs, split="corpus", part="doc", **cache)
  query_emb = embedder_lib.embed_cached(embedder, data.queries, split=split, part="query", **cache)
  idx_QxK = search(doc_emb, query_emb, TOP_K)
  rankings = {q: [doc_ids[j] for j in idx_QxK[i]] for i, q in enumerate(data.query_ids)}
  out = score_rankings(rankings, data.qrels)
  out["queries"] = len(data.query_ids)
  out["documents"] = len(doc_ids)
  return out

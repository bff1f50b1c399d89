"""Retrieval metrics against a hand count with graded relevance; the BEIR reader on SciFact."""

import math

import numpy as np
import pytest

from crossbert_jax.evaluation import retrieval


def test_metrics_match_hand_computation():
  """Query q: relevances d1=2, d2=1, d5=1 (d9 judged 0). Ranking d3, d1, d5, d4, d2, ..."""
  rels = {"d1": 2, "d2": 1, "d5": 1, "d9": 0}
  ranked = ["d3", "d1", "d5", "d4", "d2", "d9", "d6"]
  # DCG@10 = 2/log2(3) + 1/log2(4) + 1/log2(6); ideal = 2/log2(2) + 1/log2(3) + 1/log2(4).
  dcg = 2 / math.log2(3) + 1 / 2 + 1 / math.log2(6)
  idcg = 2 + 1 / math.log2(3) + 1 / 2
  assert retrieval.ndcg_at(ranked, rels, 10) == pytest.approx(dcg / idcg)
  assert retrieval.ndcg_at(ranked, rels, 10) == pytest.approx(0.6863, abs=1e-4)  # 2.1488 / 3.1309
  # AP: hits at ranks 2, 3, 5 -> (1/2 + 2/3 + 3/5) / 3 relevant.
  assert retrieval.average_precision_at(ranked, rels) == pytest.approx((1 / 2 + 2 / 3 + 3 / 5) / 3)
  assert retrieval.average_precision_at(ranked, rels, k=3) == pytest.approx((1 / 2 + 2 / 3) / 3)
  assert retrieval.recall_at(ranked, rels, k=3) == pytest.approx(2 / 3)
  assert retrieval.recall_at(ranked, rels) == 1.0
  # A second query retrieving nothing relevant: means halve.
  scores = retrieval.score_rankings({"q": ranked, "r": ["x", "y"]}, {"q": rels, "r": {"z": 1}})
  assert scores["ndcg@10"] == pytest.approx(dcg / idcg / 2)
  assert scores["recall@100"] == pytest.approx(0.5)


def test_search_is_exact_cosine():
  rng = np.random.default_rng(0)
  docs, queries = rng.normal(size=(500, 8)), rng.normal(size=(20, 8))
  idx = retrieval.search(docs, queries, k=100)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
  np.testing.assert_array_equal(idx, np.argsort(-(unit(queries) @ unit(docs).T), axis=1)[:, :100])


@pytest.mark.integration  # Real data: SciFact's 5,183 documents.
def test_beir_reader_on_scifact(shared_data):
  data = retrieval.read_beir(shared_data / "beir" / "scifact")
  assert len(data.docs) == len(data.doc_ids) == 5183
  assert len(data.query_ids) == 300  # The 300 test claims; 339 qrels pairs.
  assert sum(len(v) for v in data.qrels.values()) == 339
  ids = set(data.doc_ids)
  assert all(d in ids for rels in data.qrels.values() for d in rels)
  assert all(isinstance(q, str) and q for q in data.queries)

"""Probe metrics against scikit-learn / scipy; probes on separable and on shuffled synthetic data."""

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from crossbert_jax.evaluation import tasks as eval_tasks, probes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_sklearn_and_scipy(seed):
  rng = np.random.default_rng(seed)
  y_true, y_pred = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
  y3_true, y3_pred = rng.integers(0, 3, 300), rng.integers(0, 3, 300)
  assert probes.accuracy(y_true, y_pred) == pytest.approx(sk.accuracy_score(y_true, y_pred))
  assert probes.f1(y_true, y_pred) == pytest.approx(sk.f1_score(y_true, y_pred))
  assert probes.matthews(y_true, y_pred) == pytest.approx(sk.matthews_corrcoef(y_true, y_pred))
  assert probes.matthews(y3_true, y3_pred) == pytest.approx(sk.matthews_corrcoef(y3_true, y3_pred))
  a, b = rng.normal(size=200), rng.normal(size=200) + 0.3 * np.arange(200) / 200
  assert probes.pearson(a, b) == pytest.approx(stats.pearsonr(a, b).statistic, abs=1e-9)
  assert probes.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-9)
  # Ties (STS scores are on a coarse grid): average ranks, as scipy.
  ta, tb = rng.integers(0, 6, 200).astype(float), rng.integers(0, 4, 200).astype(float)
  assert probes.spearman(ta, tb) == pytest.approx(stats.spearmanr(ta, tb).statistic, abs=1e-9)


def test_metric_edge_cases():
  assert probes.matthews(np.array([1, 1]), np.array([1, 1])) == 0.0  # Undefined -> 0, as sklearn.
  assert probes.f1(np.array([0, 0]), np.array([0, 0])) == 0.0
  assert probes.pearson(np.ones(5), np.arange(5.0)) == 0.0


def _task(x_NxD, y_N, kind, n_fit):
  fit = eval_tasks.Split([""] * n_fit, y_N[:n_fit])
  test = eval_tasks.Split([""] * (len(y_N) - n_fit), y_N[n_fit:])
  metrics = ("accuracy",) if kind != eval_tasks.REGRESSION else ("spearman", "pearson")
  task = eval_tasks.Task("synthetic", kind, metrics, {"train": fit, "test": test}, fit="train", scored=("test",))
  return task, {"train": x_NxD[:n_fit], "test": x_NxD[n_fit:]}


def _separable(n=1200, d=16, seed=0):
  """Two classes on either side of a margin 2 apart along a random direction (cosine-separable too)."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, n)
  x = rng.normal(size=(n, d))
  w = rng.normal(size=d)
  w /= np.linalg.norm(w)
  x = x - np.outer(x @ w, w) + np.outer(np.where(y == 1, 3.0, -3.0) + rng.uniform(-1, 1, n), w)
  return x, y


def test_probes_are_perfect_on_separable_features():
  """Bound: exactly 100% test accuracy for both probes (margin 2, noise off the direction only)."""
  x, y = _separable()
  task, feats = _task(x, y, eval_tasks.CLASSIFICATION, 800)
  scores, chosen = probes.score_task(task, feats)
  assert scores["linear/test/accuracy"] == 1.0, scores
  assert scores["knn/test/accuracy"] == 1.0, scores
  assert chosen["linear/C"] in probes.C_GRID and chosen["knn/k"] in probes.K_GRID


def test_probes_are_at_chance_on_shuffled_labels():
  """Bound: |accuracy - 0.5| < 0.075 on 1,000 test rows (5 standard deviations: sd = 0.016)."""
  x, y = _separable(n=3000, seed=1)
  y = np.random.default_rng(7).permutation(y)
  task, feats = _task(x, y, eval_tasks.CLASSIFICATION, 2000)
  scores, _ = probes.score_task(task, feats)
  for probe in ("linear", "knn"):
    assert abs(scores[f"{probe}/test/accuracy"] - 0.5) < 0.075, (probe, scores)


def test_regression_and_cross_validation():
  """Ridge recovers a linear score (Spearman > 0.99); CV reports pooled out-of-fold scores."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(600, 8))
  y = (x @ rng.normal(size=8)).astype(np.float32)
  task, feats = _task(x, y, eval_tasks.REGRESSION, 400)
  angle = np.pi / 2 * (y[400:] - y.min()) / np.ptp(y)  # Cosine falls as the score rises.
  u, v = np.stack([np.ones(200), np.zeros(200)], 1), np.stack([np.cos(angle), np.sin(angle)], 1)
  scores, chosen = probes.score_task(task, feats, pair_embeddings={"test": (u, v)})
  assert scores["linear/test/spearman"] > 0.99 and "alpha" in "".join(chosen)
  assert scores["cosine/test/spearman"] == pytest.approx(-1.0)
  x, y = _separable(n=500, seed=4)
  cv = eval_tasks.Task("cv", eval_tasks.CLASSIFICATION, ("accuracy",), {"dev": eval_tasks.Split([""] * 500, y)},
                       fit="dev", scored=())
  scores, chosen = probes.score_task(cv, {"dev": x})
  assert scores["linear/cv/accuracy"] == 1.0 and scores["knn/cv/accuracy"] == 1.0
  assert len([k for k in chosen if k.startswith("knn/k/fold")]) == probes.CV_FOLDS


def test_nearest_matches_brute_force():
  rng = np.random.default_rng(5)
  keys, queries = rng.normal(size=(300, 6)), rng.normal(size=(50, 6))
  idx, sims = probes.nearest(keys, queries, 7, chunk=16)
  full = probes.unit(queries) @ probes.unit(keys).T
  np.testing.assert_array_equal(idx, np.argsort(-full, axis=1)[:, :7])
  np.testing.assert_allclose(sims, np.sort(full, axis=1)[:, ::-1][:, :7], rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_best_threshold_matches_brute_force(seed):
  """The vectorised search equals trying every midpoint, both directions, with ties on a coarse grid."""
  rng = np.random.default_rng(seed)
  sims = np.round(rng.normal(size=120), 1)
  y = (sims + rng.normal(scale=0.8, size=120) < 0).astype(np.int64)  # Class 1 = less similar here.
  cuts = np.unique(sims)
  cands = np.r_[cuts[0] - 1, (cuts[1:] + cuts[:-1]) / 2, cuts[-1] + 1]
  for metric in ("accuracy", "f1"):
    brute = max(probes.METRICS[metric](y, ((sims > t) == h).astype(np.int64)) for t in cands for h in (True, False))
    t, higher = probes.best_threshold(sims, y, metric)
    assert probes.METRICS[metric](y, probes._threshold_predict(sims, t, higher)) == pytest.approx(brute)
    assert not higher


def test_cosine_threshold_scores_on_a_pair_task():
  """Binary pairs: similar pairs are class 1; the threshold chosen on train scores 100% on test, and CV."""
  rng = np.random.default_rng(0)
  y = rng.integers(0, 2, 400)
  u = rng.normal(size=(400, 8))
  v = np.where(y[:, None] == 1, u + 0.1 * rng.normal(size=(400, 8)), rng.normal(size=(400, 8)))
  fit = eval_tasks.Split([""] * 300, y[:300], [""] * 300)
  test = eval_tasks.Split([""] * 100, y[300:], [""] * 100)
  task = eval_tasks.Task("pairs", eval_tasks.PAIR_CLASSIFICATION, ("accuracy", "f1"), {"train": fit, "test": test},
                         fit="train", scored=("test",), cosine_splits=("test",))
  feats = {"train": np.concatenate([u, v], 1)[:300], "test": np.concatenate([u, v], 1)[300:]}
  scores, chosen = probes.score_task(task, feats,
                                     pair_embeddings={"train": (u[:300], v[:300]), "test": (u[300:], v[300:])})
  assert scores["cosine/test/accuracy"] == 1.0 and scores["cosine/test/f1"] == 1.0
  assert "cosine/train/accuracy" not in scores and chosen["cosine/accuracy_higher_is_positive"] == 1
  cv = eval_tasks.Task("pairs", eval_tasks.PAIR_CLASSIFICATION, ("accuracy", "f1"),
                       {"train": eval_tasks.Split([""] * 400, y, [""] * 400)}, fit="train", scored=(),
                       cosine_splits=("train",))
  scores, _ = probes.score_task(cv, {"train": np.concatenate([u, v], 1)}, pair_embeddings={"train": (u, v)})
  assert scores["cosine/cv/accuracy"] == 1.0 and scores["cosine/cv/f1"] == 1.0


@pytest.mark.parametrize("kind", ["classification", "regression"])
@pytest.mark.parametrize("cv", [True, False])
def test_probes_run_at_the_generic_minimum_sizes(kind, cv):
  """The smallest data the generic reader accepts goes through both probes (CV, or an eval split)."""
  from crossbert_jax.evaluation import generic

  rng = np.random.default_rng(1)
  if kind == "classification":
    y = np.repeat([0, 1], generic.MIN_PER_CLASS_CV if cv else generic.MIN_PER_CLASS)
  else:
    y = rng.normal(size=generic.MIN_REGRESSION_ROWS_CV if cv else generic.MIN_REGRESSION_ROWS).astype(np.float32)
  metrics = ("accuracy", "f1") if kind == "classification" else ("spearman", "pearson")
  splits = {"train": eval_tasks.Split([""] * len(y), y), "eval": eval_tasks.Split(["", ""], y[[0, -1]])}
  task = eval_tasks.Task("tiny", kind, metrics, splits, fit="train", scored=() if cv else ("eval",))
  scores, _ = probes.score_task(task, {"train": rng.normal(size=(len(y), 4)), "eval": rng.normal(size=(2, 4))})
  assert all(np.isfinite(v) for v in scores.values()) and len(scores) == 4


def test_chance_score_is_the_constant_predictor():
  y_fit = np.array([1] * 60 + [0] * 40)
  y_dev, y_test = np.array([1] * 3 + [0] * 7), np.array([1] * 15 + [0] * 15)
  split = lambda y: eval_tasks.Split([""] * len(y), y)
  task = eval_tasks.Task("t", eval_tasks.CLASSIFICATION, ("accuracy",),
                         {"train": split(y_fit), "dev": split(y_dev), "test": split(y_test)}, "train", ("dev", "test"))
  assert probes.chance_score(task) == pytest.approx((3 + 15) / 40)  # Majority 1, over dev + test.
  assert probes.chance_score(eval_tasks.probe_view(task, "first")) == pytest.approx(0.3)
  f1_task = eval_tasks.Task("t", eval_tasks.PAIR_CLASSIFICATION, ("f1",), task.splits, "train", ("dev",))
  assert probes.chance_score(f1_task) == pytest.approx(2 * 3 / (3 + 10))
  cv = eval_tasks.Task("t", eval_tasks.CLASSIFICATION, ("accuracy",), {"train": split(y_fit)}, "train", ())
  assert probes.chance_score(cv) == pytest.approx(0.6)
  reg = eval_tasks.Task("t", eval_tasks.REGRESSION, ("spearman",), task.splits, "train", ("dev",))
  assert probes.chance_score(reg) == 0.0


def test_headline_is_the_size_weighted_mean_of_the_scored_splits():
  from crossbert_jax.evaluation import runner  # pylint: disable=g-import-not-at-top  (pulls in jax)

  split = lambda n: eval_tasks.Split([""] * n, np.zeros(n, np.int64))
  task = eval_tasks.Task("t", eval_tasks.CLASSIFICATION, ("accuracy",),
                         {"train": split(100), "dev": split(10), "test": split(30)}, "train", ("dev", "test"))
  result = {
      "scores": {
          "linear/dev/accuracy": 0.5, "linear/test/accuracy": 0.9, "knn/dev/accuracy": 0.4, "knn/test/accuracy": 0.8},
      "sizes": {"train": 100, "dev": 10, "test": 30}}
  assert runner.headline(task, result) == {"linear": pytest.approx(0.8), "knn": pytest.approx(0.7)}
  assert runner.headline(eval_tasks.probe_view(task, "first"), result) == {"linear": 0.5, "knn": 0.4}

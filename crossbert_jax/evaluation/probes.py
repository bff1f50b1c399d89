"""Frozen probes on fixed embeddings: linear (logistic / ridge), cosine KNN, zero-shot cosine STS.

Hyperparameters (the regularisation strength, k) are chosen on a seeded validation split carved
from the fit split (10%, stratified for classes), then the probe is refitted on the whole fit
split. Without a separate evaluation split, probes are scored by 5-fold cross-validation
(out-of-fold predictions pooled, each fold choosing its own hyperparameters the same way).
Shape letters: N examples, D features, K neighbours.
"""

import warnings
from typing import Callable

import numpy as np
from crossbert_jax.evaluation import tasks as eval_tasks

C_GRID = (0.01, 0.1, 1.0, 10.0)  # Logistic regression inverse regularisation strengths.
ALPHA_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0)  # Ridge penalties.
K_GRID = (1, 3, 5, 9, 17, 33)
VAL_FRACTION = 0.1
CV_FOLDS = 5

# ----------------------------------------------------------------------------- metrics


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
  """Fraction of exact matches."""
  return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def matthews(y_true: np.ndarray, y_pred: np.ndarray) -> float:
  """Matthews correlation (multiclass form; 0 when undefined), as sklearn's matthews_corrcoef."""
  classes, idx = np.unique(np.concatenate([y_true, y_pred]), return_inverse=True)
  n_true, n_pred = idx[:len(y_true)], idx[len(y_true):]
  conf = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(conf, (n_true, n_pred), 1.0)
  t_k, p_k, c, s = conf.sum(1), conf.sum(0), np.trace(conf), conf.sum()
  cov_ytyp = c * s - t_k @ p_k
  cov_ypyp = s * s - p_k @ p_k
  cov_ytyt = s * s - t_k @ t_k
  denom = np.sqrt(cov_ytyt * cov_ypyp)
  return float(cov_ytyp / denom) if denom > 0 else 0.0


def f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
  """Binary F1 of the positive class 1 (0 when there are no true or predicted positives)."""
  tp = float(np.sum((y_true == 1) & (y_pred == 1)))
  denom = float(np.sum(y_true == 1) + np.sum(y_pred == 1))
  return 2.0 * tp / denom if denom > 0 else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
  """Ranks from 1, ties given their average rank (scipy.stats.rankdata 'average')."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
  group = np.cumsum(starts) - 1
  first = np.flatnonzero(starts)
  last = np.r_[first[1:], len(x)] - 1
  ranks = np.empty(len(x), np.float64)
  ranks[order] = (first[group] + last[group]) / 2.0 + 1.0
  return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation (0 when either side is constant)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  xc, yc = x - x.mean(), y - y.mean()
  denom = np.sqrt((xc @ xc) * (yc @ yc))
  return float(xc @ yc / denom) if denom > 0 else 0.0


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman rank correlation (Pearson of average ranks)."""
  return pearson(_ranks(x), _ranks(y))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "matthews": matthews,
    "f1": f1,
    "pearson": pearson,
    "spearman": spearman,}


def weighted_mean(values: list[float], sizes: list[int]) -> float:
  """The size-weighted mean of per-split scores (the value itself when there is one)."""
  return float(values[0]) if len(values) == 1 else float(np.dot(values, sizes) / max(sum(sizes), 1))


def chance_score(task: eval_tasks.Task, max_examples: int = 0, seed: int = 0) -> float:
  """The headline score of the best constant predictor on `task` as its probes are scored: its chance level.

  Classes: the fit split's majority class on every scored split (size-weighted, as the in-training
  headline), or on the fit split itself under cross-validation; the same seeded subsets as the
  probes. Regression: 0 (a constant has no correlation).
  """
  if task.kind == eval_tasks.REGRESSION:
    return 0.0
  majority = int(np.bincount(task.splits[task.fit].subset(max_examples, seed).labels).argmax())
  labels = [task.splits[s].subset(max_examples, seed).labels for s in (task.scored or (task.fit,))]
  metric = METRICS[task.metrics[0]]
  return weighted_mean([metric(y, np.full_like(y, majority)) for y in labels], [len(y) for y in labels])


# ----------------------------------------------------------------------------- splits


def val_split(labels: np.ndarray, seed: int, classification: bool) -> tuple[np.ndarray, np.ndarray]:
  """(fit indices, validation indices): a seeded 10% split, stratified by class."""
  rng = np.random.default_rng(seed)
  groups = [np.flatnonzero(labels == c) for c in np.unique(labels)] if classification else [np.arange(len(labels))]
  val = []
  for g in groups:
    g = rng.permutation(g)
    val.append(g[:max(1, int(round(len(g) * VAL_FRACTION)))] if len(g) > 1 else g[:0])
  val_idx = np.sort(np.concatenate(val))
  return np.setdiff1d(np.arange(len(labels)), val_idx), val_idx


def cv_folds(labels: np.ndarray, seed: int, classification: bool, folds: int = CV_FOLDS) -> np.ndarray:
  """Fold id per example: seeded, stratified by class for classification."""
  rng = np.random.default_rng(seed)
  fold_N = np.zeros(len(labels), np.int64)
  groups = [np.flatnonzero(labels == c) for c in np.unique(labels)] if classification else [np.arange(len(labels))]
  offset = 0
  for g in groups:
    g = rng.permutation(g)
    fold_N[g] = (np.arange(len(g)) + offset) % folds
    offset += len(g)
  return fold_N


# ----------------------------------------------------------------------------- probes


def _standardise(fit_NxD: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
  mean_D = fit_NxD.mean(0)
  std_D = fit_NxD.std(0) + 1e-6
  return [(x - mean_D) / std_D for x in (fit_NxD,) + others]


def _linear_model(classification: bool, strength: float):
  # Imported here: scikit-learn (with scipy) costs 1.4 s of every training process's start-up, which
  # imports this module for the in-training evaluation hook and fits a probe only when that hook runs.
  from sklearn import linear_model  # pylint: disable=g-import-not-at-top
  if classification:
    return linear_model.LogisticRegression(C=strength, max_iter=500)
  return linear_model.Ridge(alpha=strength)


def _fit_predict_linear(x_NxD, y_N, queries, classification, strength):
  from sklearn import exceptions as sk_exceptions  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    # A probe that does not fully converge in max_iter is still a valid (slightly weaker) probe.
    warnings.simplefilter("ignore", sk_exceptions.ConvergenceWarning)
    model = _linear_model(classification, strength).fit(x_NxD, y_N)
  return [model.predict(q) for q in queries]


def linear_probe(x_NxD: np.ndarray, y_N: np.ndarray, queries: list[np.ndarray], classification: bool, metric: str,
                 seed: int) -> tuple[list[np.ndarray], float]:
  """Predictions on each query matrix and the chosen C (logistic) or alpha (ridge)."""
  fit_idx, val_idx = val_split(y_N, seed, classification)
  xf, xv = _standardise(x_NxD[fit_idx], x_NxD[val_idx])
  grid = C_GRID if classification else ALPHA_GRID
  scores = [
      METRICS[metric](y_N[val_idx], _fit_predict_linear(xf, y_N[fit_idx], [xv], classification, s)[0]) for s in grid]
  best = grid[int(np.argmax(scores))]  # First best: ties go to the strongest regularisation listed first.
  x_all, *qs = _standardise(x_NxD, *queries)
  return _fit_predict_linear(x_all, y_N, qs, classification, best), best


def unit(x_NxD: np.ndarray) -> np.ndarray:
  """Rows scaled to unit length (float32; an all-zero row stays zero)."""
  x_NxD = np.asarray(x_NxD, np.float32)
  return x_NxD / np.maximum(np.linalg.norm(x_NxD, axis=-1, keepdims=True), 1e-12)


def nearest(keys_NxD: np.ndarray, queries_MxD: np.ndarray, k: int, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
  """(indices MxK, cosine similarities MxK) of each query's k most similar keys, best first."""
  keys, k = unit(keys_NxD), min(k, len(keys_NxD))
  idx_out, sim_out = [], []
  for start in range(0, len(queries_MxD), chunk):
    sims_CxN = unit(queries_MxD[start:start + chunk]) @ keys.T
    top_CxK = np.argpartition(-sims_CxN, k -
                              1, axis=1)[:, :k] if k < keys.shape[0] else np.tile(np.arange(keys.shape[0]),
                                                                                  (len(sims_CxN), 1))
    top_sims = np.take_along_axis(sims_CxN, top_CxK, 1)
    order = np.lexsort((top_CxK, -top_sims), axis=1)  # By similarity, then index: deterministic ties.
    idx_out.append(np.take_along_axis(top_CxK, order, 1))
    sim_out.append(np.take_along_axis(top_sims, order, 1))
  return np.concatenate(idx_out), np.concatenate(sim_out)


def knn_predict(idx_MxK, sims_MxK, y_N, k, classification, num_classes):
  """Predictions from each query's neighbours (best first): the vote of the first k, or their mean score."""
  labels_MxK = y_N[idx_MxK[:, :k]]
  if not classification:
    return labels_MxK.astype(np.float64).mean(1)
  votes_MxC = np.zeros((len(labels_MxK), num_classes))
  rows = np.repeat(np.arange(len(labels_MxK)), labels_MxK.shape[1])
  np.add.at(votes_MxC, (rows, labels_MxK.ravel()), 1.0)
  # Ties between classes go to the larger summed similarity (scaled below one vote).
  np.add.at(votes_MxC, (rows, labels_MxK.ravel()), 1e-3 * (sims_MxK[:, :k].ravel() + 1.0) / (k + 1))
  return votes_MxC.argmax(1)


def knn_probe(x_NxD: np.ndarray, y_N: np.ndarray, queries: list[np.ndarray], classification: bool, metric: str,
              seed: int) -> tuple[list[np.ndarray], int]:
  """Cosine KNN predictions (majority vote, or mean score for regression) and the chosen k."""
  fit_idx, val_idx = val_split(y_N, seed, classification)
  num_classes = int(y_N.max()) + 1 if classification else 0
  idx, sims = nearest(x_NxD[fit_idx], x_NxD[val_idx], max(K_GRID))
  yf = y_N[fit_idx]
  grid = [k for k in K_GRID if k <= len(fit_idx)]
  scores = [METRICS[metric](y_N[val_idx], knn_predict(idx, sims, yf, k, classification, num_classes)) for k in grid]
  best = grid[int(np.argmax(scores))]
  preds = []
  for q in queries:
    qi, qs = nearest(x_NxD, q, best)
    preds.append(knn_predict(qi, qs, y_N, best, classification, num_classes))
  return preds, best


PROBES = {"linear": linear_probe, "knn": knn_probe}


def cosine(u_NxD: np.ndarray, v_NxD: np.ndarray) -> np.ndarray:
  """Row-wise cosine similarity."""
  return np.sum(unit(u_NxD) * unit(v_NxD), axis=-1)


# ----------------------------------------------------------------------------- a task


def score_task(task: eval_tasks.Task, features: dict[str, np.ndarray], *, seed: int = 0,
               probes: tuple[str, ...] = ("linear", "knn"), scored: tuple[str, ...] | None = None,
               pair_embeddings: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> tuple[dict, dict]:
  """(scores {"<probe>/<split>/<metric>": value}, chosen {"<probe>/<C|alpha|k>": value}) for one task.

  `features` maps split -> NxD probe inputs; `pair_embeddings` maps split -> (u, v) separate
  sentence embeddings for the zero-shot cosine score: Spearman for regression, accuracy / F1
  at a threshold chosen on the fit split for binary pair classification (whose fit split must
  be in `pair_embeddings`). Cross-validated scores use the split name "cv".
  """
  classification = task.kind != eval_tasks.REGRESSION
  headline = task.metrics[0]
  scored = task.scored if scored is None else scored
  y = task.splits[task.fit].labels
  x = features[task.fit]
  scores, chosen = {}, {}
  for name in probes:
    probe = PROBES[name]
    knob = "k" if name == "knn" else ("C" if classification else "alpha")
    if scored:
      preds, best = probe(x, y, [features[s] for s in scored], classification, headline, seed)
      chosen[f"{name}/{knob}"] = best
      for split, pred in zip(scored, preds):
        for m in task.metrics:
          scores[f"{name}/{split}/{m}"] = METRICS[m](task.splits[split].labels, pred)
      continue
    fold_N = cv_folds(y, seed, classification)
    pred_N = np.zeros(len(y), np.float64 if not classification else np.int64)
    for f in range(CV_FOLDS):
      train, test = fold_N != f, fold_N == f
      (pred,), best = probe(x[train], y[train], [x[test]], classification, headline, seed + f)
      pred_N[test] = pred
      chosen[f"{name}/{knob}/fold{f}"] = best
    for m in task.metrics:
      scores[f"{name}/cv/{m}"] = METRICS[m](y, pred_N)
  if pair_embeddings and not classification:
    for split, (u, v) in pair_embeddings.items():
      scores[f"cosine/{split}/spearman"] = spearman(cosine(u, v), task.splits[split].labels)
  elif pair_embeddings:
    scores.update(cosine_threshold_scores(task, pair_embeddings, scored, seed, chosen))
  return scores, chosen


def best_threshold(sims_N: np.ndarray, y_N: np.ndarray, metric: str) -> tuple[float, bool]:
  """(threshold, higher_is_positive) maximising `metric` (accuracy or f1 of class 1) on (sims, y).

  Every cut between two distinct similarities is tried, in both directions (a generic task's
  class 1 may mean "similar" or "different"); the first best wins.
  """
  order = np.argsort(-sims_N, kind="stable")
  s, y = sims_N[order].astype(np.float64), (y_N[order] == 1).astype(np.float64)
  n, pos = len(y), y.sum()
  k = np.arange(n + 1)  # The top k rows predicted 1 (higher_is_positive), the rest 0.
  tp = np.r_[0.0, np.cumsum(y)]
  cut = np.r_[True, s[1:] != s[:-1], True]  # Cuts between equal similarities are not realisable.
  best = (-1.0, 0.0, True)
  for higher in (True, False):
    tp_k = tp if higher else pos - tp  # Flipped: the bottom n - k rows predicted 1.
    pred_pos = k if higher else n - k
    if metric == "accuracy":
      score = (2 * tp_k + n - pos - pred_pos) / max(n, 1)
    else:
      score = 2 * tp_k / np.maximum(pred_pos + pos, 1)
    score = np.where(cut, score, -1.0)
    i = int(np.argmax(score))
    if score[i] > best[0]:
      lo, hi = (s[i] if i < n else s[-1] - 1.0), (s[i - 1] if i > 0 else s[0] + 1.0)
      best = (float(score[i]), float((lo + hi) / 2), higher)
  return best[1], best[2]


def _threshold_predict(sims_N: np.ndarray, threshold: float, higher: bool) -> np.ndarray:
  return ((sims_N > threshold) == higher).astype(np.int64)


def cosine_threshold_scores(task: eval_tasks.Task, pair_embeddings: dict, scored: tuple[str, ...], seed: int,
                            chosen: dict) -> dict[str, float]:
  """Zero-shot cosine of a binary pair task: accuracy / F1 at the threshold best on the fit split.

  Each metric gets its own threshold, chosen on the fit split (per fold under cross-validation),
  never on the split it is reported on.
  """
  sims = {s: cosine(u, v) for s, (u, v) in pair_embeddings.items()}
  y = task.splits[task.fit].labels
  out = {}
  for m in ("accuracy", "f1"):
    if scored:
      t, higher = best_threshold(sims[task.fit], y, m)
      chosen[f"cosine/{m}_threshold"], chosen[f"cosine/{m}_higher_is_positive"] = t, int(higher)
      for split in scored:
        if split in sims:
          out[f"cosine/{split}/{m}"] = METRICS[m](task.splits[split].labels, _threshold_predict(sims[split], t, higher))
      continue
    fold_N = cv_folds(y, seed, True)
    pred_N = np.zeros(len(y), np.int64)
    for f in range(CV_FOLDS):
      train, test = fold_N != f, fold_N == f
      t, higher = best_threshold(sims[task.fit][train], y[train], m)
      pred_N[test] = _threshold_predict(sims[task.fit][test], t, higher)
    out[f"cosine/cv/{m}"] = METRICS[m](y, pred_N)
  return out

"""Frozen GLUE for one model, resumable per task: embed once (cached), probe with several seeds, save.

Each task's result is one JSON file, results/<column key>/<settings digest>/<task>.json, written whole
(temporary file + rename) when the task is done; a rerun with the same settings reads it instead of
embedding again (`force` redoes it), so a killed evaluation finishes only the missing tasks. The
table is always built from these files, so a resumed run's table is byte for byte an uninterrupted one's.

Protocol: mean-pooled frozen features (the embedder's options), standardised for the linear probe;
logistic regression (ridge for STS-B) and cosine KNN; C / alpha and k chosen on a seeded, stratified
10% slice of train (never the reported split), then refitted on all of train; each probe seed draws
its own slice, giving a mean and spread. Train sets over BIG_TRAIN rows (MNLI, QQP) choose k on at
most KNN_VAL_CAP rows of that slice, and reuse the reported splits' neighbours across seeds.
"""

import hashlib
import json
import time
from typing import Any, Callable

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import glue
from crossbert_jax.evaluation import probes
from crossbert_jax.evaluation import tasks as eval_tasks

BIG_TRAIN = 100_000
KNN_VAL_CAP = 5_000
PROBES = ("linear", "knn")


def settings_digest(settings: dict[str, Any]) -> str:
  """8 hex digits naming what a result depends on (options, seeds, subset size, data revision)."""
  return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


def column_key(label: str, identity: str) -> str:
  """A results folder name for a column: its label made path-safe, plus a digest of the model's identity."""
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
  return f"{safe}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def _features(emb: embedder_lib.Embedder, task: eval_tasks.Task, cache_dir: str | None) -> dict[str, np.ndarray]:
  out = {}
  for name in sorted({task.fit, *task.scored}):
    sp = task.splits[name]
    cache = {"cache_dir": cache_dir, "task": f"glue-{task.name}", "split": name}
    out[name] = (embedder_lib.embed_cached(emb, sp.texts, **cache) if sp.pairs is None else embedder_lib.pair_features(
        emb, sp.texts, sp.pairs, **cache))
  return out


def nearest_large(keys_NxD: np.ndarray, queries_MxD: np.ndarray, k: int,
                  chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
  """probes.nearest for a big key set: torch's matmul and top-k (measured 6.7x numpy's argpartition on
  393k keys), chunks of 256 queries (~400 MB of similarities); ties ordered by index, as there."""
  import torch  # Local: only big train sets need it.

  keys = torch.from_numpy(probes.unit(keys_NxD))
  k = min(k, len(keys_NxD))
  idx_out, sim_out = [], []
  for start in range(0, len(queries_MxD), chunk):
    sims, idx = torch.topk(torch.from_numpy(probes.unit(queries_MxD[start:start + chunk])) @ keys.T, k, dim=1)
    sims, idx = sims.numpy(), idx.numpy()
    order = np.lexsort((idx, -sims), axis=1)
    idx_out.append(np.take_along_axis(idx, order, 1))
    sim_out.append(np.take_along_axis(sims, order, 1))
  return np.concatenate(idx_out), np.concatenate(sim_out)


def _big_knn(task: eval_tasks.Task, features: dict[str, np.ndarray], seed: int, neighbours: dict) -> tuple[dict, int]:
  """KNN on a big train set: k chosen on at most KNN_VAL_CAP rows of the seed's slice; neighbours of the
  reported splits computed once (max k) and shared by the seeds."""
  classification = task.kind != eval_tasks.REGRESSION
  x, y = features[task.fit], task.splits[task.fit].labels
  num_classes = int(y.max()) + 1 if classification else 0
  fit_idx, val_idx = probes.val_split(y, seed, classification)
  if len(val_idx) > KNN_VAL_CAP:
    val_idx = np.sort(np.random.default_rng(seed).permutation(val_idx)[:KNN_VAL_CAP])
  idx, sims = nearest_large(x[fit_idx], x[val_idx], max(probes.K_GRID))
  metric = task.metrics[0]
  scores = [
      probes.METRICS[metric](y[val_idx], probes.knn_predict(idx, sims, y[fit_idx], k, classification, num_classes))
      for k in probes.K_GRID]
  best = probes.K_GRID[int(np.argmax(scores))]
  out = {}
  for split in task.scored:
    if split not in neighbours:
      neighbours[split] = nearest_large(x, features[split], max(probes.K_GRID))
    pred = probes.knn_predict(*neighbours[split], y, best, classification, num_classes)
    for m in task.metrics:
      out[f"knn/{split}/{m}"] = probes.METRICS[m](task.splits[split].labels, pred)
  return out, best


def seed_scores(task: eval_tasks.Task, features: dict[str, np.ndarray], seed: int,
                neighbours: dict) -> tuple[dict[str, float], dict[str, Any]]:
  """One probe seed's {"<probe>/<split>/<metric>": score} and chosen hyperparameters."""
  if len(task.splits[task.fit]) <= BIG_TRAIN or not task.scored:
    return probes.score_task(task, features, seed=seed, probes=PROBES)
  scores, chosen = probes.score_task(task, features, seed=seed, probes=("linear",))
  knn, k = _big_knn(task, features, seed, neighbours)
  return {**scores, **knn}, {**chosen, "knn/k": k}


def run_task(emb: embedder_lib.Embedder, task: eval_tasks.Task, spec: glue.GlueTask, *, seeds: int,
             cache_dir: str | None) -> dict[str, Any]:
  """{"rows": {row: {probe: {metric: [score per seed]}}}, "chosen", "sizes", "note"} of one task."""
  features = _features(emb, task, cache_dir)
  per_seed, neighbours = [], {}
  for seed in range(seeds):
    per_seed.append(seed_scores(task, features, seed, neighbours))
  rows = {}
  for row, split in spec.rows:
    key = split if task.scored else "cv"
    rows[row] = {p: {m: [s[f"{p}/{key}/{m}"] for s, _ in per_seed] for m in spec.metrics} for p in PROBES}
  return {
      "rows": rows, "chosen": [c for _, c in per_seed], "sizes": {s: len(v) for s, v in task.splits.items()},
      "note": task.note}


def _write_json(path: epath.Path, obj: Any) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / (path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=1, default=_json_default) + "\n")
  tmp.replace(path)  # Over an earlier result (--force) too; rename refuses an existing target.


def _json_default(value):
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"not JSON serialisable: {type(value)}")


def read_saved(path: epath.Path, name: str, seeds: int, log: Callable[[str], None] = print,
               then: str = "") -> dict | None:
  """The task's saved result at `path`, or None when there is none or it is damaged (truncated, empty,
  not this task's, rows or seeds missing): then one warning line ending in `then` (default: it runs again)."""
  if not path.exists():
    return None
  try:
    saved = json.loads(path.read_text())
    ok = _complete(saved, name, seeds)
  except (OSError, ValueError, KeyError, TypeError) as e:
    ok, why = False, f"{type(e).__name__}: {' '.join(str(e).split())[:80]}"
  else:
    why = "not a complete result of this task"
  if ok:
    return saved
  log(f"warning: {path} is damaged ({why}); {then or f'running {name} again'}")
  return None


def _complete(saved: Any, name: str, seeds: int) -> bool:
  """Whether `saved` is a whole result of task `name`: every row, probe and metric with a score per seed."""
  if not (isinstance(saved, dict) and saved.get("task") == name and isinstance(saved.get("sizes"), dict)):
    return False
  spec = glue.TASKS[name]
  cells = [saved["rows"][row][p][m] for row, _ in spec.rows for p in PROBES for m in spec.metrics]
  return all(len(c) == seeds and all(isinstance(v, (int, float)) for v in c) for c in cells)


def subset(task: eval_tasks.Task, max_examples: int, seed: int) -> eval_tasks.Task:
  """The task with each split cut to a seeded subset of `max_examples` rows (0: all); a classification task
  whose fitted split is left with one class is refused (no probe can be fitted to it)."""
  splits = {s: v.subset(max_examples, seed) for s, v in task.splits.items()}
  task = eval_tasks.Task(task.name, task.kind, task.metrics, splits, task.fit, task.scored, task.note)
  if task.kind != eval_tasks.REGRESSION and len(np.unique(splits[task.fit].labels)) < 2:
    raise UserError(f"--max_examples={max_examples} leaves {task.name} {task.fit} with one class "
                    f"({splits[task.fit].labels[0]}), which no probe can be fitted to: raise --max_examples or use 0")
  return task


def run_model(emb: embedder_lib.Embedder, plan: dict[str, str], folder: epath.Path, *,
              load: Callable[[str, str], eval_tasks.Task], seeds: int, max_examples: int, data_seed: int,
              cache_dir: str | None, force: bool, log: Callable[[str], None] = print) -> dict[str, dict]:
  """{task: its saved result} for every task of `plan` ({task: source}), run or read back from `folder`.

  A progress line per task: its score, texts embedded, tokens/s, time and an ETA from the tasks run so far.
  """
  saved = {n: None if force else read_saved(folder / f"{n}.json", n, seeds, log) for n in plan}
  todo = [saved[n] is None for n in plan]
  out, spent, done = {}, 0.0, 0
  texts0, tokens0, seconds0 = emb.sentences_seen, getattr(emb, "tokens_seen", 0), emb.seconds
  for i, (name, source) in enumerate(plan.items(), 1):
    path = folder / f"{name}.json"
    start, seen, tokens = time.perf_counter(), emb.sentences_seen, getattr(emb, "tokens_seen", 0)
    if todo[i - 1]:
      task = subset(load(name, source), max_examples, data_seed)
      result = run_task(emb, task, glue.TASKS[name], seeds=seeds, cache_dir=cache_dir)
      _write_json(path, {"task": name, "source": source, **result})
      spent, done = spent + time.perf_counter() - start, done + 1
    # Read back: a resumed run's table is the same bitwise.
    out[name] = json.loads(path.read_text()) if todo[i - 1] else saved[name]
    seconds = time.perf_counter() - start
    texts, toks = emb.sentences_seen - seen, getattr(emb, "tokens_seen", 0) - tokens
    left = sum(todo[i:])
    eta = f", ETA {spent / done * left / 60:.1f} min ({left} tasks)" if done and left else ""
    status = "cached" if not todo[i - 1] else f"{texts} texts, {toks / max(seconds, 1e-9):,.0f} tokens/s"
    first = next(iter(out[name]["rows"].values()))["linear"]
    log(f"[{i}/{len(plan)}] {name}: linear {100 * glue.row_score({m: np.mean(v) for m, v in first.items()}):.1f} "
        f"({status}, {seconds:.1f} s{eta})")
  tokens, seconds = getattr(emb, "tokens_seen", 0) - tokens0, emb.seconds - seconds0
  if tokens:
    log(f"embedded {emb.sentences_seen - texts0:,} texts, {tokens:,} tokens in {seconds:.1f} s: "
        f"{tokens / max(seconds, 1e-9):,.0f} tokens/s (the embedder alone)")
  return out

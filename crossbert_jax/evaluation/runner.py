"""Frozen evaluation of an embedder: probes and retrieval per task, one markdown table.

`evaluate_model` scores an `Embedder` on tasks and BEIR folders; `probe_scores` gives the same
probes during pretraining, on a fixed seeded subset or the whole splits (eval.*), which
`probe_hook` runs as a training-loop hook (run/hooks.py; the train command adds it). The CLI is
`crossbert_jax.evaluate`.
"""

import functools
import time
from typing import Any, Sequence

from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import tasks as eval_tasks, probes, retrieval
from crossbert_jax.model.encoder import EncoderSpec

PROBE_MAX_LENGTH = 128  # probe_scores: SST-2 / STS-B sentences fit easily.

# ----------------------------------------------------------------------------- one task


def evaluate_task(emb: embedder_lib.Embedder, task: eval_tasks.Task, *, seed: int = 0, max_examples: int = 0,
                  cache_dir: str | None = None, scored: tuple[str, ...] | None = None,
                  cosine_splits: tuple[str, ...] | None = None) -> dict[str, Any]:
  """{"scores", "chosen", "sizes", "note"} of the linear and KNN probes (+ zero-shot cosine) on `task`."""
  scored = task.scored if scored is None else scored
  cosine_splits = task.cosine_splits if cosine_splits is None else cosine_splits
  needed = sorted({task.fit, *scored, *cosine_splits})
  splits = {s: task.splits[s].subset(max_examples, seed) for s in needed}
  task = eval_tasks.Task(task.name, task.kind, task.metrics, splits, task.fit, scored, task.note, cosine_splits)
  features, pair_emb = {}, {}
  for name in {task.fit, *scored}:
    sp = splits[name]
    cache = {"cache_dir": cache_dir, "task": task.name, "split": name}
    if sp.pairs is None:
      features[name] = embedder_lib.embed_cached(emb, sp.texts, **cache)
    else:
      features[name] = embedder_lib.pair_features(emb, sp.texts, sp.pairs, **cache)
  # A binary pair task's cosine threshold is chosen on the fit split: embed its sides too.
  thresholded = cosine_splits and task.kind != eval_tasks.REGRESSION
  for name in sorted(set(cosine_splits) | ({task.fit} if thresholded else set())):
    sp = splits[name]
    cache = {"cache_dir": cache_dir, "task": task.name, "split": name}
    pair_emb[name] = (embedder_lib.embed_cached(emb, sp.texts, part="a",
                                                **cache), embedder_lib.embed_cached(emb, sp.pairs, part="b", **cache))
  scores, chosen = probes.score_task(task, features, seed=seed, pair_embeddings=pair_emb)
  return {"scores": scores, "chosen": chosen, "sizes": {s: len(splits[s]) for s in needed}, "note": task.note}


def headline(task: eval_tasks.Task, result: dict[str, Any]) -> dict[str, float]:
  """{probe: the task's first metric}, plus cosine_spearman: over its scored splits (cv if none).

  Several scored (or cosine) splits give their mean weighted by split size (for accuracy, the
  accuracy over their union).
  """
  splits = task.scored or ("cv",)
  sizes = [result["sizes"].get(s, 1) for s in splits]
  out = {
      p: probes.weighted_mean([result["scores"][f"{p}/{s}/{task.metrics[0]}"] for s in splits], sizes)
      for p in probes.PROBES}
  cos = [s for s in task.cosine_splits if f"cosine/{s}/spearman" in result["scores"]]
  if cos:
    out["cosine_spearman"] = probes.weighted_mean([result["scores"][f"cosine/{s}/spearman"] for s in cos],
                                                  [result["sizes"][s] for s in cos])
  return out


# ----------------------------------------------------------------------------- during pretraining


@functools.lru_cache(maxsize=32)
def _cached_task(name: str, data_dir: str) -> eval_tasks.Task:
  return eval_tasks.load_task(name, data_dir, data_flag="--config.eval.data_dir")


def check_probe_inputs(config) -> None:
  """Reads every eval.tasks task from eval.data_dir now, so a bad one fails before training, not at
  the first probe; errors name the config keys. A no-op with eval.every_steps=0. The tasks stay
  cached for `probe_scores` in this process.
  """
  if config.eval.every_steps <= 0:
    return
  names = eval_tasks.parse_tasks(config.eval.tasks, flag="--config.eval.tasks")
  if not names:
    raise UserError(f"--config.eval.tasks={config.eval.tasks!r} names no task but eval.every_steps="
                    f"{config.eval.every_steps}: name tasks (e.g. sst2,stsb) or set --config.eval.every_steps=0")
  for name in names:
    _cached_task(name, str(config.eval.data_dir))


def _on_one_device(params):
  """The params on this process's first device: small probe batches run faster unsharded."""
  import jax  # Local: the CLI imports jax through the embedder anyway; keep the top light.

  leaves = jax.tree.leaves(params)
  if all(getattr(x, "is_fully_addressable", True) for x in leaves):
    return jax.device_put(params, jax.local_devices()[0])
  from jax.experimental import multihost_utils

  return jax.device_put(multihost_utils.process_allgather(params, tiled=True), jax.local_devices()[0])


def probe_scores(config, encoder_params, tokenizer: tokenizer_lib.Tokenizer) -> dict[str, float]:
  """{"probe/<task>/<probe>": score} on a fixed, seeded subset (config.eval) of each eval task.

  Deterministic for given params. Each probe's score is the task's headline metric on its first
  evaluation split (e.g. SST-2 dev accuracy, STS-B dev Spearman), or with eval.splits="all" the
  size-weighted mean over all of them (SST-2 dev + test); STS tasks add cosine_spearman.
  eval.max_examples=0 scores the whole splits.
  """
  spec = EncoderSpec.from_config(config.model)
  import jax  # Local, as in _on_one_device.

  params = _on_one_device(encoder_params)  # Probe batches are small: one device, as the params.
  emb = embedder_lib.JaxEmbedder(spec, params, tokenizer,
                                 embedder_lib.Options(max_length=min(PROBE_MAX_LENGTH, config.data.seq_len * 2)),
                                 devices=list(jax.tree.leaves(params)[0].devices()))
  out = {}
  for name in eval_tasks.parse_tasks(config.eval.tasks, flag="--config.eval.tasks"):
    task = eval_tasks.probe_view(_cached_task(name, str(config.eval.data_dir)), config.eval.splits)
    result = evaluate_task(emb, task, seed=config.eval.seed, max_examples=config.eval.max_examples)
    for probe, value in headline(task, result).items():
      out[f"probe/{name}/{probe}"] = float(value)
  return out


def probe_hook(info: Any) -> None:
  """A training-loop hook (run/hooks.py `StepInfo` -> None; `crossbert_jax.train.standard_hooks` adds it
  every eval.every_steps steps): the frozen probes on the step's encoder, in its metrics row. The
  encoder is gathered to every host and scored on process 0 under the step's phase's config."""
  def scores() -> dict[str, float]:
    from jax.experimental import multihost_utils  # Local, as in _on_one_device.

    encoder = multihost_utils.process_allgather(info.state.params["encoder"], tiled=True)
    return probe_scores(info.config, encoder, info.context.tokenizer) if info.context.primary else {}

  info.context.log_scores(scores)


# ----------------------------------------------------------------------------- models


def evaluate_model(emb: embedder_lib.Embedder, tasks: Sequence[eval_tasks.Task], *, seed: int = 0,
                   max_examples: int = 0, cache_dir: str | None = None, retrieval_dirs: Sequence[str] = (),
                   retrieval_max_docs: int = 0, log=print) -> dict[str, Any]:
  """Every task's probes and every retrieval folder's scores for one model, with timings."""
  start = time.perf_counter()
  out: dict[str, Any] = {"tasks": {}, "retrieval": {}}
  for task in tasks:
    t0 = time.perf_counter()
    out["tasks"][task.name] = evaluate_task(emb, task, seed=seed, max_examples=max_examples, cache_dir=cache_dir)
    log(f"  {task.name}: {time.perf_counter() - t0:.1f}s")
  for folder in retrieval_dirs:
    t0 = time.perf_counter()
    out["retrieval"][epath.Path(folder).name] = retrieval.evaluate_beir(emb, folder, cache_dir=cache_dir,
                                                                        max_docs=retrieval_max_docs)
    log(f"  {epath.Path(folder).name}: {time.perf_counter() - t0:.1f}s")
  out["seconds"] = time.perf_counter() - start
  out["embedded_sentences"] = emb.sentences_seen
  out["sentences_per_second"] = emb.sentences_seen / emb.seconds if emb.seconds > 0 else None
  return out


# ----------------------------------------------------------------------------- table


def flat_scores(result: dict[str, Any]) -> dict[str, float]:
  """{"<task>/<probe>/<split>/<metric>" or "retrieval/<name>/<metric>": value} of one model."""
  out = {f"{t}/{k}": v for t, r in result["tasks"].items() for k, v in r["scores"].items()}
  for name, r in result["retrieval"].items():
    out.update({f"{name}/{k}": v for k, v in r.items() if "@" in k})
  return out


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
  """One row per score, one column per model; notes on the protocol below."""
  labels = list(results)
  flats = {m: flat_scores(r) for m, r in results.items()}
  keys = list(dict.fromkeys(k for f in flats.values() for k in f))
  lines = ["| score | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
  for k in keys:
    cells = [f"{100 * flats[m][k]:.1f}" if k in flats[m] else "" for m in labels]
    lines.append(f"| {k} | " + " | ".join(cells) + " |")
  notes = {f"{t}: {r['note']}" for res in results.values() for t, r in res["tasks"].items() if r["note"]}
  lines += [""] + [f"- {n}" for n in sorted(notes)] if notes else []
  lines += ["", "Scores x100. Splits: cv = cross-validation on the only split; stsb test = STS Benchmark test."]
  return "\n".join(lines)

r"""Frozen evaluation: probe and retrieval scores of checkpoints or Hugging Face encoders, one table.

  python -m crossbert_jax.evaluate --workdir=runs/demo/crossbert --data_dir=../shared/data \
      --tasks=all --retrieval=beir/scifact --output=results.json
  python -m crossbert_jax.evaluate --workdir=runs/cb --workdir=runs/bert --data_dir=../shared/data --tasks=sst2,stsb
  python -m crossbert_jax.evaluate --hf=path/to/hf_model --data_dir=../shared/data --tasks=stsb

Writes JSON (--output) and a markdown table next to it (same name, .md), and prints the table.
During pretraining, `probe_scores` gives the same probes on a small fixed subset.
"""

import functools
import json
import os
import sys
import time
from typing import Any, Sequence

import numpy as np
from absl import app
from absl import flags
from absl import logging
from etils import epath

from crossbert_jax import embedder as embedder_lib
from crossbert_jax import eval_tasks, probes, retrieval
from crossbert_jax import tokenizer as tokenizer_lib
from crossbert_jax.encoder import EncoderSpec
from crossbert_jax.errors import UserError, exit_on_user_error, parse_flags_or_exit

PROBE_MAX_LENGTH = 128  # probe_scores: SST-2 / STS-B sentences fit easily.


# ----------------------------------------------------------------------------- one task

def evaluate_task(emb: embedder_lib.Embedder, task: eval_tasks.Task, *, seed: int = 0, max_examples: int = 0,
                  cache_dir: str | None = None, scored: tuple[str, ...] | None = None,
                  cosine_splits: tuple[str, ...] | None = None) -> dict[str, Any]:
  """{"scores", "chosen", "sizes", "note"} of the linear and KNN probes (+ cosine for STS) on `task`."""
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
  for name in cosine_splits:
    sp = splits[name]
    cache = {"cache_dir": cache_dir, "task": task.name, "split": name}
    pair_emb[name] = (embedder_lib.embed_cached(emb, sp.texts, part="a", **cache),
                      embedder_lib.embed_cached(emb, sp.pairs, part="b", **cache))
  scores, chosen = probes.score_task(task, features, seed=seed, pair_embeddings=pair_emb)
  return {"scores": scores, "chosen": chosen, "sizes": {s: len(splits[s]) for s in needed}, "note": task.note}


def headline(task: eval_tasks.Task, result: dict[str, Any]) -> dict[str, float]:
  """{probe: the task's first metric on its first scored split (or cv)}, plus cosine_spearman."""
  split = task.scored[0] if task.scored else "cv"
  out = {p: result["scores"][f"{p}/{split}/{task.metrics[0]}"] for p in probes.PROBES}
  for s in task.cosine_splits[:1]:
    out["cosine_spearman"] = result["scores"][f"cosine/{s}/spearman"]
  return out


# ----------------------------------------------------------------------------- during pretraining

@functools.lru_cache(maxsize=32)
def _cached_task(name: str, data_dir: str) -> eval_tasks.Task:
  return eval_tasks.load_task(name, data_dir)


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
  evaluation split (e.g. SST-2 dev accuracy, STS-B dev Spearman); STS tasks add cosine_spearman.
  """
  spec = EncoderSpec.from_config(config.model)
  emb = embedder_lib.JaxEmbedder(spec, _on_one_device(encoder_params), tokenizer,
                                 embedder_lib.Options(max_length=min(PROBE_MAX_LENGTH, config.data.seq_len * 2)))
  out = {}
  for name in eval_tasks.parse_tasks(config.eval.tasks):
    task = _cached_task(name, str(config.eval.data_dir))
    scored = task.scored[:1]
    result = evaluate_task(emb, task, seed=config.eval.seed, max_examples=config.eval.max_examples,
                           scored=scored, cosine_splits=task.cosine_splits[:1])
    task_view = eval_tasks.Task(task.name, task.kind, task.metrics, task.splits, task.fit, scored, task.note,
                                task.cosine_splits[:1])
    for probe, value in headline(task_view, result).items():
      out[f"probe/{name}/{probe}"] = float(value)
  return out


# ----------------------------------------------------------------------------- models

def resolve_tokenizer(path: str, workdir: str) -> str:
  """The tokenizer file: as given, else relative to an ancestor of the run's workdir."""
  if not path:
    raise UserError(f"--workdir {workdir}: its config names no data.tokenizer; pass --tokenizer=PATH")
  if epath.Path(path).exists() or os.path.isabs(path) or "://" in path:
    return path
  for parent in epath.Path(os.path.abspath(workdir)).parents:
    if (parent / path).exists():
      return str(parent / path)
  raise UserError(f"tokenizer {path} (from the run's config) is not found from here or above --workdir "
                  f"{workdir}; pass --tokenizer=PATH")


def jax_model(workdir: str, step: int | None, options: embedder_lib.Options, tokenizer_path: str = "",
              progress: bool = True) -> tuple[embedder_lib.JaxEmbedder, str]:
  """(embedder, label) for a training run's checkpoint."""
  from crossbert_jax import checkpoint  # Local: pulls in the training stack.

  config, params, step = checkpoint.load_run(workdir, step)
  tok = tokenizer_lib.Tokenizer.load(tokenizer_path or resolve_tokenizer(config.data.tokenizer, workdir))
  spec = EncoderSpec.from_config(config.model)
  identity = f"{os.path.abspath(workdir)}@{step}"
  label = f"{epath.Path(os.path.abspath(workdir)).name}@{step}"
  return embedder_lib.JaxEmbedder(spec, params["encoder"], tok, options, identity, progress), label


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
    out["retrieval"][epath.Path(folder).name] = retrieval.evaluate_beir(
        emb, folder, cache_dir=cache_dir, max_docs=retrieval_max_docs)
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


# ----------------------------------------------------------------------------- CLI

def _define_flags() -> None:
  flags.DEFINE_multi_string("workdir", [], "Training run workdir(s); several give side-by-side columns.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest) for every --workdir.")
  flags.DEFINE_multi_string("hf", [], "Local Hugging Face encoder folder(s) (transformers, torch CPU).")
  flags.DEFINE_string("tokenizer", "", "SentencePiece model for --workdir runs (default: the run's config).")
  flags.DEFINE_string("data_dir", "", "Root of the task data (the folder holding SOURCES.md).")
  flags.DEFINE_string("tasks", "all", f"Comma-separated tasks ({','.join(eval_tasks.ALL_TASKS)}) or 'all'; "
                      "may be empty with --retrieval or --generic_train.")
  flags.DEFINE_string("output", "", "JSON output path; the markdown table goes next to it as .md.")
  flags.DEFINE_string("layers", "-1", "Layer(s) to pool: -1 final, 0 embeddings; several are averaged.")
  flags.DEFINE_enum("pooling", "mean", list(embedder_lib.POOLINGS), "Pooling over tokens.")
  flags.DEFINE_enum("pair_mode", "joint", list(embedder_lib.PAIR_MODES),
                    "joint: one sequence [CLS] a [SEP] b [SEP]; senteval: [u, v, |u-v|, u*v].")
  flags.DEFINE_integer("max_length", 256, "Max tokens per sequence (pairs trim the longer side; SciFact "
                       "abstracts are the only texts often longer).")
  flags.DEFINE_integer("max_examples", 0, "Per split, a seeded subset of this many rows (0: all).")
  flags.DEFINE_integer("seed", 0, "Seed of subsets, validation splits and folds.")
  flags.DEFINE_multi_string("retrieval", [], "BEIR folder(s), absolute or under --data_dir (e.g. beir/scifact).")
  flags.DEFINE_integer("retrieval_max_docs", 0, "0: the whole corpus; N: the judged documents plus the first N "
                       "others (smaller and easier: smoke tests only).")
  flags.DEFINE_string("cache_dir", "", "Embedding cache (default: <workdir>/eval_cache; --hf: none).")
  flags.DEFINE_bool("cache", True, "Cache embeddings on disk (--nocache: off).")
  flags.DEFINE_bool("progress", True, "Progress bars on the terminal.")
  flags.DEFINE_string("generic_train", "", "Your own task: a .tsv (with header) or .jsonl file to fit on.")
  flags.DEFINE_string("generic_eval", "", "Its evaluation file (empty: 5-fold cross-validation on train).")
  flags.DEFINE_string("generic_text", "text", "Column of the (first) text.")
  flags.DEFINE_string("generic_pair", "", "Column of the second text (pair_classification only).")
  flags.DEFINE_string("generic_label", "label", "Column of the label.")
  flags.DEFINE_string("generic_type", eval_tasks.CLASSIFICATION, f"One of {', '.join(eval_tasks.KINDS)}.")
  flags.DEFINE_string("generic_name", "generic", "Name of your task in the output.")


def _load_tasks(f) -> list[eval_tasks.Task]:
  names = eval_tasks.parse_tasks(f.tasks)
  if names and not f.data_dir:
    raise UserError("--data_dir is empty: point it at the shared data root (e.g. ../shared/data)")
  tasks = [eval_tasks.load_task(n, f.data_dir) for n in names]
  if f.generic_train:
    tasks.append(eval_tasks.read_generic(eval_tasks.GenericSpec(
        f.generic_train, f.generic_eval, f.generic_text, f.generic_pair, f.generic_label, f.generic_type,
        f.generic_name)))
  return tasks


def _retrieval_dirs(f) -> list[str]:
  out = []
  for r in f.retrieval:
    p = r if os.path.isabs(r) or "://" in r else os.path.join(f.data_dir, r)
    if not epath.Path(p).exists():
      raise UserError(f"--retrieval={r}: {p} does not exist; give a BEIR folder, absolute or under --data_dir")
    out.append(p)
  return out


def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {' '.join(argv[1:])}; every option is a --flag")
  f = flags.FLAGS
  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore step at INFO.
  if not f.workdir and not f.hf:
    raise UserError("nothing to evaluate: pass --workdir=RUN (a training run) and/or --hf=DIR")
  options = embedder_lib.Options(embedder_lib.parse_layers(f.layers), f.pooling, f.max_length, f.pair_mode)
  tasks, retrieval_dirs = _load_tasks(f), _retrieval_dirs(f)
  if not tasks and not retrieval_dirs:
    raise UserError("--tasks is empty and no --retrieval or --generic_train: name something to evaluate")
  results: dict[str, dict[str, Any]] = {}
  sources = [("workdir", w) for w in f.workdir] + [("hf", h) for h in f.hf]
  for kind, source in sources:
    if kind == "workdir":
      emb, label = jax_model(source, f.step, options, f.tokenizer, f.progress)
      cache_dir = (f.cache_dir or os.path.join(source, "eval_cache")) if f.cache else None
    else:
      emb = embedder_lib.HFEmbedder(source, options, f.progress)
      label, cache_dir = f"hf:{epath.Path(source).name}", (f.cache_dir or None) if f.cache else None
    label = label if label not in results else f"{label} ({source})"
    print(f"{label}:", flush=True)
    results[label] = evaluate_model(emb, tasks, seed=f.seed, max_examples=f.max_examples, cache_dir=cache_dir,
                                    retrieval_dirs=retrieval_dirs, retrieval_max_docs=f.retrieval_max_docs)
    results[label]["source"] = {"kind": kind, "path": os.path.abspath(source)}
  table = markdown_table(results)
  print(table, flush=True)
  if f.output:
    settings = {"tasks": [t.name for t in tasks], "retrieval": f.retrieval, "layers": list(options.layers),
                "pooling": f.pooling, "pair_mode": f.pair_mode, "max_length": f.max_length,
                "max_examples": f.max_examples, "seed": f.seed, "step": f.step,
                "retrieval_max_docs": f.retrieval_max_docs}
    out = epath.Path(f.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": settings, "models": results}, indent=1, default=_json_default))
    out.with_suffix(".md").write_text(table + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}", flush=True)


def _json_default(value):
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"not JSON serialisable: {type(value)}")


def cli() -> None:
  """Console entry point."""
  _define_flags()
  app.run(exit_on_user_error(main), flags_parser=parse_flags_or_exit)


if __name__ == "__main__":
  cli()
  sys.exit(0)

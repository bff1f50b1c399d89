r"""Frozen evaluation: probe and retrieval scores of checkpoints or Hugging Face encoders, one table.

  python -m crossbert_jax.evaluate --workdir=runs/demo/crossbert --data_dir=../shared/data \
      --tasks=all --retrieval=beir/scifact --output=results.json
  python -m crossbert_jax.evaluate --workdir=runs/demo/crossbert --word_order  # Built-in data, vs its init.
  python -m crossbert_jax.evaluate --benchmark=glue --workdir=runs/demo/crossbert --data_dir=../shared/data

Library: crossbert_jax.evaluation.runner. Manual: docs/evaluation.md.
"""

import json
import os
from typing import Any, Sequence

import numpy as np
from absl import app
from absl import flags
from absl import logging
from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, exit_on_user_error, no_positional, parse_flags_or_exit
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import generic
from crossbert_jax.evaluation import glue
from crossbert_jax.evaluation import glue_data
from crossbert_jax.evaluation import glue_merge
from crossbert_jax.evaluation import glue_run
from crossbert_jax.evaluation import glue_table
from crossbert_jax.evaluation import pooler as pooler_lib
from crossbert_jax.evaluation import tasks as eval_tasks
from crossbert_jax.evaluation.columns import (absolute, check_distinct, column_label, run_cache_dir, with_poolers,
                                              writable)
from crossbert_jax.evaluation.runner import evaluate_model, flat_scores, markdown_table
from crossbert_jax.hf.files import EVAL_RESULTS
from crossbert_jax.evaluation import run_models
from crossbert_jax.run import load


def _define_flags() -> None:
  flags.DEFINE_multi_string("workdir", [], "Training run workdir(s); several give side-by-side columns.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest) for every --workdir.")
  flags.DEFINE_multi_string("hf", [], "Local Hugging Face encoder folder(s) (transformers, torch CPU).")
  flags.DEFINE_string(
      "tokenizer", "", "SentencePiece .model or HF tokenizer.json / folder for --workdir runs "
      "(default: the run's config).")
  flags.DEFINE_string("data_dir", "", "Root of the task data (the folder holding SOURCES.md).")
  flags.DEFINE_string(
      "tasks", None, f"Comma-separated tasks ({','.join(eval_tasks.ALL_TASKS)}) or 'all' "
      "(default: all, or none when --generic_train, --task_file or --retrieval is given).")
  flags.DEFINE_string("output", "", "JSON output path; the markdown table goes next to it as .md.")
  flags.DEFINE_bool("force", False, "Replace an existing --output (and its .md) instead of refusing.")
  flags.DEFINE_string("layers", "-1", "Layer(s) to pool: -1 final, 0 embeddings; several are averaged.")
  flags.DEFINE_enum("pooling", "mean", list(embedder_lib.POOLINGS), "Pooling over tokens.")
  flags.DEFINE_enum("pair_mode", "joint", list(embedder_lib.PAIR_MODES),
                    "joint: one sequence [CLS] a [SEP] b [SEP]; senteval: [u, v, |u-v|, u*v].")
  flags.DEFINE_integer(
      "max_length", 256, "Max tokens per sequence (pairs trim the longer side; SciFact "
      "abstracts are the only texts often longer).")
  flags.DEFINE_integer("max_examples", 0, "Per split, a seeded subset of this many rows (0: all).")
  flags.DEFINE_integer("seed", 0, "Seed of subsets, validation splits and folds.")
  flags.DEFINE_multi_string("retrieval", [], "BEIR folder(s), absolute or under --data_dir (e.g. beir/scifact).")
  flags.DEFINE_integer(
      "retrieval_max_docs", 0, "0: the whole corpus; N: the judged documents plus the first N "
      "others (smaller and easier: smoke tests only).")
  flags.DEFINE_string(
      "cache_dir", "", "Embedding cache (default: <workdir>/eval_cache, or "
      "~/.cache/crossbert_jax/eval_cache/... when the run is read-only; --hf: none).")
  flags.DEFINE_bool("cache", True, "Cache embeddings on disk (--nocache: off).")
  flags.DEFINE_bool("progress", True, "Progress bars on the terminal.")
  flags.DEFINE_string("generic_train", "", "Your own task: a .tsv (with header) or .jsonl file to fit on.")
  flags.DEFINE_string("generic_eval", "", "Its evaluation file (empty: 5-fold cross-validation on train).")
  flags.DEFINE_string("generic_text", "text", "Column of the (first) text.")
  flags.DEFINE_string("generic_pair", "", "Column of the second text: a pair task (zero-shot cosine too).")
  flags.DEFINE_string("generic_label", "label", "Column of the label.")
  flags.DEFINE_string("generic_type", eval_tasks.CLASSIFICATION, f"One of {', '.join(generic.TYPES)}.")
  flags.DEFINE_string("generic_name", "generic", "Name of your task in the output.")
  flags.DEFINE_multi_string("task_file", [], "JSON (or YAML) file listing your own tasks (docs/evaluation.md).")
  flags.DEFINE_bool(
      "word_order", False, "Only the built-in word-order probe (no --data_dir): each --workdir "
      "against its random init (make demo's last step).")
  flags.DEFINE_string(
      "benchmark", "", "glue: frozen GLUE by name (the Hub, the datasets cache, a copy in the Hub's "
      "layout or the shared files in --data_dir), resumable per task, table in --output_dir.")
  flags.DEFINE_integer("probe_seeds", 3, "--benchmark: probe seeds (each its own validation slice): mean and spread.")
  flags.DEFINE_string(
      "output_dir", "", "--benchmark: the table (new columns added to one there) and each task's saved result "
      "(resume); default <the first --workdir>/glue, or glue_results with only --hf.")
  flags.DEFINE_bool("strict", False, "--benchmark: refuse to start when a task has no data (default: skip it).")
  flags.DEFINE_multi_string(
      "pooler", [], "Pooler folder(s) from crossbert_jax.pooler: adds a '+pooler' column "
      "next to the model it was trained on.")


def _load_tasks(f) -> list[eval_tasks.Task]:
  own = bool(f.generic_train or f.task_file)
  names = eval_tasks.parse_tasks(f.tasks if f.tasks is not None else ("" if own or f.retrieval else "all"))
  if names and not f.data_dir:
    raise UserError("--data_dir is empty: point it at the shared data root (e.g. ../shared/data)")
  tasks = [eval_tasks.load_task(n, f.data_dir) for n in names] + _own_tasks(f)
  seen = set()
  for t in tasks:
    if t.name in seen:
      raise UserError(f"task name {t.name!r} is used twice; rename your task (--generic_name or the task file)")
    seen.add(t.name)
  return tasks


def _own_tasks(f) -> list[eval_tasks.Task]:
  """--generic_* and --task_file tasks."""
  specs = [
      generic.GenericSpec(f.generic_train, f.generic_eval, f.generic_text, f.generic_pair, f.generic_label,
                          f.generic_type, f.generic_name)] if f.generic_train else []
  for path in f.task_file:
    specs += generic.read_task_file(path)
  return [generic.read_generic(s) for s in specs]


def _retrieval_dirs(f) -> list[str]:
  out = []
  for r in f.retrieval:
    p = r if os.path.isabs(r) or "://" in r else str(epath.Path(f.data_dir) / r)
    if not epath.Path(p).exists():
      raise UserError(f"--retrieval={r}: {p} does not exist; give a BEIR folder, absolute or under --data_dir")
    out.append(p)
  return out


def _word_order(f) -> None:
  """--word_order: prints `run_models.word_order_report` for each --workdir; refuses the flags it would ignore."""
  ignored = [
      n for n in ("hf", "tasks", "retrieval", "generic_train", "task_file", "pooler", "output", "benchmark", "layers",
                  "pooling", "pair_mode", "max_length", "max_examples") if f[n].present]
  if ignored:
    raise UserError("--word_order scores each --workdir against its random init on built-in data only: "
                    f"drop --{ignored[0]}, or run it separately")
  for workdir in f.workdir:
    loaded = load.load_for_evaluation(workdir, f.step, f.tokenizer)
    init_encoder = load.init_params(loaded[0])["encoder"]
    print(run_models.word_order_report(workdir, loaded, init_encoder, f.seed), flush=True)


def _check_output(f) -> epath.Path | None:
  """--output, refused before any slow work: a folder, an unwritable path, the .md table's own name,
  or (without --force) results an earlier evaluation wrote."""
  if not f.output:
    return None
  if epath.Path(f.output).suffix == ".md":
    raise UserError(f"--output {f.output} ends in .md, the name of the table written next to the JSON: "
                    "give a .json path")
  return outputs.check_output_file(f.output, "--output", force=f.force, companions=(".md",))


def _models(f, options: embedder_lib.Options) -> list[tuple[str, embedder_lib.Embedder, Any, str, str]]:
  """(label, embedder, cache dir, kind, source) per --workdir / --hf and '+pooler' column, all loaded first."""
  poolers, used = [pooler_lib.load_pooler(p) for p in f.pooler], set()
  models = []  # (label, embedder, cache dir, kind, source): every model is loaded before any is scored.
  sources = [("workdir", w) for w in f.workdir] + [("hf", h) for h in f.hf]
  for kind, source in sources:
    if kind == "workdir":
      emb, label = run_models.jax_model(source, load.load_for_evaluation(source, f.step, f.tokenizer), options,
                                        f.progress, pooling_given=f["pooling"].present)
      cache_dir = (f.cache_dir or run_cache_dir(source)) if f.cache else None
    else:
      emb = embedder_lib.HFEmbedder(source, options, f.progress)
      label, cache_dir = f"hf:{epath.Path(source).name}", (f.cache_dir or None) if f.cache else None
    label = column_label(label, source, [m[0] for m in models])
    models += [(l, m, cache_dir, kind, source) for l, m in with_poolers(emb, label, poolers, used)]
  unused = [i for i in range(len(poolers)) if i not in used]
  if unused:
    raise UserError(f"--pooler={f.pooler[unused[0]]} was trained on {poolers[unused[0]].meta.get('identity')}, "
                    "which is not among the models scored here; add that --workdir (and --step) or --hf")
  return models


def _glue_plan(f) -> tuple[dict[str, str], dict[str, str], str]:
  """--benchmark=glue's checks before any slow work: the flags, the tasks, where each one's data is, and the
  output folder (returned)."""
  if f.benchmark.lower() != "glue":
    raise UserError(f"--benchmark={f.benchmark!r}: evaluate runs only glue (frozen GLUE); MTEB benchmarks run "
                    "with python -m crossbert_jax.mteb_eval --benchmark=...")
  ignored = [n for n in ("output", "retrieval", "generic_train", "task_file") if f[n].present]
  if ignored:
    raise UserError(f"--benchmark=glue writes its table into --output_dir: drop --{ignored[0]}, or run it separately")
  if f.probe_seeds < 1:
    raise UserError(f"--probe_seeds={f.probe_seeds}: use at least 1")
  sources, skipped = glue_data.checked_plan(glue.parse_tasks(f.tasks), f.data_dir, f.strict)
  inputs = [("--workdir", w) for w in f.workdir] + [("--hf", h) for h in f.hf] + \
           ([("--data_dir", f.data_dir)] if f.data_dir else [])
  output_dir = _glue_output_dir(f)
  if f.output_dir or not f.workdir:  # The default in the run sits inside an input on purpose.
    outputs.check_added_to(output_dir, "--output_dir", inputs, writes_inside=True)
  return sources, skipped, output_dir


def _glue_output_dir(f) -> str:
  """--output_dir, or its default: <the first --workdir>/glue (beside the run's own table; refused when the run
  cannot be written), or ./glue_results when only --hf models are scored."""
  if f.output_dir:
    return f.output_dir
  if not f.workdir:
    return "glue_results"
  out = str(epath.Path(f.workdir[0]) / "glue")
  if "://" not in out:
    folder = epath.Path(out)
    while not folder.exists() and folder != folder.parent:
      folder = folder.parent
    if not os.access(folder, os.W_OK):
      raise UserError(f"--output_dir defaults to {out}, in the run, which cannot be written: give --output_dir")
  return out


def _glue(f, options: embedder_lib.Options) -> None:
  """--benchmark=glue: every model on the GLUE tasks with data, resumable per task; the table in --output_dir
  and, per --workdir, in the run (glue_table.*, and eval_results.json for the export's model card)."""
  sources, skipped, output_dir = _glue_plan(f)
  tasks = {n: glue_data.load(n, s, f.data_dir) for n, s in sources.items()}  # Bad files: refused before models.
  for task in tasks.values():  # A subset left with one class: refused before models too.
    glue_run.subset(task, f.max_examples, f.seed)
  labels = {n: glue_data.source_label(s, f.data_dir) for n, s in sources.items()}
  settings = {
      "benchmark": "glue", "hub_revision": glue.HUB_REVISION, "sources": labels, "layers": list(options.layers),
      "pooling": options.pooling, "pair_mode": options.pair_mode, "max_length": options.max_length,
      "max_examples": f.max_examples, "seed": f.seed, "probe_seeds": f.probe_seeds}
  digest, out_dir = glue_run.settings_digest(settings), epath.Path(output_dir)
  earlier = glue_merge.read(out_dir, settings)  # Another settings' table: refused before models load.
  models = _models(f, options)
  columns = glue_merge.labels(earlier, [(l, m.identity, s) for l, m, _, _, s in models])
  models = [(c, *m[1:]) for c, m in zip(columns, models)]
  results, files = {}, {}
  with outputs.removed_unless_written(output_dir):
    for label, model, cache_dir, _, _ in models:
      key = glue_run.column_key(label, model.identity)
      folder = out_dir / "tasks" / key / digest
      print(f"{label}: {folder}", flush=True)
      results[label] = glue_run.run_model(model, sources, folder, load=lambda n, _: tasks[n], seeds=f.probe_seeds,
                                          max_examples=f.max_examples, data_seed=f.seed, cache_dir=cache_dir,
                                          force=f.force)
      files[label] = {n: f"{key}/{digest}/{n}.json" for n in results[label]}
  identities = {label: model.identity for label, model, _, _, _ in models}
  results, table_models, settings = glue_merge.merged(out_dir, earlier, results, files, identities, settings,
                                                      f.probe_seeds)
  labels = settings["sources"]
  table = glue_table.summary(results, skipped, labels, settings, table_models)
  js, md = glue_table.write(out_dir, table)
  print(glue_table.markdown(table), flush=True)
  print(f"wrote {js} and {md}", flush=True)
  for label, model, _, kind, source in models:
    if kind == "workdir" and isinstance(model, embedder_lib.JaxEmbedder):
      try:
        glue_table.write(epath.Path(source), glue_table.column_table(table, label))
      except OSError as e:
        print(f"warning: could not write the GLUE table into {source} ({e.strerror or e})", flush=True)
      _record_in_workdir(source, model.identity, label, settings, glue_table.card_scores(table, label), merge=True)


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  no_positional(argv, "; every option is a --flag", joined=True)
  f = flags.FLAGS
  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore step at INFO.
  if not f.workdir and not f.hf:
    raise UserError("nothing to evaluate: pass --workdir=RUN (a training run) and/or --hf=DIR")
  check_distinct([("workdir", w) for w in f.workdir] + [("hf", h) for h in f.hf])
  if f.word_order:
    _word_order(f)
    return
  options = embedder_lib.Options(embedder_lib.parse_layers(f.layers), f.pooling, f.max_length, f.pair_mode)
  if f.benchmark:
    _glue(f, options)
    return
  out = _check_output(f)
  tasks, retrieval_dirs = _load_tasks(f), _retrieval_dirs(f)
  if f.cache and f.cache_dir and (error := writable(epath.Path(f.cache_dir))) is not None:
    raise UserError(f"--cache_dir {f.cache_dir} is not writable ({error.strerror or error}): choose another "
                    "folder, or leave it empty for the default")
  if not tasks and not retrieval_dirs:
    raise UserError("--tasks is empty and no --retrieval, --generic_train or --task_file: name something to evaluate")
  results: dict[str, dict[str, Any]] = {}
  models = _models(f, options)
  for label, model, cache_dir, kind, source in models:
    print(f"{label}:", flush=True)
    results[label] = evaluate_model(model, tasks, seed=f.seed, max_examples=f.max_examples, cache_dir=cache_dir,
                                    retrieval_dirs=retrieval_dirs, retrieval_max_docs=f.retrieval_max_docs)
    results[label]["source"] = {"kind": kind, "path": absolute(source)}
  table = markdown_table(results)
  print(table, flush=True)
  if out is not None:
    settings = {
        "tasks": [t.name for t in tasks], "task_files": f.task_file, "poolers": f.pooler, "retrieval": f.retrieval,
        "layers": list(options.layers), "pooling": f.pooling, "pair_mode": f.pair_mode, "max_length": f.max_length,
        "max_examples": f.max_examples, "seed": f.seed, "step": f.step, "retrieval_max_docs": f.retrieval_max_docs}
    try:
      out.parent.mkdir(parents=True, exist_ok=True)
      out.write_text(json.dumps({"settings": settings, "models": results}, indent=1, default=_json_default))
      out.with_suffix(".md").write_text(table + "\n")
    except OSError as e:
      raise UserError(f"--output {out}: could not write ({e.strerror or e}); the table is printed above: "
                      "free space or choose a writable --output") from None
    print(f"wrote {out} and {out.with_suffix('.md')}", flush=True)
    for label, model, _, kind, source in models:
      if kind == "workdir" and isinstance(model, embedder_lib.JaxEmbedder):
        _record_in_workdir(source, model.identity, label, settings, results[label])


def _record_in_workdir(workdir: str, identity: str, label: str, settings: dict[str, Any], result: dict[str, Any],
                       merge: bool = False) -> None:
  """The run's own scores as <workdir>/eval_results.json, which export's model card reports.

  result: evaluate_model's result, or (merge) flat scores added to a record of the same step (--benchmark).
  """
  path = epath.Path(workdir) / EVAL_RESULTS
  step = int(identity.rsplit("@", 1)[1])
  scores = result if merge else {k: round(float(v), 6) for k, v in flat_scores(result).items()}
  record = {"model": label, "step": step, "settings": settings, "scores": scores}
  try:
    old = json.loads(path.read_text()) if merge and path.exists() else None
    if old and old.get("step") == step and old.get("settings", {}).get("benchmark") != "glue":  # Keep --tasks'.
      old["scores"] = {**{k: v for k, v in old["scores"].items() if not k.startswith("glue/")}, **scores}
      old.setdefault("settings", {})["glue"] = settings
      record = old
    path.write_text(json.dumps(record, indent=1))
  except (OSError, ValueError) as e:
    print(
        f"warning: could not record the scores in {path} ({getattr(e, 'strerror', None) or e}); the model card "
        "will not show them", flush=True)


def _json_default(value):
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"not JSON serialisable: {type(value)}")


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

r"""MTEB on our checkpoints, scored by mteb's own evaluators, with mteb's results layout and resume.

  python -m crossbert_jax.mteb_eval --benchmark="MTEB(eng, v2)" --workdir=runs/demo/crossbert \
      --workdir=runs/demo/bert --data_dir=data/mteb --output_dir=runs/demo/mteb

Library: crossbert_jax.evaluation.mteb_run. Manual: docs/evaluation.md.
"""

import hashlib
from typing import Sequence

from absl import app
from absl import flags
from absl import logging
from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, exit_on_user_error, no_positional, parse_flags_or_exit
from crossbert_jax.evaluation import columns
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import mteb_run
from crossbert_jax.evaluation import mteb_table
from crossbert_jax.evaluation import pooler as pooler_lib
from crossbert_jax.evaluation.mteb import MtebEncoder

TABLE_FILE = "mteb_table.json"


def _define_flags() -> None:
  flags.DEFINE_multi_string("workdir", [], "Training run workdir(s); several give side-by-side columns.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest) for every --workdir.")
  flags.DEFINE_multi_string("hf", [], "Local Hugging Face encoder folder(s).")
  flags.DEFINE_multi_string(
      "pooler", [], "Pooler folder(s) from crossbert_jax.pooler: a '+pooler' column for the "
      "--workdir / --hf it was trained on (the paper's frozen encoder + pooler).")
  flags.DEFINE_string(
      "tokenizer", "", "SentencePiece .model or HF tokenizer.json / folder for --workdir "
      "(default: the run's config).")
  flags.DEFINE_string("benchmark", "", "An mteb benchmark name, e.g. 'MTEB(eng, v2)'.")
  flags.DEFINE_string("tasks", "", "Comma-separated MTEB task names (narrows --benchmark when both are given).")
  flags.DEFINE_string("layers", "-1", "Layer(s) to pool (as crossbert_jax.evaluate).")
  flags.DEFINE_integer("max_length", 512, "Max tokens per text.")
  flags.DEFINE_bool("normalize", True, "Unit-length embeddings.")
  flags.DEFINE_string("output_dir", "mteb_results", "mteb's results cache folder (results/<model>/<revision>/).")
  flags.DEFINE_string("data_dir", "", "Local task data: DIR/<TaskName>/ per task (tools/mteb_local_data.py).")
  flags.DEFINE_bool("strict", False, "Refuse to start when a task has neither local data nor a reachable Hub.")
  flags.DEFINE_bool("force", False, "Redo tasks whose results are already in --output_dir.")


def _sources(f, options) -> list[tuple[str, MtebEncoder]]:
  """(column label, encoder) per --workdir / --hf, then one per --pooler on the model it was trained on.

  mteb keys a result by model name and revision: the revision carries a digest of the model's identity (its
  absolute path, and step), so runs whose folders have the same name never share a result.
  """
  from crossbert_jax.evaluation import run_models  # Local: pulls in the checkpoint stack.
  from crossbert_jax.run import load

  poolers, used, out = [pooler_lib.load_pooler(p) for p in f.pooler], set(), []
  for kind, source in [("workdir", w) for w in f.workdir] + [("hf", h) for h in f.hf]:
    if kind == "workdir":
      emb, label = run_models.jax_model(source, load.load_for_evaluation(source, f.step, f.tokenizer), options,
                                        progress=False)
      name, revision = label.split("@")[0], f"step{label.split('@')[1]}"
    else:
      emb = embedder_lib.HFEmbedder(source, options, progress=False)
      name, revision = epath.Path(source.rstrip("/")).name, "hf"
      label = f"hf:{name}"
    label = columns.column_label(label, source, [col for col, _ in out])
    revision += f"-{hashlib.sha256(emb.identity.encode()).hexdigest()[:8]}"
    for col, model in columns.with_poolers(emb, label, poolers, used):
      suffix = col[len(label):].lstrip("+")
      rev = revision + (f"-{suffix}-{model.pooler.digest[:8]}" if suffix else "")
      out.append((col, MtebEncoder(model, name=f"crossbert_jax/{name}", normalize=f.normalize, revision=rev)))
  unused = [i for i in range(len(poolers)) if i not in used]
  if unused:
    raise UserError(f"--pooler={f.pooler[unused[0]]} was trained on {poolers[unused[0]].meta.get('identity')}, "
                    "which is not among the models here; add that --workdir (and --step) or --hf")
  return out


def _check_inputs(f) -> None:
  """Before any slow work: the models, --data_dir, and --output_dir, which mteb adds its results to (and
  resumes from), deleting nothing: it may not be, contain or sit inside an input, nor hold or sit inside a
  training run (core/outputs.py, as export and pooler)."""
  if not f.workdir and not f.hf:
    raise UserError("nothing to evaluate: pass --workdir=RUN and/or --hf=DIR")
  columns.check_distinct([("workdir", w) for w in f.workdir] + [("hf", h) for h in f.hf])
  if f.data_dir and not epath.Path(f.data_dir).is_dir():
    raise UserError(f"--data_dir={f.data_dir} is not a folder: make one with tools/mteb_local_data.py")
  inputs = [("--workdir", w) for w in f.workdir] + [("--hf", h) for h in f.hf] + \
           [("--pooler", p) for p in f.pooler] + [("--data_dir", f.data_dir)]
  outputs.check_added_to(f.output_dir, "--output_dir", inputs, writes_inside=True)


def _task_plan(f) -> tuple[list, mteb_run.TaskPlan]:
  """The tasks, and which can run: a bad name or a bad local file is found before the checkpoint restore."""
  tasks = mteb_run.select_tasks(f.benchmark, [t.strip() for t in f.tasks.split(",") if t.strip()])
  task_plan = mteb_run.plan(tasks, f.data_dir)
  if task_plan.skipped:
    if f.strict:
      raise UserError(f"--strict: {len(task_plan.skipped)} task(s) have no local data in --data_dir and the "
                      f"Hub is unreachable: {', '.join(task_plan.skipped)}; add DIR/<TaskName>/ or drop --strict")
    print(mteb_run.summary_line(task_plan), flush=True)
  if not task_plan.tasks:
    raise UserError("no task can run: none has local data in --data_dir and the Hub is unreachable")
  if note := mteb_run.superseded_note(task_plan.tasks, f.benchmark):
    print(note, flush=True)
  return tasks, task_plan


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  no_positional(argv, "; every option is a --flag", joined=True)
  f = flags.FLAGS
  logging.set_verbosity(logging.WARNING)  # Orbax restore chatter (dozens of INFO lines before any error).
  _check_inputs(f)
  tasks, task_plan = _task_plan(f)
  import mteb  # Local: heavy.

  options = embedder_lib.Options(embedder_lib.parse_layers(f.layers), max_length=f.max_length)
  sources = _sources(f, options)
  scores, failed = {}, {}
  with outputs.removed_unless_written(f.output_dir):  # E.g. --layers out of range, found at the first batch.
    cache = mteb.ResultCache(f.output_dir)
    for label, encoder in sources:
      print(f"{label}: results/{encoder.name.replace('/', '__')}/{encoder.revision}/", flush=True)
      scores[label], more = mteb_run.run_tasks(encoder, task_plan, cache, force=f.force)
      failed.update(more)
  types = mteb_run.task_types(tasks)
  table = mteb_table.summary(scores, types)
  mteb_table.write(epath.Path(f.output_dir) / TABLE_FILE, table, types)
  print(mteb_table.markdown(table, types), flush=True)
  if failed:
    print(
        f"{len(failed)} task(s) failed to load from the Hub cache: {', '.join(failed)} (see docs/evaluation.md, "
        "offline recipe)", flush=True)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

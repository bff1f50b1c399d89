r"""MTEB on our checkpoints: an encoder wrapper for the `mteb` package, and a CLI.

  python -m crossbert_jax.mteb_eval --workdir=runs/demo/crossbert --tasks=STSBenchmark,SciFact \
      --data_dir=../shared/data --output_dir=runs/demo/mteb

With --data_dir, STSBenchmark and SciFact are mteb's own task objects with their data read from
the shared files: mteb's evaluators, no network. Without it, MTEB downloads each task's data
from the Hugging Face Hub (needs the internet).
"""

import os
import sys
from typing import Sequence

from absl import app
from absl import flags
from absl import logging

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, exit_on_user_error, parse_flags_or_exit
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation.mteb import MtebEncoder, local_tasks

def _define_flags() -> None:
  flags.DEFINE_string("workdir", "", "Training run workdir.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
  flags.DEFINE_string("hf", "", "A local Hugging Face encoder folder instead of --workdir.")
  flags.DEFINE_string("tokenizer", "", "SentencePiece model (default: the run's config).")
  flags.DEFINE_string("tasks", "", "Comma-separated MTEB task names, e.g. STSBenchmark,SciFact.")
  flags.DEFINE_string("layers", "-1", "Layer(s) to pool (as crossbert_jax.evaluate).")
  flags.DEFINE_integer("max_length", 512, "Max tokens per text.")
  flags.DEFINE_bool("normalize", True, "Unit-length embeddings.")
  flags.DEFINE_string("output_dir", "mteb_results", "Where mteb writes its results.")
  flags.DEFINE_string("data_dir", "", "Shared data root: run the local copies of STSBenchmark / SciFact offline.")


def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {' '.join(argv[1:])}; every option is a --flag")
  f = flags.FLAGS
  names = [t.strip() for t in f.tasks.split(",") if t.strip()]
  if not names:
    raise UserError("--tasks is empty: name MTEB tasks, e.g. --tasks=STSBenchmark,SciFact")
  if bool(f.workdir) == bool(f.hf):
    raise UserError("pass exactly one of --workdir=RUN or --hf=DIR")
  logging.set_verbosity(logging.WARNING)  # Orbax restore chatter (dozens of INFO lines before any error).
  outputs.check_folder_path(f.output_dir, "--output_dir")  # mteb adds its results there, deletes nothing.
  import mteb  # Local: heavy.

  # The tasks first: a bad name is found before the checkpoint restore, not after it.
  if f.data_dir:
    tasks = local_tasks(f.data_dir, tuple(names))
  else:
    try:
      tasks = mteb.get_tasks(tasks=names)
    except (KeyError, ValueError) as e:
      raise UserError(f"--tasks: {str(e).splitlines()[0]}; see mteb.get_tasks() for names") from None
  options = embedder_lib.Options(embedder_lib.parse_layers(f.layers), max_length=f.max_length)
  if f.workdir:
    from crossbert_jax import evaluate  # Local: pulls in the checkpoint stack.

    emb, label = evaluate.jax_model(f.workdir, f.step, options, f.tokenizer)
  else:
    emb, label = embedder_lib.HFEmbedder(f.hf, options, progress=True), os.path.basename(f.hf.rstrip("/"))
  encoder = MtebEncoder(emb, name=f"crossbert_jax/{label}", normalize=f.normalize)
  try:
    result = mteb.evaluate(encoder, tasks, cache=mteb.ResultCache(f.output_dir))
  except (OSError, ConnectionError) as e:
    detail = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
    if f.data_dir:  # The data is local: the failure is a file, not the network.
      raise UserError(f"MTEB failed on a file ({detail}); check --output_dir={f.output_dir} and "
                      f"--data_dir={f.data_dir}") from None
    raise UserError(f"MTEB could not fetch its task data ({detail}); it needs the internet "
                    "(Hugging Face Hub) - offline, pass --data_dir for the local STSBenchmark/SciFact") from None
  for task_result in result.task_results:
    print(task_result.task_name, task_result.get_score(), flush=True)


def cli() -> None:
  """Console entry point."""
  _define_flags()
  app.run(exit_on_user_error(main), flags_parser=parse_flags_or_exit)


if __name__ == "__main__":
  cli()
  sys.exit(0)


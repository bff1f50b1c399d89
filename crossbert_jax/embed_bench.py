r"""Time the embedder against sentence-transformers' encode of the same exported model.

  python -m crossbert_jax.embed_bench --workdir=runs/demo/crossbert --hf=runs/demo/hf --out=embed_bench.json [--force]

Library: crossbert_jax.evaluation.embed_bench. Manual: docs/benchmarks.md.
"""

import json
from typing import Sequence

from absl import app
from absl import flags
from absl import logging
from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, exit_on_user_error, no_positional, parse_flags_or_exit
from crossbert_jax.evaluation import embed_bench
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.model.encoder import EncoderSpec


def _define_flags() -> None:
  flags.DEFINE_string("workdir", "", "Training run whose embedder is timed.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
  flags.DEFINE_string("hf", "", "The same run exported (crossbert_jax.export): sentence-transformers loads it.")
  flags.DEFINE_integer("texts", 20_000, "Texts to embed (10% long documents, the rest sentences).")
  flags.DEFINE_integer("max_length", 512, "Max tokens per text (both sides).")
  flags.DEFINE_integer("st_batch_size", 32, "sentence-transformers' encode batch size.")
  flags.DEFINE_string("out", "", "JSON output path (default: print only); an existing file only with --force.")
  flags.DEFINE_bool("force", False, "Replace an existing --out file.")


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  no_positional(argv, "; every option is a --flag", joined=True)
  f = flags.FLAGS
  if not f.workdir or not f.hf:
    raise UserError("pass --workdir=RUN and --hf=DIR (that run exported by crossbert_jax.export)")
  for flag, value in (("--texts", f.texts), ("--st_batch_size", f.st_batch_size)):
    if value < 1:
      raise UserError(f"{flag}={value}: give at least 1")
  options = embedder_lib.Options(max_length=f.max_length)
  if f.out:
    outputs.check_output_file(f.out, "--out", force=f.force)  # Before minutes of embedding, not after.
  logging.set_verbosity(logging.WARNING)
  from crossbert_jax.run import load  # Local: pulls in the checkpoint stack.

  config, params, step = load.load_run(f.workdir, f.step)
  tok = load.run_tokenizer(f.workdir, config, step)
  ours = embedder_lib.JaxEmbedder(EncoderSpec.from_config(config.model), params["encoder"], tok, options)
  texts, st = embed_bench.bench_texts(f.texts), embed_bench.load_st(f.hf, f.max_length)
  parity = embed_bench.check_parity(ours, st, f.hf, texts[:embed_bench.PARITY_TEXTS])  # Before any timing.
  label = f"{epath.Path(f.workdir).name}@{step}"
  result = embed_bench.compare(ours, st, texts, f.st_batch_size)
  result.update(model=label, parity_max_abs_diff=parity)
  text = json.dumps(result, indent=1)
  print(text)
  print(embed_bench.table_rows(result, label))
  if f.out:
    with open(f.out, "w", encoding="utf-8") as fh:
      fh.write(text + "\n")


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

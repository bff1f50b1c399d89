r"""Convert a corpus to ArrayRecord shards, text or pre-tokenized, for pod training.

  python -m crossbert_jax.prepare --input=PATH[,PATH...] --output=DIR_or_gs://BUCKET/corpus --shards=N \
      [--tokenizer=spm.model]

Library: crossbert_jax.data.prepare. Exit status 0, 2 or 75 (rerun to resume). Manual: docs/data.md.
"""

from collections.abc import Sequence
import sys

from absl import app
from absl import flags

from crossbert_jax.core import choices, formats
from crossbert_jax.core.errors import EXIT_STOPPED, exit_on_user_error, no_positional, parse_flags_or_exit, require
from crossbert_jax.data import prepare
from crossbert_jax.data import tokenizer as tokenizer_lib


def _define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importers get no stray flags)."""
  if "shards" in flags.FLAGS:
    return
  flags.DEFINE_string("input", None, "File / dir / glob, comma-separated (a path holding commas is taken whole).")
  flags.DEFINE_string("output", None, "Folder for the shards (local or gs://).")
  flags.DEFINE_integer("shards", None, "Number of ArrayRecord shards (e.g. the number of hosts, or a multiple).")
  flags.DEFINE_enum("format", "auto", list(formats.choices()), "Input format; auto picks by file extension.")
  flags.DEFINE_string("text_field", "text", "Field with the text (jsonl/parquet/arrayrecord input).")
  flags.DEFINE_enum("text_unit", choices.TextUnit.PARAGRAPH.value, choices.values(choices.TextUnit),
                    "How plain-text files split into documents.")
  flags.DEFINE_integer("workers", 0, "Parallel worker processes (0: min(shards, CPUs)).")
  flags.DEFINE_bool("progress", True, "Progress bar.")
  flags.DEFINE_string(
      "tokenizer", "", "SentencePiece .model, or HF tokenizer.json / folder: write token ids "
      "(pre-tokenized shards), not text.")


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI body: writes the shards and prints a summary line."""
  f = flags.FLAGS
  no_positional(argv, ": pass everything as --flags")
  for name in ("input", "output", "shards"):
    require(name, advice=" (e.g. --input=corpus/ --output=gs://bucket/corpus --shards=64)")
  tok = tokenizer_lib.Tokenizer.load(f.tokenizer) if f.tokenizer else None
  done_before = prepare.finished(f.output)
  try:
    counts = prepare.prepare(f.input, f.output, f.shards, fmt=f.format, text_field=f.text_field, text_unit=f.text_unit,
                             workers=f.workers, progress=f.progress, tokenizer=tok)
  except prepare.Stopped as e:
    print(
        f"stopped by {e}: finished shards are kept in {f.output}; rerun the same command to write the rest "
        f"(exit {EXIT_STOPPED})", file=sys.stderr, flush=True)
    sys.exit(EXIT_STOPPED)
  also = f" --config.data.tokenizer={f.tokenizer}" if f.tokenizer else ""
  did = "already holds" if done_before else "wrote"
  print(f"{did} {len(counts)} shards, {sum(counts)} documents ({min(counts)}-{max(counts)} per shard) "
        f"to {f.output}; train with --config.data.path={f.output}{also}")


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

r"""Train a SentencePiece model with our special ids.

  python -m crossbert_jax.tokenizer --input=PATH[,PATH...] --vocab_size=32768 --output=spm.model [--force]

Library: crossbert_jax.data.tokenizer. Manual: docs/data.md.
"""

import itertools
import sys
from collections.abc import Sequence

from absl import app
from absl import flags

from crossbert_jax.core import choices, formats
from crossbert_jax.core import outputs
from crossbert_jax.core.errors import exit_on_user_error, no_positional, parse_flags_or_exit, require
from crossbert_jax.data import sources
from crossbert_jax.data.tokenizer import Tokenizer, train_tokenizer


def _define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importers get no stray flags)."""
  if "vocab_size" in flags.FLAGS:
    return
  flags.DEFINE_string(
      "input", None, "'builtin', or file / dir / glob, comma-separated (local or gs://); "
      "a path that exists whole is not split on its commas.")
  flags.DEFINE_integer("vocab_size", None, "Vocabulary size, specials included.")
  flags.DEFINE_string("output", None, "Where to write the .model file (gs:// works).")
  flags.DEFINE_bool("force", False, "Replace an existing --output file.")
  flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe"], "SentencePiece model type.")
  flags.DEFINE_enum("format", "auto", list(formats.choices()), "Input format; auto picks by file extension.")
  flags.DEFINE_string("text_field", "text", "Field with the text (jsonl/parquet/arrayrecord).")
  flags.DEFINE_enum("text_unit", choices.TextUnit.PARAGRAPH.value, choices.values(choices.TextUnit),
                    "How plain-text files split into documents.")
  flags.DEFINE_integer("max_documents", 0, "Use at most this many documents (0: all).")


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI body: trains a tokenizer from --input and prints the output path and vocab size."""
  f = flags.FLAGS
  no_positional(argv, ": pass everything as --flags")
  for name in ("input", "vocab_size", "output"):
    require(name, advice=" (e.g. --input=builtin --vocab_size=1024 --output=/tmp/tok.model)")
  outputs.check_output_file(f.output, "--output", force=f.force, suffix=".model")  # Before the slow training.
  docs = sources.iter_documents(f.input, fmt=f.format, text_field=f.text_field, text_unit=f.text_unit)
  if f.max_documents > 0:
    docs = itertools.islice(docs, f.max_documents)
  path = train_tokenizer(docs, f.vocab_size, f.output, model_type=f.model_type)
  tok = Tokenizer.load(path)
  print(f"wrote {path} (vocab_size={tok.vocab_size})")
  if tok.vocab_size < f.vocab_size:
    print(
        f"warning: the input yields {tok.vocab_size:,} pieces, fewer than --vocab_size={f.vocab_size:,} asked: "
        "give more text for a larger vocabulary (a model's vocab_size may stay larger; the extra ids go unused)",
        file=sys.stderr, flush=True)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

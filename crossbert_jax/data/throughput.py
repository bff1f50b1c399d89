"""What one input process supplies: tokens/s and fill ratio of `pipeline.make_iterator` per format.

`corpora` writes one corpus (Gutenberg books split into paragraphs) in each format the pipeline
reads -- plain text, JSONL, Parquet, ArrayRecord text and ArrayRecord pre-tokenized (both from
`prepare`) -- and `measure` times the packed batches one process draws from each. The rate counts
row slots (B x L per batch, what a train step consumes, padding included); the fill ratio is the
share of slots holding a token. The first batch (source set-up, worker start, the first round) is
not timed. The benchmark command is `python -m crossbert_jax.bench --data` (perf/feed_bench.py).
"""

import dataclasses
import json
import pathlib
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from crossbert_jax.core import sections
from crossbert_jax.data import pipeline
from crossbert_jax.data import prepare
from crossbert_jax.data import readers
from crossbert_jax.data import tokenizer as tokenizer_lib

FORMATS = ("text", "jsonl", "parquet", "arrayrecord_text", "arrayrecord_tokens")


def corpora(books: list[pathlib.Path], root: pathlib.Path, vocab_size: int = 8192,
            tokenizer_path: str = "") -> tuple[dict[str, str], tokenizer_lib.Tokenizer]:
  """({format: data.path}, tokenizer) for `books`, written under `root` (a tokenizer is trained if not given)."""
  root.mkdir(parents=True, exist_ok=True)
  text = root / "text"
  text.mkdir(exist_ok=True)
  docs = []
  for i, book in enumerate(books):
    (text / f"book{i:04d}.txt").write_bytes(book.read_bytes())
    docs += readers.read_text(text / f"book{i:04d}.txt", "paragraph")
  if not tokenizer_path:
    tokenizer_path = str(root / "spm.model")
    tokenizer_lib.train_tokenizer(docs, vocab_size, tokenizer_path, max_sentences=200_000)
  tok = tokenizer_lib.Tokenizer.load(tokenizer_path)
  (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  pq.write_table(pa.table({"text": docs}), root / "docs.parquet", row_group_size=4096)
  prepare.prepare(str(text), str(root / "ar_text"), 2, progress=False)
  prepare.prepare(str(text), str(root / "ar_tokens"), 2, progress=False, tokenizer=tok)
  paths = {
      "text": str(text), "jsonl": str(root / "docs.jsonl"), "parquet": str(root / "docs.parquet"),
      "arrayrecord_text": str(root / "ar_text"), "arrayrecord_tokens": str(root / "ar_tokens")}
  return paths, tok


def hf_corpora(paths: dict[str, str], root: pathlib.Path,
               vocab_size: int = 8192) -> tuple[dict[str, str], tokenizer_lib.AnyTokenizer]:
  """({text, arrayrecord_tokens}, tokenizer) for a Hugging Face byte-level BPE (ModernBERT's kind, its special
  names above the regular pieces) trained with `tokenizers` on `corpora`'s text; its shards under `root`."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top

  docs = [d for f in sorted(pathlib.Path(paths["text"]).glob("*.txt")) for d in readers.read_text(f, "paragraph")]
  bpe = Tokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  bpe.train_from_iterator(
      docs,
      trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|padding|>"],
                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  bpe.add_special_tokens([
      AddedToken(t, special=True, normalized=False) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")])
  root.mkdir(parents=True, exist_ok=True)
  bpe.save(str(root / "tokenizer.json"))
  tok = tokenizer_lib.Tokenizer.load(root / "tokenizer.json")
  prepare.prepare(paths["text"], str(root / "ar_tokens"), 2, progress=False, tokenizer=tok)
  return {"text": paths["text"], "arrayrecord_tokens": str(root / "ar_tokens")}, tok


def data_config(path: str, seq_len: int, worker_count: int) -> sections.Data:
  return dataclasses.replace(sections.Data.for_variant("base"), path=path, seq_len=seq_len, worker_count=worker_count)


def measure(data_cfg: sections.Data, tok: tokenizer_lib.Tokenizer, *, tokens_per_batch: int = 16384,
            seconds: float = 1.5, max_batches: int = 2000) -> dict[str, Any]:
  """{tokens_per_s, fill_ratio, batches, seconds} of one process's stream (B = tokens_per_batch // L)."""
  batch = max(tokens_per_batch // data_cfg.seq_len, 1)
  it = pipeline.make_iterator(data_cfg, tok, batch_size=batch, seed=0)
  next(it)  # Set-up, worker start and the first packing round: not timed.
  real = n = 0
  start = time.perf_counter()
  while n < max_batches and time.perf_counter() - start < seconds:
    real += int(np.count_nonzero(next(it)["segment_ids"]))
    n += 1
  elapsed = time.perf_counter() - start
  del it  # Stops its workers.
  slots = n * batch * data_cfg.seq_len
  return {
      "tokens_per_s": slots / elapsed, "fill_ratio": real / slots, "batches": n, "batch_size": batch,
      "seconds": elapsed}

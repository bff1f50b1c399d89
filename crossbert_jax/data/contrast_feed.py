"""The contrastive stage's input stream (objective=contrast): examples of T texts, tokenised and padded.

recipe=pairs: data.path names pair files (.jsonl / .parquet / .tsv; files, folders, globs,
comma-separated), read by `pairs.read_pairs` with contrast.columns, or a Hub dataset's split
(hf:OWNER/NAME[:CONFIG][@SPLIT], `pairs.read_hub_pairs`); an example is (anchor, positive)
or, with contrast.hard_negatives, (anchor, positive, negative). recipe=simcse: an example is one
document of data.path as pretraining reads it (`pipeline.document_dataset`: text, JSONL, Parquet,
ArrayRecord, the built-in corpus; data.text_unit picks lines or paragraphs).

Each text becomes `[CLS] ids [SEP]` truncated to data.seq_len and padded (the evaluation embedder's
layout: data/text_rows.py): to data.seq_len (contrast.padding=max), or to the shortest of `pad_lengths`
that holds the batch's longest text (contrast.padding=batch, as sentence-transformers pads each batch to its
longest text; a few lengths, so the step compiles a few programs, not one per batch; on several processes the
run's feed pads each process's rows to the longest length any of them has: `VaryingLength`). A batch is a dict of int32 numpy arrays: tokens / segment_ids / positions
B x T x L and text_ids B x T (`pairs.text_ids`: equal texts share an id, so the loss masks duplicates).
The order is pretraining's (a seeded shuffle per epoch, this process's stride: `pipeline.ordered`);
the iterator is Grain's, its state the next batch's index, so a resume continues exactly.
"""

from typing import Any, Sequence

import grain
import numpy as np

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import pairs, pipeline, sources, text_rows, tokenizer as tokenizer_lib, workers

Example = tuple[Any, ...]  # T texts (str), or token ids of a pre-tokenized document.


class _Examples(list):
  """Examples as a random-access source for `pipeline.ordered` (read whole by every process)."""
  per_process = False


def read_examples(c: plan_lib.Settings) -> list[Example]:
  """The (anchor, positive[, negative]) texts of every pair file of data.path, in file order; UserError
  (one line naming the file) for a missing column, a file without rows, a negative column asked but absent."""
  k = c.contrast
  columns = [name.strip() for name in k.columns.split(",")] if k.columns else None
  out: list[Example] = []
  hub = pairs.is_hub(c.data.path)
  for path in [c.data.path.strip()] if hub else sources.resolve_paths(c.data.path, "data.path"):
    rows = pairs.read_hub_pairs(path, columns) if hub else pairs.read_pairs(path, columns)
    if k.hard_negatives and rows[0].negative is None:
      raise UserError(f"{path}: no negative column (contrast.hard_negatives=True); give a file with one "
                      "(anchor, positive, negative) or set --config.contrast.hard_negatives=False")
    out.extend((p.anchor, p.positive, p.negative) if k.hard_negatives else (p.anchor, p.positive) for p in rows)
  if len(out) < c.train.batch_size:
    raise UserError(f"data.path={c.data.path} holds {len(out)} pair(s), fewer than one batch "
                    f"(train.batch_size={c.train.batch_size}): give more pairs or lower the batch size")
  return out


def pad_lengths(seq_len: int) -> list[int]:
  """The lengths a batch is padded to with contrast.padding=batch: 16, 32, 64, ... below seq_len, then seq_len."""
  return [n for n in (16 * 2 ** i for i in range(max(seq_len, 16).bit_length())) if n < seq_len] + [seq_len]


class _Encode:
  """A list of B examples -> the batch dict (a class, so Grain's workers can pickle it)."""
  def __init__(self, tok: tokenizer_lib.AnyTokenizer, seq_len: int, per_batch: bool = False):
    self._tok, self._seq_len, self._per_batch = tok, seq_len, per_batch

  def __call__(self, examples: Sequence[Example]) -> dict[str, np.ndarray]:
    b, t = len(examples), len(examples[0])
    flat = [text for example in examples for text in example]
    if isinstance(flat[0], str):
      seqs = text_rows.tokenize(self._tok, flat, max_length=self._seq_len)
      ids = pairs.text_ids(flat)
    else:  # Pre-tokenized shards: ids without specials.
      specials = self._tok.special_ids
      seqs = [[specials.cls, *np.asarray(x)[:self._seq_len - 2].tolist(), specials.sep] for x in flat]
      ids = pairs.text_ids([" ".join(map(str, s)) for s in seqs])
    length = self._seq_len
    if self._per_batch:
      longest = max(min(len(s), self._seq_len) for s in seqs)
      length = next(n for n in pad_lengths(self._seq_len) if n >= longest)
    rows = text_rows.pad_batch(seqs, length, self._tok.special_ids.pad)
    out = {name: a.reshape(b, t, length) for name, a in rows.items()}
    out["text_ids"] = ids.reshape(b, t)
    return out


def _one_text(document: Any) -> Example:
  return (document,)


def _documents(c: plan_lib.Settings, seed: int, process_index: int, process_count: int) -> grain.MapDataset:
  return pipeline.document_dataset(c.data, seed=seed, process_index=process_index,
                                   process_count=process_count).map(_one_text)


def make_dataset(c: plan_lib.Settings, tok: tokenizer_lib.AnyTokenizer, *, batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """This process's infinite stream of contrastive batches of `batch_size` examples (module doc)."""
  if batch_size < 1:
    raise UserError(f"per-process batch size must be >= 1, got {batch_size}")
  if c.data.mixture:
    raise UserError("config data.mixture: the contrastive stage reads one data.path; give the files there")
  pipeline.check_process(process_index, process_count)
  per_batch = c.contrast.padding == "batch"
  if c.contrast.recipe == "simcse":
    ds = _documents(c, seed, process_index, process_count)
  else:
    ds = pipeline.ordered(_Examples(read_examples(c)), c.data, seed=seed, process_index=process_index,
                          process_count=process_count)
  ds = ds.repeat(None).batch(batch_size, drop_remainder=True, batch_fn=_Encode(tok, c.data.seq_len, per_batch))
  it_ds = ds.to_iter_dataset()
  if c.data.worker_count > 0:
    it_ds = it_ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=c.data.worker_count, per_worker_buffer_size=c.data.worker_buffer_size),
        worker_init_fn=workers.exit_with_parent)
  return it_ds


class VaryingLength:
  """The iterator of contrast.padding=batch: Grain's, and `pad_values`, the arrays whose last axis is the batch's
  padded length with the value each is padded with. The run's feed (run/feed.py) pads every process's batch to
  the longest of them, so the global batch has one shape on several processes."""
  def __init__(self, iterator: grain.DatasetIterator, pad_id: int):
    self._iterator = iterator
    self.pad_values = {"tokens": pad_id, "segment_ids": 0, "positions": 0}

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._iterator)

  def get_state(self) -> dict[str, Any]:
    return self._iterator.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._iterator.set_state(state)

  def close(self) -> None:
    if hasattr(self._iterator, "close"):
      self._iterator.close()


def make_iterator(c: plan_lib.Settings, tok: tokenizer_lib.AnyTokenizer, *, batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> Any:
  """`iter(make_dataset(...))`: a checkpointable iterator (`get_state` / `set_state`): the spec's feed; with
  contrast.padding=batch a `VaryingLength` around it."""
  it = iter(
      make_dataset(c, tok, batch_size=batch_size, seed=seed, process_index=process_index, process_count=process_count))
  return VaryingLength(it, tok.special_ids.pad) if c.contrast.padding == "batch" else it

"""A GLUE split as fixed-shape batches: pairs joined by the tokenizer's pair template, rows padded to one of a
few bucket lengths (a task compiles one program per bucket, not per batch), a seeded order per epoch.

Training batches: epoch e shuffles the rows with `default_rng([seed, e])` and cuts the order into batches of
`batch_size` (the last one shorter, as torch's DataLoader), each padded to the smallest bucket holding its
longest row; a short batch is filled with weight-0 rows. Batch i of a run is a pure function of (seed, i),
so a resumed run reads exactly the batches it would have. Evaluation batches go by length (fewer pads).
"""

import dataclasses
import math
from typing import Iterator

import numpy as np

from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.evaluation import tasks as eval_tasks
from crossbert_jax.model import inference

MIN_BUCKET = 32


def buckets(max_length: int) -> tuple[int, ...]:
  """Powers of two from MIN_BUCKET, ending at max_length: 32, 64, 128, 256 for 256."""
  out, n = [], MIN_BUCKET
  while n < max_length:
    out.append(n)
    n *= 2
  return tuple(out) + (max_length,)


def bucket_of(length: int, lengths: tuple[int, ...]) -> int:
  """The smallest bucket holding `length` tokens."""
  return next(b for b in lengths if b >= length)


@dataclasses.dataclass(frozen=True)
class Encoded:
  """A split tokenized: token ids with specials per row, and the labels (int classes or float scores)."""
  ids: list[list[int]]
  labels: np.ndarray
  pad_id: int

  def __len__(self) -> int:
    return len(self.ids)


def encode(tok: tokenizer_lib.AnyTokenizer, split: eval_tasks.Split, max_length: int) -> Encoded:
  """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` per row, truncated to max_length (the longer side first)."""
  return Encoded(inference.tokenize(tok, split.texts, split.pairs, max_length), np.asarray(split.labels),
                 tok.special_ids.pad)


def steps_per_epoch(num_rows: int, batch_size: int) -> int:
  return math.ceil(num_rows / batch_size)


def epoch_order(num_rows: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(num_rows)


def batch(data: Encoded, rows: np.ndarray, batch_size: int, lengths: tuple[int, ...]) -> dict[str, np.ndarray]:
  """The rows as one batch of `batch_size`, padded to their bucket; past the rows, one-token filler rows of
  weight 0 (a real token each, so no row is all padding)."""
  seqs = [data.ids[i] for i in rows]
  length = bucket_of(max(len(s) for s in seqs), lengths)
  out = inference.pad_batch(seqs + [[data.pad_id]] * (batch_size - len(seqs)), length, data.pad_id)
  labels = np.zeros((batch_size,), data.labels.dtype)
  labels[:len(seqs)] = data.labels[rows]
  out["labels"] = labels
  out["weights"] = (np.arange(batch_size) < len(seqs)).astype(np.float32)
  return out


def train_batch(data: Encoded, step: int, batch_size: int, seed: int, lengths: tuple[int,
                                                                                     ...]) -> dict[str, np.ndarray]:
  """Batch `step` (0-based, counted over epochs) of a run."""
  per_epoch = steps_per_epoch(len(data), batch_size)
  epoch, i = divmod(step, per_epoch)
  rows = epoch_order(len(data), seed, epoch)[i * batch_size:(i + 1) * batch_size]
  return batch(data, rows, batch_size, lengths)


def eval_batches(data: Encoded, batch_size: int, lengths: tuple[int, ...]) -> Iterator[dict[str, np.ndarray]]:
  """The split sorted by length (fewer pads) in batches; each batch names its rows ("rows")."""
  order = np.argsort([len(s) for s in data.ids], kind="stable")
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    out = batch(data, rows, batch_size, lengths)
    out["rows"] = rows
    yield out

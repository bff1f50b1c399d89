"""Documents -> packed rows: `[CLS] ids [SEP]` cut into chunks of <= L, first-fit packed into bins.

One fused Grain iterator does what `_ChunkDataset` + `grain.experimental.FirstFitPackIterDataset`
did, with the same rows and the same saved state, bit for bit (tests/test_packing.py checks it
against Grain's), so elastic resume (data/elastic.py) and older checkpoints read it as before.
It fetches documents in batches (`fetch(indices)`: a batched read and a batched, multi-threaded
encode), places chunks with one numpy probe each, and builds each round's rows with a few
vectorised scatters instead of per-element Python.

A round: chunks are placed first-fit into `bins` rows of L until one fits nowhere (or the
documents end); the round's rows are then emitted in the order of
`default_rng(seed + rows emitted before the round).permuted(range(rows))`, as Grain's packer
does. The state is Grain's: {"parent": {"parent": {"next_index": i}, "chunk": c}, "next_row",
"counter"}, where (i, c) is where the round's first chunk was read from (document i, chunk c).

Shapes: L = seq_len, R = rows in a round (<= bins), T = tokens placed in a round.
"""

from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from crossbert_jax.data import tokenizer as tokenizer_lib

# (ids) or (ids, first chunk): data/elastic.py resumes a document part-way through.
Document = np.ndarray | tuple[np.ndarray, int]
Fetch = Callable[[list[int]], Sequence[Document]]
Row = dict[str, np.ndarray]
FETCH = 256  # Documents fetched (read, tokenized) at once.


def _chunks(element: Document, seq_len: int) -> tuple[np.ndarray, int]:
  """(`[CLS] ids [SEP]`, first chunk to emit); an empty document has no chunks."""
  ids_N, first = element if isinstance(element, tuple) else (element, 0)
  if not len(ids_N):
    return np.zeros(0, np.int32), 0
  doc_N = np.empty(len(ids_N) + 2, np.int32)
  doc_N[0], doc_N[1:-1], doc_N[-1] = tokenizer_lib.CLS_ID, ids_N, tokenizer_lib.SEP_ID
  return doc_N, first


class PackIterator(grain.DatasetIterator):
  """See the module docstring."""

  def __init__(self, fetch: Fetch, length: int | None, *, seq_len: int, bins: int, seed: int,
               window: tuple[int, int] = (0, 1)):
    super().__init__()
    self._fetch, self._length, self._window = fetch, length, window
    self._seq_len, self._bins, self._seed = seq_len, bins, seed
    self._set(0, 0, 0, 0)

  def _set(self, index: int, chunk: int, next_row: int, counter: int) -> None:
    self._start = (index, chunk)  # Where the current round's first chunk is read from.
    self._next_row, self._counter = next_row, counter
    self._rows: Row | None = None  # The current round's rows, packed.
    self._order: np.ndarray | None = None
    self._buffer: list[tuple[np.ndarray, int]] = []  # Documents [buffer_start, buffer_start + len).
    self._buffer_start = index

  def _document(self, i: int) -> tuple[np.ndarray, int] | None:
    """Document i (with its first chunk), or None past the end of a finite stream."""
    if self._length is not None and i >= self._length:
      return None
    k = i - self._buffer_start
    if not 0 <= k < len(self._buffer):
      hi = i + FETCH if self._length is None else min(i + FETCH, self._length)
      start, step = self._window  # Stream index j is document start + j * step (a Grain worker's slice).
      docs = self._fetch([start + j * step for j in range(i, hi)])
      self._buffer_start, self._buffer = i, [_chunks(d, self._seq_len) for d in docs]
      k = 0
    return self._buffer[k]

  def _pack_round(self) -> tuple[int, int]:
    """Packs the round that starts at `self._start` into `self._rows`; returns where the next starts."""
    L = self._seq_len
    free = np.full(self._bins, L, np.int64)
    used = 0  # Bins in use (first-fit fills them in order).
    seg_count = np.zeros(self._bins, np.int64)
    pieces, bins_P, cols_P, segs_P = [], [], [], []
    i, c = self._start
    # The (document, chunk) a state would name for the next read: Grain's chunker names the last
    # document it loaded until it loads the next, so after a document's last chunk it is (i, chunks).
    at = (i, c)
    doc = self._document(i)
    while doc is not None:
      doc_N, first = doc
      c = max(c, first)
      if c * L >= len(doc_N):  # Document done (or empty): the next one.
        i, c = i + 1, 0
        doc = self._document(i)
        continue
      piece = doc_N[c * L:(c + 1) * L]
      n = len(piece)
      b = int(np.argmax(free >= n))
      if free[b] < n:
        break  # Fits nowhere: it opens the next round.
      used = max(used, b + 1)
      pieces.append(piece)
      bins_P.append(b)
      cols_P.append(L - free[b])
      seg_count[b] += 1
      segs_P.append(seg_count[b])
      free[b] -= n
      c += 1
      at = (i, c)
    if not pieces:
      raise StopIteration
    self._rows = self._scatter(pieces, bins_P, cols_P, segs_P, used)
    self._order = np.random.default_rng(self._seed + self._counter - self._next_row).permuted(range(used))
    return at

  def _scatter(self, pieces: list[np.ndarray], bins_P: list[int], cols_P: list[int], segs_P: list[int],
               rows: int) -> Row:
    """The round's rows from its placed chunks, in three scatters."""
    lens_P = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
    starts_P = np.cumsum(lens_P) - lens_P
    offset_T = np.arange(int(lens_P.sum())) - np.repeat(starts_P, lens_P)
    row_T = np.repeat(np.asarray(bins_P), lens_P)
    col_T = np.repeat(np.asarray(cols_P), lens_P) + offset_T
    out = {k: np.zeros((rows, self._seq_len), np.int32) for k in ("tokens", "segment_ids", "positions")}
    out["tokens"][row_T, col_T] = np.concatenate(pieces)
    out["segment_ids"][row_T, col_T] = np.repeat(np.asarray(segs_P), lens_P)
    out["positions"][row_T, col_T] = offset_T
    return out

  def __next__(self) -> Row:
    if self._rows is None:
      self._next_start = self._pack_round()
    r = int(self._order[self._next_row])
    row = {k: v[r] for k, v in self._rows.items()}
    self._next_row += 1
    self._counter += 1
    if self._next_row >= len(self._order):
      index, chunk = self._next_start
      buffer, buffer_start = self._buffer, self._buffer_start
      self._set(index, chunk, 0, self._counter)
      self._buffer, self._buffer_start = buffer, buffer_start
    return row

  def get_state(self) -> dict[str, Any]:
    return {"parent": {"parent": {"next_index": self._start[0]}, "chunk": self._start[1]},
            "next_row": self._next_row, "counter": self._counter}

  def set_state(self, state: dict[str, Any]) -> None:
    self._set(state["parent"]["parent"]["next_index"], state["parent"]["chunk"], state["next_row"], state["counter"])


class PackDataset(grain.IterDataset):
  """Packed rows {tokens, segment_ids, positions} (int32 [L]) of the documents `fetch` gives.

  `length`: documents in the stream (None: endless).
  """

  def __init__(self, fetch: Fetch, length: int | None, *, seq_len: int, bins: int, seed: int):
    super().__init__()
    self._args = (fetch, length)
    self._kwargs = {"seq_len": seq_len, "bins": bins, "seed": seed, "window": (0, 1)}

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    """Grain's multiprocess prefetch gives worker w of W documents w, w + W, ... (as it sliced Grain's source)."""
    del sequential_slice  # An endless stream has no contiguous part to give.
    fetch, length = self._args
    start, step = sl.start or 0, sl.step or 1
    if length is not None:
      length = len(range(start, length, step))
    self._args = (fetch, length)
    self._kwargs["window"] = (start, step)

  def __iter__(self) -> PackIterator:
    return PackIterator(*self._args, **self._kwargs)

  def __str__(self) -> str:
    return f"PackDataset({self._kwargs})"

"""Documents -> packed rows: `[CLS] ids [SEP]` cut into chunks of <= L, first-fit packed into bins.

One fused Grain iterator does what `_ChunkDataset` + `grain.experimental.FirstFitPackIterDataset`
did, with the same rows and the same saved state, bit for bit (tests/unit/test_packing.py checks it
against Grain's), so elastic resume (data/elastic.py) and older checkpoints read it as before.

Hot path, per fetched batch of documents (`fetch(indices)`: one batched read, and for text one
batched, multi-threaded encode): the documents arrive flat (`Documents`: all ids in one array),
get their [CLS]/[SEP] in one vectorised copy, and are kept as one token buffer. Per chunk, only
the first-fit placement is Python: a max-tree over the bins' free space finds the first bin that
fits in O(log bins) list operations. A round's rows are then built by a few `np.repeat`s and
one gather from the buffer, and `next_rows` hands out a whole batch of them per call (`BatchRows`).
A fetch asks for about `FETCH_ROUNDS` rounds' worth of documents (`FETCH_MIN` to `FETCH_MAX`),
since a batched ArrayRecord read costs about a millisecond per call whatever its size, and an
endless stream reads its next fetch ahead in a thread while it packs (ArrayRecord reads and
SentencePiece encodes release the GIL), so `fetch` must be thread-safe. The stream depends on
neither.

A round: chunks are placed first-fit into `bins` rows of L until one fits nowhere (or the
documents end); the round's rows are then emitted in the order of
`default_rng(seed + rows emitted before the round).permuted(range(rows))`, as Grain's packer
does. The state is Grain's: {"parent": {"parent": {"next_index": i}, "chunk": c}, "next_row",
"counter"}, where (i, c) is where the round's first chunk was read from (document i, chunk c).

Shapes: L = seq_len, R = rows in a round (<= bins), P = chunks placed in a round, T = tokens
placed in a round, D = documents in a fetch, N = tokens in a fetch.
"""

from collections.abc import Callable, Sequence
import concurrent.futures
from typing import Any, NamedTuple

import grain
import numpy as np

from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds

Row = dict[str, np.ndarray]
FETCH_FIRST = 256  # Documents in the first fetch (after a start or a restore), before their size is known.
FETCH_MIN, FETCH_MAX = 64, 8192  # Documents fetched at least and at most at once (after the first).
FETCH_ROUNDS = 4  # A fetch aims at this many rounds' tokens (bins x L each).


class Documents(NamedTuple):
  """D documents, flat: ids_N (int32, no specials; document d is the d-th `lengths_D` run of them)
  and first_D, the first chunk to emit of each (data/elastic.py resumes a document part-way)."""
  ids_N: np.ndarray
  lengths_D: np.ndarray
  first_D: np.ndarray | None = None


# One document: ids, or (ids, first chunk).
Document = np.ndarray | tuple[np.ndarray, int]
Fetch = Callable[[list[int]], "Documents | Sequence[Document]"]


def flatten(docs: "Documents | Sequence[Document]") -> Documents:
  """`docs` as `Documents` (a list of id arrays or (ids, first chunk) pairs is concatenated)."""
  if isinstance(docs, Documents):
    return docs
  if not any(isinstance(d, tuple) for d in docs):  # Arrays only (the pipeline's fetches): one concatenate.
    lengths_D = np.fromiter(map(len, docs), np.int64, len(docs))
    return Documents(
        np.concatenate(docs).astype(np.int32, copy=False) if len(docs) else np.zeros(0, np.int32), lengths_D)
  pairs = [d if isinstance(d, tuple) else (d, 0) for d in docs]
  lengths_D = np.fromiter((len(ids) for ids, _ in pairs), np.int64, len(pairs))
  ids_N = (np.concatenate([np.asarray(ids, np.int32) for ids, _ in pairs]) if pairs and lengths_D.any() else np.zeros(
      0, np.int32))
  first_D = np.fromiter((f for _, f in pairs), np.int64, len(pairs))
  return Documents(ids_N, lengths_D, first_D if first_D.any() else None)


def _with_specials(docs: Documents, specials: SpecialIds) -> tuple[np.ndarray, np.ndarray]:
  """(`[CLS] ids [SEP]` of every document laid end to end, each one's length there: 0 when empty)."""
  lengths_D = np.asarray(docs.lengths_D, np.int64)
  sizes_D = np.where(lengths_D > 0, lengths_D + 2, 0)
  ends_D = np.cumsum(sizes_D)
  out_N = np.empty(int(ends_D[-1]) if len(ends_D) else 0, np.int32)
  starts_D = ends_D - sizes_D
  full = lengths_D > 0
  out_N[starts_D[full]] = specials.cls
  out_N[ends_D[full] - 1] = specials.sep
  # Document d's ids move by 2d + 1 (one [CLS] and [SEP] per earlier non-empty document, and its own [CLS]).
  shift_N = np.repeat(starts_D + 1 - (np.cumsum(lengths_D) - lengths_D), lengths_D)
  out_N[np.arange(len(docs.ids_N)) + shift_N] = docs.ids_N
  return out_N, sizes_D


_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _read_ahead_pool() -> concurrent.futures.ThreadPoolExecutor:
  """One thread per process reads the packers' next documents while they pack (made on first use)."""
  global _POOL
  if _POOL is None:
    _POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="crossbert-read-ahead")
  return _POOL


class _FirstFit:
  """Free space of `bins` rows of L; `place(n)`: the first row with >= n free (taking n), or -1.

  A max-tree in a list (leaf b at size + b): a query walks down to the leftmost leaf that fits, an
  update walks up until a maximum stops changing; both O(log bins) on Python ints.
  """
  def __init__(self, bins: int, seq_len: int):
    self.size = 1 << max(bins - 1, 0).bit_length()
    self.tree = [0] * (2 * self.size)
    self.tree[self.size:self.size + bins] = [seq_len] * bins
    for node in range(self.size - 1, 0, -1):
      self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])

  def place(self, n: int) -> int:
    tree, node = self.tree, 1
    if tree[1] < n:
      return -1
    while node < self.size:
      node += node
      if tree[node] < n:
        node += 1
    leaf, top = node, tree[node] - n
    tree[node] = top
    while node > 1:  # Each parent: the larger of its two children.
      sibling = tree[node ^ 1]
      if sibling > top:
        top = sibling
      node >>= 1
      if tree[node] == top:
        break
      tree[node] = top
    return leaf - self.size


class PackIterator(grain.DatasetIterator):
  """See the module docstring."""
  def __init__(self, fetch: Fetch, length: int | None, *, seq_len: int, bins: int, seed: int,
               window: tuple[int, int] = (0, 1), specials: SpecialIds = SENTENCEPIECE):
    super().__init__()
    self._fetch, self._length, self._window, self._specials = fetch, length, window, specials
    self._seq_len, self._bins, self._seed = seq_len, bins, seed
    self._set(0, 0, 0, 0)

  def _set(self, index: int, chunk: int, next_row: int, counter: int) -> None:
    self._start = (index, chunk)  # Where the current round's first chunk is read from.
    self._next_row, self._counter = next_row, counter
    self._rows: Row | None = None  # The current round's rows, packed.
    self._order: np.ndarray | None = None
    # Documents [buffer_start, buffer_start + len(sizes)) with specials, laid end to end in `tokens`
    # from global token offset `base`: document k of them at global offset `offsets[k]`, size `sizes[k]`.
    self._buffer_start, self._base = index, 0
    self._tokens = np.zeros(0, np.int32)
    self._offsets: list[int] = []
    self._sizes: list[int] = []
    self._firsts: list[int] = []
    self._fetch_size, self._fetches = FETCH_FIRST, 0
    self._ahead: tuple[tuple[int, int], concurrent.futures.Future] | None = None  # ((lo, hi), its read).

  def _read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Stream documents [lo, hi) with specials: (tokens_N, sizes_D, first chunks or None)."""
    start, step = self._window  # Stream index j is document start + j * step (a Grain worker's slice).
    docs = flatten(self._fetch(list(range(start + lo * step, start + hi * step, step))))
    return (*_with_specials(docs, self._specials), docs.first_D)

  def _extend(self, keep_from: int) -> bool:
    """Fetches the documents after the buffer's, keeping those from document `keep_from` on; False at the end."""
    lo = self._buffer_start + len(self._sizes)
    hi = lo + self._fetch_size if self._length is None else min(lo + self._fetch_size, self._length)
    if hi <= lo:
      return False
    ahead, self._ahead = self._ahead, None
    new_N, sizes_D, first_D = ahead[1].result() if ahead and ahead[0] == (lo, hi) else self._read(lo, hi)
    drop = keep_from - self._buffer_start
    end = self._offsets[-1] + self._sizes[-1] if self._sizes else self._base
    keep = self._offsets[drop] if drop < len(self._offsets) else end
    self._tokens = np.concatenate([self._tokens[keep - self._base:], new_N])
    self._base = keep
    self._offsets = self._offsets[drop:] + (end + np.cumsum(sizes_D) - sizes_D).tolist()
    self._sizes = self._sizes[drop:] + sizes_D.tolist()
    self._firsts = self._firsts[drop:] + ([0] * len(sizes_D) if first_D is None else first_D.tolist())
    self._buffer_start = keep_from
    tokens = max(int(sizes_D.sum()), 1)
    self._fetch_size = int(
        np.clip(FETCH_ROUNDS * self._bins * self._seq_len * len(sizes_D) // tokens, FETCH_MIN, FETCH_MAX))
    self._fetches += 1
    # Read ahead (the read and the encode release the GIL) once an endless stream is read on: not
    # on the first fetch, which is often a restore's re-pack of one round (data/elastic.py).
    if self._length is None and self._fetches > 1:
      nxt = (hi, hi + self._fetch_size)
      self._ahead = (nxt, _read_ahead_pool().submit(self._read, *nxt))
    return True

  def _pack_round(self) -> tuple[int, int]:
    """Packs the round that starts at `self._start` into `self._rows`; returns where the next starts."""
    L = self._seq_len
    fit = _FirstFit(self._bins, L)
    place = fit.place
    starts_P, lens_P, bins_P = [], [], []
    first_doc = i = self._start[0]
    c = self._start[1]
    # The (document, chunk) a state would name for the next read: Grain's chunker names the last
    # document it loaded until it loads the next, so after a document's last chunk it is (i, chunks).
    at = (i, c)
    k = i - self._buffer_start
    if not 0 <= k <= len(self._sizes):  # A restore, or a finite stream's end: start the buffer afresh.
      self._buffer_start, self._offsets, self._sizes, self._firsts = i, [], [], []
      self._tokens, self._base, k = np.zeros(0, np.int32), 0, 0
    sizes, offsets, firsts = self._sizes, self._offsets, self._firsts
    while True:
      if k >= len(sizes):
        if not self._extend(first_doc):
          break
        sizes, offsets, firsts = self._sizes, self._offsets, self._firsts
        k = i - self._buffer_start
      size = sizes[k]
      if c < firsts[k]:
        c = firsts[k]
      if c * L >= size:  # Document done (or empty): the next one.
        i, c, k = i + 1, 0, k + 1
        continue
      n = size - c * L
      if n > L:
        n = L
      b = place(n)
      if b < 0:
        break  # Fits nowhere: it opens the next round.
      starts_P.append(offsets[k] + c * L)
      lens_P.append(n)
      bins_P.append(b)
      c += 1
      at = (i, c)
    if not starts_P:
      raise StopIteration
    rows = max(bins_P) + 1  # First-fit fills rows in order.
    self._rows = self._scatter(starts_P, lens_P, bins_P, rows)
    self._order = np.random.default_rng(self._seed + self._counter - self._next_row).permuted(range(rows))
    return at

  def _scatter(self, starts_P: list[int], lens_P: list[int], bins_P: list[int], rows: int) -> Row:
    """The round's rows from its placed chunks (global buffer offset, length, row).

    A row holds its chunks in placement order from column 0, then padding. So with the chunks
    ordered by row (stably) and each row's padding as one more piece after them (Q = P + R pieces),
    the pieces tile the R x L slots in order, and every output is one `np.repeat` over the pieces
    (the tokens one gather from the buffer); padding is then zeroed.
    """
    L = self._seq_len
    order_P = np.argsort(np.asarray(bins_P, np.int32), kind="stable")
    bins_P = np.asarray(bins_P, np.int32)[order_P]
    lens_P = np.asarray(lens_P, np.int32)[order_P]
    count_R = np.bincount(bins_P, minlength=rows)  # First-fit fills rows in order: none is empty.
    end_R = np.cumsum(count_R)
    seg_P = np.arange(1, len(bins_P) + 1, dtype=np.int32) - np.repeat((end_R - count_R).astype(np.int32), count_R)
    piece_P = np.arange(len(bins_P)) + bins_P  # Chunk p is piece p + (rows before its row).
    pad_R = end_R + np.arange(rows)
    len_Q = np.empty(len(bins_P) + rows, np.int32)
    len_Q[piece_P] = lens_P
    len_Q[pad_R] = L - np.bincount(bins_P, weights=lens_P, minlength=rows).astype(np.int32)
    start_Q = np.cumsum(len_Q) - len_Q  # The slot each piece starts at.
    shift_Q = np.zeros(len(len_Q), np.int64)  # Buffer index - slot, along a chunk.
    shift_Q[piece_P] = np.asarray(starts_P, np.int64)[order_P] - self._base - start_Q[piece_P]
    seg_Q = np.zeros(len(len_Q), np.int32)
    seg_Q[piece_P] = seg_P
    segment_ids = np.repeat(seg_Q, len_Q)
    padding = segment_ids == 0
    # Padding reads somewhere in the buffer ("clip": the buffer can be shorter than its slots), then is zeroed.
    tokens = self._tokens.take(np.arange(rows * L) + np.repeat(shift_Q, len_Q), mode="clip")
    tokens[padding] = self._specials.pad
    positions = np.arange(rows * L, dtype=np.int32) - np.repeat(start_Q.astype(np.int32), len_Q)
    positions[padding] = 0
    return {
        "tokens": tokens.reshape(rows, L), "segment_ids": segment_ids.reshape(rows, L),
        "positions": positions.reshape(rows, L)}

  def __next__(self) -> Row:
    return {k: v[0] for k, v in self.next_rows(1).items()}

  def next_rows(self, count: int) -> Row:
    """The next `count` rows at once ([count, L] arrays): what `count` `next` calls give, stacked."""
    parts = []
    while count > 0:
      if self._rows is None:
        self._next_start = self._pack_round()
      take_K = self._order[self._next_row:self._next_row + count]
      parts.append({k: v[take_K] for k, v in self._rows.items()})
      self._next_row += len(take_K)
      self._counter += len(take_K)
      count -= len(take_K)
      if self._next_row >= len(self._order):  # The next round starts where this one stopped.
        self._start, self._next_row, self._rows, self._order = self._next_start, 0, None, None
    return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def get_state(self) -> dict[str, Any]:
    return {
        "parent": {"parent": {"next_index": self._start[0]}, "chunk": self._start[1]}, "next_row": self._next_row,
        "counter": self._counter}

  def set_state(self, state: dict[str, Any]) -> None:
    self._set(state["parent"]["parent"]["next_index"], state["parent"]["chunk"], state["next_row"], state["counter"])


class PackDataset(grain.IterDataset):
  """Packed rows {tokens, segment_ids, positions} (int32 [L]) of the documents `fetch` gives.

  `length`: documents in the stream (None: endless). `specials`: the tokenizer's [CLS] / [SEP] / [PAD].
  """
  def __init__(self, fetch: Fetch, length: int | None, *, seq_len: int, bins: int, seed: int,
               specials: SpecialIds = SENTENCEPIECE):
    super().__init__()
    self._args = (fetch, length)
    self._kwargs = {"seq_len": seq_len, "bins": bins, "seed": seed, "window": (0, 1), "specials": specials}

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


class BatchRows(grain.IterDataset):
  """Batches of `batch_size` rows (a remainder is dropped), as Grain's `batch` makes them and with
  its state (the parent's); a parent iterator with `next_rows` gives each batch in one call."""
  def __init__(self, parent: grain.IterDataset, batch_size: int):
    super().__init__(parent)
    self._batch_size = batch_size

  def __iter__(self) -> "_BatchRowsIterator":
    return _BatchRowsIterator(self._parent.__iter__(), self._batch_size)

  def __str__(self) -> str:
    return f"BatchRows(batch_size={self._batch_size})"


class _BatchRowsIterator(grain.DatasetIterator):
  """See `BatchRows`."""
  def __init__(self, parent: grain.DatasetIterator, batch_size: int):
    super().__init__(parent)
    self._batch_size = batch_size

  def __next__(self) -> Row:
    if hasattr(self._parent, "next_rows"):
      return self._parent.next_rows(self._batch_size)
    rows = [next(self._parent) for _ in range(self._batch_size)]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)

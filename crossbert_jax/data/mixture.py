"""Weighted mixtures (`data.mixture`): which source each document of the stream comes from, and the
tokens read from each.

The mixed stream is one endless sequence of documents, like a single source's repeated list
(data/pipeline.py), so the packer, its saved state (a document index) and orbax see no difference.
Document i comes from source `s(i)`, its `j(i)`-th document (that source's own shuffled, repeated,
per-process stream), both pure functions of i:

  * The stream is cut into blocks of `BLOCK` documents. The first n documents hold
    floor(F_k n) - floor(F_(k-1) n) of source k at every block boundary n, where F_k is the
    cumulative normalised weight: each source gets its share to within one document, with no drift.
  * Within block b the sources' documents are in a seeded random order (`default_rng([seed, b])`),
    so a batch is a random draw, not a fixed pattern; j(i) is source s(i)'s count before block b
    plus its rank within the block.

Resuming is exact because nothing but the index is state. A one-source mixture reads exactly the
stream of `data.path` with that source (source 0 is shuffled with the run's seed; source k > 0
with the seed salted by k).

Tokens per source (`source_tokens`): `CountedRows` wraps the packer and counts, per source, the
non-padding tokens ([CLS] ids [SEP], cut into chunks of <= L) of the packed rows of every
*completed* packing round: the tokens the iterator has handed out, less the current round's (at
most `pipeline.packing_bins` rows), summed over this process's Grain workers. The counts are saved
with the iterator state, so they survive a resume.
"""

from collections.abc import Sequence
from typing import Any

import dataclasses

import grain
import numpy as np

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections
from crossbert_jax.core import mixture as mixture_schema
from crossbert_jax.data import packing

BLOCK = 4096  # Documents per block of the mixed stream (module doc).


def source_configs(data_cfg: sections.Data) -> list[plan_lib.Settings]:
  """One single-source data config per mixture source: data_cfg with the source's path and options."""
  out = []
  for src in data_cfg.mixture:
    keys = {k: v for k, v in src.items() if k in ("path", "format", "text_field", "text_unit")}
    out.append(dataclasses.replace(data_cfg, mixture=(), **keys))
  return out


def names(data_cfg: sections.Data) -> list[str]:
  """The sources' short names (the `tokens_seen/<name>` metrics keys)."""
  return mixture_schema.source_names(data_cfg.mixture)


class Selection:
  """Mixed-stream document index -> (source, index in that source's stream); see the module doc."""
  def __init__(self, weights: Sequence[float], seed: int):
    w = np.asarray(weights, np.float64)
    self._cum = np.cumsum(w) / w.sum()
    self._cum[-1] = 1.0
    self._seed = seed
    self._block: tuple[int, np.ndarray, np.ndarray] | None = None  # (b, source_M, local_M)

  def before(self, n: int) -> np.ndarray:
    """Documents of each source among the first n (exact at block boundaries)."""
    upto = np.floor(self._cum * n).astype(np.int64)
    upto[-1] = n
    return np.diff(upto, prepend=0)

  def _of_block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
    if self._block is None or self._block[0] != b:
      start = self.before(b * BLOCK)
      counts = self.before((b + 1) * BLOCK) - start
      source_M = np.random.default_rng([self._seed, b]).permutation(np.repeat(np.arange(len(counts)), counts))
      order = np.argsort(source_M, kind="stable")
      rank_M = np.empty(BLOCK, np.int64)
      rank_M[order] = np.arange(BLOCK) - (np.cumsum(counts) - counts)[source_M[order]]
      self._block = (b, source_M, start[source_M] + rank_M)
    return self._block[1], self._block[2]

  def locate(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(source_K, index in the source's stream_K) of mixed-stream documents `indices`."""
    indices_K = np.asarray(indices, np.int64)
    source_K, local_K = np.empty_like(indices_K), np.empty_like(indices_K)
    blocks_K = indices_K // BLOCK
    for b in np.unique(blocks_K):
      where = np.flatnonzero(blocks_K == b)
      source_M, local_M = self._of_block(int(b))
      source_K[where], local_K[where] = source_M[indices_K[where] % BLOCK], local_M[indices_K[where] % BLOCK]
    return source_K, local_K


class MixedFetch:
  """`packing.Fetch` of the mixed stream: one batched fetch per source; records what it read."""
  def __init__(self, fetches: Sequence[packing.Fetch], selection: Selection):
    self._fetches, self._selection = list(fetches), selection
    self._record: dict[int, tuple[int, int]] = {}  # Mixed index -> (source, packed length).

  def __call__(self, indices: list[int]) -> packing.Documents:
    source_K, local_K = self._selection.locate(indices)
    lengths_D = np.zeros(len(indices), np.int64)
    starts_D = np.zeros(len(indices), np.int64)  # Where each document's ids start in `flat` below.
    flat, base = [], 0
    for k in np.unique(source_K):
      where = np.flatnonzero(source_K == k)
      docs = packing.flatten(self._fetches[k](local_K[where].tolist()))  # A source's fetch: flat documents.
      lengths_D[where] = docs.lengths_D
      starts_D[where] = base + np.cumsum(docs.lengths_D) - docs.lengths_D
      flat.append(docs.ids_N)
      base += len(docs.ids_N)
    # The documents in stream order: one gather from the sources' concatenated ids.
    out_starts_D = np.cumsum(lengths_D) - lengths_D
    gather_N = np.repeat(starts_D - out_starts_D, lengths_D) + np.arange(int(lengths_D.sum()))
    ids_N = np.concatenate(flat)[gather_N] if flat else np.zeros(0, np.int32)
    packed_D = np.where(lengths_D > 0, lengths_D + 2, 0)  # [CLS] ids [SEP]; an empty document is dropped.
    self._record.update(zip(indices, zip(source_K.tolist(), packed_D.tolist())))
    return packing.Documents(ids_N.astype(np.int32, copy=False), lengths_D)

  def lengths(self, indices: list[int]) -> list[tuple[int, int]]:
    """(source, packed length) of mixed documents `indices` (ascending), from the record (read again if
    missing); the record then forgets the documents before the last one (the counter moves on)."""
    missing = [i for i in indices if i not in self._record]
    if missing:
      self(missing)
    out = [self._record[i] for i in indices]
    if indices:
      self._record = {i: v for i, v in self._record.items() if i >= indices[-1]}
    return out


class CountedRows(grain.IterDataset):
  """The packer's rows, unchanged, with per-source token counts in the iterator state (module doc)."""
  def __init__(self, rows: packing.PackDataset, fetch: MixedFetch, source_names: list[str], seq_len: int):
    super().__init__(rows)
    self._fetch, self._names, self._seq_len = fetch, source_names, seq_len
    self._window = (0, 1)

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    """A Grain worker's slice: the packer's, which reads documents start, start + step, ..."""
    self._window = (sl.start or 0, sl.step or 1)
    self._parent.set_slice(sl, sequential_slice)

  def __iter__(self) -> "_CountedRowsIterator":
    return _CountedRowsIterator(self._parent.__iter__(), self._fetch, self._names, self._seq_len, self._window)

  def __str__(self) -> str:
    return f"CountedRows({self._names})"


class _CountedRowsIterator(grain.DatasetIterator):
  """Counts the tokens of the rounds the packer has finished: whole documents before the current
  round's start (document i, chunk c), plus document i's chunks before c."""
  def __init__(self, rows: grain.DatasetIterator, fetch: MixedFetch, source_names: list[str], seq_len: int,
               window: tuple[int, int]):
    super().__init__(rows)
    self._fetch, self._names, self._seq_len, self._window = fetch, source_names, seq_len, window
    self._whole = np.zeros(len(source_names), np.int64)  # Tokens of the documents before `self._at[0]`.
    self._at = (0, 0)  # The packer's round start (document, chunk) that the counts reach.
    self._partial = (0, 0)  # (source, tokens) of document `self._at[0]`'s chunks before `self._at[1]`.

  def __next__(self) -> packing.Row:
    row = next(self._parent)
    start = self._parent.get_state()["parent"]
    at = (start["parent"]["next_index"], start["chunk"])
    if at != self._at:
      self._advance(*at)
    return row

  def _advance(self, i: int, c: int) -> None:
    first, step = self._window
    done = self._at[0]
    lengths = self._fetch.lengths([first + j * step for j in range(done, i + (c > 0))])
    for source, n in lengths[:i - done]:
      self._whole[source] += n
    self._partial = (lengths[-1][0], min(lengths[-1][1], c * self._seq_len)) if c > 0 else (0, 0)
    self._at = (i, c)

  def counts(self) -> dict[str, int]:
    out = self._whole.copy()
    out[self._partial[0]] += self._partial[1]
    return {name: int(n) for name, n in zip(self._names, out)}

  def get_state(self) -> dict[str, Any]:
    return {"rows": self._parent.get_state(), "source_tokens": self.counts(), "partial": list(self._partial)}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["rows"])
    start = state["rows"]["parent"]
    self._at = (start["parent"]["next_index"], start["chunk"])
    self._partial = (int(state["partial"][0]), int(state["partial"][1]))
    self._whole = np.asarray([state["source_tokens"][name] for name in self._names], np.int64)
    self._whole[self._partial[0]] -= self._partial[1]


def source_tokens(iterator: grain.DatasetIterator) -> dict[str, int]:
  """Per-source tokens counted by a mixture iterator (module doc), summed over its Grain workers;
  {} for a single-source stream."""
  total: dict[str, int] = {}

  def walk(state: Any) -> None:
    if isinstance(state, dict):
      if "source_tokens" in state:
        for name, n in state["source_tokens"].items():
          total[name] = total.get(name, 0) + int(n)
        return
      for v in state.values():
        walk(v)
    elif isinstance(state, (list, tuple)):
      for v in state:
        walk(v)

  walk(iterator.get_state())
  return total

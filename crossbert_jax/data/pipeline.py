"""Grain input pipeline: documents -> shuffled, sharded, tokenized, packed int32 batches.

  source (text/JSONL/Parquet: this host's share only, see data/splits.py) -> seeded shuffle (new
  order each epoch, repeats forever) -> per-process stride (sources read whole)
  -> tokenize -> [CLS] ids [SEP], cut into chunks of <= L -> first-fit pack to L -> batch
  -> multiprocess prefetch (data.worker_count > 0)

Shapes: B = per-process batch size, L = data.seq_len, N = one document's token count. A batch is
a dict of int32 numpy arrays:
  tokens_BxL       token ids; PAD_ID only at row ends.
  segment_ids_BxL  1, 2, 3, ... per packed document chunk within a row; 0 on padding.
  positions_BxL    0, 1, 2, ... restarting at each segment; 0 on padding.
A segment is always one whole document or one consecutive chunk of a document longer than L;
documents are never merged. The iterator has `get_state` / `set_state` and is saved by orbax
through `grain.checkpoint.CheckpointSave(iterator)` / `CheckpointRestore(iterator)`.
"""

import os
import threading
import time
from typing import Any

import grain
import ml_collections
import numpy as np

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import elastic
from crossbert_jax.data import sources
from crossbert_jax.data import tokenizer as tokenizer_lib

# First-fit packing keeps this many rows open (at least the batch size): more bins, less
# padding, at the cost of packing (and re-packing after a restore) that many rows at once.
MIN_PACKING_BINS = 64
# Reading in-memory documents: prefetch threads cost more than they save (2.5x slower on 2
# cores). ArrayRecord reads block on I/O, so those get threads.
_IN_MEMORY_READ = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
_IO_READ = grain.ReadOptions(num_threads=8, prefetch_buffer_size=256)


# ----------------------------------------------------------------------------- pipeline


def _combine_seeds(*seeds: int) -> int:
  return int(np.random.SeedSequence([s % 2**32 for s in seeds]).generate_state(1)[0])


class _Tokenize:
  """Document -> int32 ids without specials (a class, so worker processes can pickle it)."""

  def __init__(self, tokenizer: tokenizer_lib.Tokenizer):
    self._tokenizer = tokenizer

  def __call__(self, doc: str) -> np.ndarray:
    return np.asarray(self._tokenizer.encode(doc), np.int32)


class _ChunkIterator(grain.DatasetIterator):
  """Ids -> `[CLS] ids [SEP]` cut into consecutive chunks of <= L; empty documents dropped."""

  def __init__(self, parent: grain.DatasetIterator, seq_len: int):
    super().__init__(parent)
    self._seq_len = seq_len
    self._doc_state = self._parent.get_state()  # Parent state before the current document.
    self._chunks: list[np.ndarray] = []
    self._next_chunk = 0

  def _load(self, element: np.ndarray | tuple[np.ndarray, int]) -> None:
    # A tuple (ids, first chunk) resumes a document whose first chunks went elsewhere (data/elastic.py).
    ids_N, first_chunk = element if isinstance(element, tuple) else (element, 0)
    if len(ids_N):
      doc_N = np.concatenate([[tokenizer_lib.CLS_ID], ids_N, [tokenizer_lib.SEP_ID]]).astype(np.int32)
      self._chunks = [doc_N[i:i + self._seq_len] for i in range(0, len(doc_N), self._seq_len)]
    else:
      self._chunks = []
    self._next_chunk = first_chunk

  def __next__(self) -> dict[str, np.ndarray]:
    while self._next_chunk >= len(self._chunks):
      self._doc_state = self._parent.get_state()
      self._load(next(self._parent))
    chunk = self._chunks[self._next_chunk]
    self._next_chunk += 1
    return {"tokens": chunk}

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._doc_state, "chunk": self._next_chunk}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._doc_state = state["parent"]
    self._chunks, self._next_chunk = [], 0
    if state["chunk"]:  # Mid-document: re-read it and skip the chunks already emitted.
      self._load(next(self._parent))
      self._next_chunk = state["chunk"]


class _ChunkDataset(grain.IterDataset):
  """See `_ChunkIterator`."""

  def __init__(self, parent: grain.IterDataset, seq_len: int):
    super().__init__(parent)
    self._seq_len = seq_len

  def __iter__(self) -> _ChunkIterator:
    return _ChunkIterator(self._parent.__iter__(), self._seq_len)

  def __str__(self) -> str:
    return f"_ChunkDataset(seq_len={self._seq_len})"


def _exit_with_parent(worker_index: int, num_workers: int) -> None:
  """Grain worker init: the worker exits within a second of its parent (the trainer) dying.

  Grain's spawned workers otherwise outlive a `kill -9` of the trainer, blocked on a full queue.
  A thread polls the parent pid rather than prctl(PR_SET_PDEATHSIG): that fires when the
  *thread* that spawned the worker exits, which for Grain is not the trainer's lifetime.
  """
  del worker_index, num_workers
  parent = os.getppid()

  def watch():
    while os.getppid() == parent:
      time.sleep(0.5)
    os._exit(0)  # The parent is gone: nobody reads our queue; skip cleanup that may block.

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _rename(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {"tokens": row["tokens"].astype(np.int32),
          "segment_ids": row["tokens_segment_ids"].astype(np.int32),
          "positions": row["tokens_positions"].astype(np.int32)}


def document_dataset(data_cfg: ml_collections.ConfigDict, *, seed: int, process_index: int = 0,
                     process_count: int = 1) -> grain.MapDataset:
  """One epoch of this process's documents (str), shuffled; epoch e of `ds[i]` is `ds[i + e * len]`."""
  if not 0 <= process_index < process_count:
    raise UserError(f"process_index={process_index} must be in [0, process_count={process_count})")
  return _shard(sources.document_source(data_cfg, process_index, process_count), data_cfg, seed,
                process_index, process_count)


class _SmallShuffle(grain.MapDataset):
  """Per-epoch shuffle by a stored permutation, for small datasets.

  grain's index_shuffle costs ~20 ms per element on a 3-element dataset (and ~1 ms at 100),
  against ~10 us at 10^5; a permutation array is cheap below `SMALL_SHUFFLE_MAX` elements.
  Like `MapDataset.shuffle`, element `i + e * len` is epoch e's i-th element.
  """

  def __init__(self, parent: grain.MapDataset, seed: int):
    super().__init__(parent)
    self._seed = seed
    self._perm_epoch: tuple[int, np.ndarray] | None = None

  def __len__(self) -> int:
    return len(self._parent)

  def __str__(self) -> str:
    return f"_SmallShuffle(seed={self._seed})"

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    n = len(self._parent)
    epoch, i = divmod(index, n)
    if self._perm_epoch is None or self._perm_epoch[0] != epoch:
      self._perm_epoch = (epoch, np.random.default_rng([self._seed, epoch]).permutation(n))
    return self._parent[int(self._perm_epoch[1][i]) + epoch * n]


SMALL_SHUFFLE_MAX = 1 << 16


def _shard(source: sources.DocumentSource, data_cfg: ml_collections.ConfigDict, seed: int,
           process_index: int, process_count: int) -> grain.MapDataset:
  if not 0 <= process_index < process_count:
    raise UserError(f"process_index={process_index} must be in [0, process_count={process_count})")
  ds = grain.MapDataset.source(source)
  # Sources read whole (builtin, ArrayRecord) are shuffled before striding, so every process sees
  # a uniform sample; per-host sources (data/splits.py) shuffle this process's share. Both shuffles
  # draw a fresh permutation for each epoch (index // len) once the dataset is repeated.
  shuffle_seed = _combine_seeds(data_cfg.shuffle_seed, seed)
  if len(ds) <= SMALL_SHUFFLE_MAX:
    ds = _SmallShuffle(ds, shuffle_seed)
  else:
    ds = ds.shuffle(seed=shuffle_seed)
  if not source.per_process:  # Otherwise the source already holds only this process's share.
    ds = ds[process_index::process_count]
  if len(ds) == 0:
    raise UserError(f"data.path={data_cfg.path!r} has fewer documents than the {process_count} "
                    "processes reading it: add data or use text_unit='line'")
  return ds


def packing_bins(batch_size: int) -> int:
  """Rows packed at once for a per-process batch size."""
  return max(batch_size, MIN_PACKING_BINS)


class Layout:
  """Everything that fixes one process's stream: its documents, their order and their packing.

  `documents()` is the process's share, tokenized and repeated: element i is document i % n of
  epoch i // n (n = `epoch_length()`), each epoch in a new order. `rows()` packs it: the stream of packed
  rows that `make_dataset` batches. `pack` packs any other documents the same way (data/elastic.py).
  """

  def __init__(self, data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *, bins: int,
               seed: int, process_index: int, process_count: int):
    if data_cfg.seq_len < 4:
      raise UserError(f"data.seq_len must be >= 4, got {data_cfg.seq_len}")
    if not 0 <= process_index < process_count:
      raise UserError(f"process_index={process_index} must be in [0, process_count={process_count})")
    self.data_cfg, self.tokenizer, self.bins, self.seed = data_cfg, tokenizer, bins, seed
    self.process_index, self.process_count = process_index, process_count
    self._documents: grain.MapDataset | None = None
    self._epoch_length = 0
    self.read_options = _IN_MEMORY_READ

  def documents(self) -> grain.MapDataset:
    if self._documents is None:
      source = sources.document_source(self.data_cfg, self.process_index, self.process_count)
      ds = _shard(source, self.data_cfg, self.seed, self.process_index, self.process_count)
      self._epoch_length = len(ds)
      self.read_options = _IO_READ if source.reads_files else _IN_MEMORY_READ
      self._documents = ds.map(_Tokenize(self.tokenizer)).repeat(None)
    return self._documents

  def epoch_length(self) -> int:
    """Documents in one epoch of this process's share."""
    self.documents()
    return self._epoch_length

  def pack(self, documents: grain.IterDataset, *salt: int) -> grain.IterDataset:
    """Token ids (or (ids, first chunk)) -> packed rows {tokens, tokens_segment_ids, tokens_positions}."""
    return grain.experimental.FirstFitPackIterDataset(
        _ChunkDataset(documents, self.data_cfg.seq_len), length_struct={"tokens": self.data_cfg.seq_len},
        num_packing_bins=self.bins, shuffle_bins=True,
        seed=_combine_seeds(self.data_cfg.shuffle_seed, self.seed, self.process_index, *salt))

  def under(self, *, bins: int, process_index: int, process_count: int) -> "Layout":
    """The same data and seed under another process layout (an earlier run's)."""
    return Layout(self.data_cfg, self.tokenizer, bins=bins, seed=self.seed, process_index=process_index,
                  process_count=process_count)

  def rows(self) -> grain.IterDataset:
    documents = self.documents()
    return self.pack(documents.to_iter_dataset(self.read_options))


def make_dataset(data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *,
                 batch_size: int, seed: int, process_index: int = 0,
                 process_count: int = 1) -> grain.IterDataset:
  """The infinite training stream of this process: dicts of int32 [B, L] arrays (see module doc).

  Its iterator's state is the packer's; after a change of process count the trainer sets a
  re-shard state instead (`data.elastic.reshard_state`), and the stream first drains the old
  layout's unread documents.
  """
  if batch_size < 1:
    raise UserError(f"per-process batch size must be >= 1, got {batch_size}")
  layout = Layout(data_cfg, tokenizer, bins=packing_bins(batch_size), seed=seed, process_index=process_index,
                  process_count=process_count)
  it_ds = elastic.ElasticRows(layout).map(_rename).batch(batch_size, drop_remainder=True)
  if data_cfg.worker_count > 0:
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=data_cfg.worker_count, per_worker_buffer_size=data_cfg.worker_buffer_size),
        worker_init_fn=_exit_with_parent)
  return it_ds


def make_iterator(data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *,
                  batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> grain.DatasetIterator:
  """`iter(make_dataset(...))`: a checkpointable iterator (`get_state` / `set_state`)."""
  return iter(make_dataset(data_cfg, tokenizer, batch_size=batch_size, seed=seed,
                           process_index=process_index, process_count=process_count))

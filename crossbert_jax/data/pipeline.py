"""Grain input pipeline: documents -> shuffled, sharded, tokenized, packed int32 batches.

  source (text/JSONL/Parquet: this host's share only, see data/splits.py; ArrayRecord text or
  pre-tokenized shards, data/shards.py) -> seeded shuffle (new order each epoch, repeats forever)
  -> per-process stride (sources read whole) -> batched read + batched, multi-threaded tokenize
  (none for pre-tokenized shards) -> [CLS] ids [SEP], cut into chunks of <= L -> first-fit pack
  to L (both in data/packing.py) -> batch -> multiprocess prefetch (data.worker_count > 0)
With data.mixture, each source is read, shuffled and strided as above, and the packer reads the
weighted mix of their streams (data/mixture.py), which also counts the tokens read per source.

Shapes: B = per-process batch size, L = data.seq_len, N = one document's token count. A batch is
a dict of int32 numpy arrays:
  tokens_BxL       token ids; PAD_ID only at row ends.
  segment_ids_BxL  1, 2, 3, ... per packed document chunk within a row; 0 on padding.
  positions_BxL    0, 1, 2, ... restarting at each segment; 0 on padding.
A segment is always one whole document or one consecutive chunk of a document longer than L;
documents are never merged. The iterator has `get_state` / `set_state` and is saved by orbax
through `grain.checkpoint.CheckpointSave(iterator)` / `CheckpointRestore(iterator)`.
"""

from collections.abc import Sequence
import itertools
import threading
from typing import Any

import grain
import numpy as np

from crossbert_jax.core import sections
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import elastic
from crossbert_jax.data import mixture
from crossbert_jax.data import packing
from crossbert_jax.data import shards
from crossbert_jax.data import sources
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.data import workers

# First-fit packing keeps this many rows open (at least the batch size): more bins, less
# padding, at the cost of packing (and re-packing after a restore) that many rows at once.
MIN_PACKING_BINS = 64
_MIXTURE_SALT = 1 << 21  # Seeds the choice of a mixture's sources apart from the shuffles.

# ----------------------------------------------------------------------------- pipeline


def _combine_seeds(*seeds: int) -> int:
  return int(np.random.SeedSequence([s % 2 ** 32 for s in seeds]).generate_state(1)[0])


class _Tokenize:
  """Document -> int32 ids without specials (a class, so worker processes can pickle it)."""
  def __init__(self, tokenizer: tokenizer_lib.Tokenizer):
    self._tokenizer = tokenizer

  def __call__(self, doc: str) -> np.ndarray:
    return np.asarray(self._tokenizer.encode(doc), np.int32)


class _Fetch:
  """Documents at stream `indices` as `packing.Documents`: index mapping, one batched read and
  (text) one batched encode, without Grain's per-element bookkeeping."""
  def __init__(self, order: "_Order", tokenizer: tokenizer_lib.Tokenizer | None):
    self._order, self._tokenizer = order, tokenizer
    self._lock = threading.Lock()  # Packers read ahead in a thread; one read of the source at a time.

  def __getstate__(self) -> dict[str, Any]:  # Grain workers unpickle their own.
    return {**self.__dict__, "_lock": None}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state, _lock=threading.Lock())

  def __call__(self, indices: list[int]) -> packing.Documents:
    with self._lock:
      source, keys = self._order.source, self._order.source_indices(indices).tolist()
      if self._tokenizer is None:  # Pre-tokenized shards.
        return packing.Documents(*source.read_tokens(keys))
      ids = self._tokenizer.encode_batch(source._getitems(keys))  # pylint: disable=protected-access
    lengths_D = np.fromiter(map(len, ids), np.int64, len(ids))
    return packing.Documents(np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths_D.sum())), lengths_D)


def check_process(process_index: int, process_count: int) -> None:
  """UserError unless 0 <= process_index < process_count."""
  if not 0 <= process_index < process_count:
    raise UserError(f"process_index={process_index} must be in [0, process_count={process_count})")


def document_dataset(data_cfg: sections.Data, *, seed: int, process_index: int = 0,
                     process_count: int = 1) -> grain.MapDataset:
  """One epoch of this process's documents of `data.path` (str, or ids from pre-tokenized shards),
  shuffled; epoch e of `ds[i]` is `ds[i + e * len]`. A mixture has no epoch: `Layout.mixed_fetch`."""
  check_process(process_index, process_count)
  if data_cfg.get("mixture"):  # A partial data config (path and format keys only) has no mixture key.
    raise UserError("document_dataset reads one source (data.path); a data.mixture stream is read through "
                    "make_iterator, or give each source's config (mixture.source_configs)")
  return _shard(sources.document_source(data_cfg, process_index, process_count), data_cfg, seed, process_index,
                process_count)


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
    return self._parent[self._perm(index)]

  def _getitems(self, indices):
    return self._parent._getitems([self._perm(i) for i in indices])  # pylint: disable=protected-access

  def _perm(self, index: int) -> int:
    n = len(self._parent)
    epoch, i = divmod(index, n)
    if self._perm_epoch is None or self._perm_epoch[0] != epoch:
      self._perm_epoch = (epoch, _permutation(self._seed, epoch, n))
    return int(self._perm_epoch[1][i]) + epoch * n


SMALL_SHUFFLE_MAX = 1 << 16


def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  """`_SmallShuffle`'s order of epoch `epoch`."""
  return np.random.default_rng([seed, epoch]).permutation(n)


class _Order:
  """Which source document each stream index reads: a per-epoch shuffle, then (sources read whole)
  this process's stride, repeated; `dataset()` is the same order as a Grain MapDataset.

  Sources read whole (builtin, ArrayRecord) are shuffled before striding, so every process sees
  a uniform sample; per-host sources (data/splits.py) shuffle this process's share. Both shuffles
  draw a fresh permutation for each epoch (index // len) once the dataset is repeated.
  """
  def __init__(self, source: sources.DocumentSource, data_cfg: sections.Data, seed: int, process_index: int,
               process_count: int):
    self.source, self._n = source, len(source)
    self._seed = _combine_seeds(data_cfg.shuffle_seed, seed)
    self._small = self._n <= SMALL_SHUFFLE_MAX
    # Otherwise the source already holds only this process's share.
    self._stride = (process_index, process_count) if not source.per_process else (0, 1)
    self.length = len(range(self._stride[0], self._n, self._stride[1]))
    if self.length == 0:
      raise UserError(f"data.path={data_cfg.path!r} has fewer documents than the {process_count} "
                      "processes reading it: add data or use text_unit='line'")
    self._perms: dict[int, np.ndarray] = {}

  def dataset(self) -> grain.MapDataset:
    """One epoch of the order (element `i + e * length` is epoch e's i-th element once repeated)."""
    ds = grain.MapDataset.source(self.source)
    ds = _SmallShuffle(ds, self._seed) if self._small else ds.shuffle(seed=self._seed)
    return ds if self._stride == (0, 1) else ds[self._stride[0]::self._stride[1]]

  def source_indices(self, indices: Sequence[int]) -> np.ndarray:
    """The source index that `dataset().repeat(None)[i]` reads, for each i in `indices` (vectorised)."""
    epoch_K, offset_K = np.divmod(np.asarray(indices, np.int64), self.length)
    epoch_K, in_epoch_K = np.divmod(self._stride[0] + offset_K * self._stride[1] + epoch_K * self._n, self._n)
    if not self._small:  # Grain's shuffle: one index_shuffle call per element, as Grain makes them.
      shuffle = grain.experimental.index_shuffle
      return np.fromiter((shuffle(i, max_index=self._n - 1, seed=(self._seed + e) % 2 ** 32, rounds=4)
                          for i, e in zip(in_epoch_K.tolist(), epoch_K.tolist())), np.int64, len(in_epoch_K))
    out_K = np.empty_like(in_epoch_K)
    for epoch in np.unique(epoch_K).tolist():
      if epoch not in self._perms:  # Keeps this epoch's permutation and the one before.
        kept = {e: p for e, p in self._perms.items() if e == epoch - 1}
        self._perms = {**kept, epoch: _permutation(self._seed, epoch, self._n)}
      where = epoch_K == epoch
      out_K[where] = self._perms[epoch][in_epoch_K[where]]
    return out_K


def _shard(source: sources.DocumentSource, data_cfg: sections.Data, seed: int, process_index: int,
           process_count: int) -> grain.MapDataset:
  return _Order(source, data_cfg, seed, process_index, process_count).dataset()


def ordered(source: Any, data_cfg: sections.Data, *, seed: int, process_index: int = 0,
            process_count: int = 1) -> grain.MapDataset:
  """One epoch of `source` (a sequence with `per_process`: whether it holds only this process's share) in
  the pipeline's order: shuffled anew each epoch (data.shuffle_seed, `seed`), this process's stride."""
  check_process(process_index, process_count)
  return _shard(source, data_cfg, seed, process_index, process_count)


def packing_bins(batch_size: int) -> int:
  """Rows packed at once for a per-process batch size (training/resume.py compares these)."""
  return max(batch_size, MIN_PACKING_BINS)


def _check_tokenizer(source: sources.DocumentSource, data_cfg: sections.Data,
                     tokenizer: tokenizer_lib.Tokenizer) -> None:
  """Pre-tokenized shards train only with the tokenizer that wrote them."""
  made = source.tokenizer
  if made is not None and made["sha256"] != shards.sha256(tokenizer.content):
    raise UserError(
        f"data.path={data_cfg.path} was tokenized with {made.get('source', '?')} (sha256 {made['sha256'][:12]}, "
        f"{made['vocab_size']} pieces), but data.tokenizer={tokenizer.source} differs (sha256 "
        f"{shards.sha256(tokenizer.content)[:12]}, {tokenizer.vocab_size} pieces): train with the "
        "shards' tokenizer, or re-run prepare with --tokenizer=" + str(tokenizer.source))


class Layout:
  """Everything that fixes one process's stream: its documents, their order and their packing.

  `documents()` is the process's share, tokenized and repeated: element i is document i % n of
  epoch i // n (n = `epoch_length()`), each epoch in a new order. `rows()` packs it: the stream of packed
  rows that `make_dataset` batches. `pack` packs any other documents the same way (data/elastic.py).
  """
  def __init__(self, data_cfg: sections.Data, tokenizer: tokenizer_lib.Tokenizer, *, bins: int, seed: int,
               process_index: int, process_count: int):
    if data_cfg.seq_len < 4:
      raise UserError(f"data.seq_len must be >= 4, got {data_cfg.seq_len}")
    check_process(process_index, process_count)
    self.data_cfg, self.tokenizer, self.bins, self.seed = data_cfg, tokenizer, bins, seed
    self.process_index, self.process_count = process_index, process_count
    self._documents: grain.MapDataset | None = None
    self._fetch: _Fetch | None = None
    self._epoch_length = 0

  def documents(self) -> grain.MapDataset:
    if self.data_cfg.mixture:  # data/elastic.py's drain needs one source's epochs (run/elastic.py refuses it).
      raise UserError("a data.mixture stream cannot be re-sharded onto another process count")
    if self._documents is None:
      self._documents, self._fetch, self._epoch_length = self._source(self.data_cfg, self.seed)
    return self._documents

  def _source(self, data_cfg: sections.Data, seed: int) -> tuple[grain.MapDataset, _Fetch, int]:
    """(the repeated, tokenized documents, their batched fetch, one epoch's length) of one source."""
    source = sources.document_source(data_cfg, self.process_index, self.process_count)
    _check_tokenizer(source, data_cfg, self.tokenizer)
    order = _Order(source, data_cfg, seed, self.process_index, self.process_count)
    ds = order.dataset().repeat(None)
    pretokenized = source.tokenizer is not None
    fetch = _Fetch(order, None if pretokenized else self.tokenizer)
    return (ds if pretokenized else ds.map(_Tokenize(self.tokenizer))), fetch, order.length

  def mixed_fetch(self) -> mixture.MixedFetch:
    """The documents of `data.mixture`'s sources, mixed by weight (data/mixture.py)."""
    if self._fetch is None:
      fetches = []
      for k, (cfg, name) in enumerate(zip(mixture.source_configs(self.data_cfg), mixture.names(self.data_cfg))):
        try:
          fetches.append(self._source(cfg, self.seed if k == 0 else _combine_seeds(self.seed, k))[1])
        except UserError as e:
          named = str(e).replace("data.path / --input",
                                 f"data.mixture[{k}].path").replace("(data.path, data.mixture, or --input)",
                                                                    f"(data.mixture[{k}].path)")
          raise UserError(f"data.mixture[{k}] ({name}): {named}") from None
      selection = mixture.Selection([src["weight"] for src in self.data_cfg.mixture],
                                    _combine_seeds(self.data_cfg.shuffle_seed, self.seed, _MIXTURE_SALT))
      self._fetch = mixture.MixedFetch(fetches, selection)
    return self._fetch

  def epoch_length(self) -> int:
    """Documents in one epoch of this process's share."""
    self.documents()
    return self._epoch_length

  def pack(self, fetch: packing.Fetch, length: int | None, *salt: int) -> grain.IterDataset:
    """Documents `fetch(indices)` (token ids, or (ids, first chunk)) -> packed rows (module doc)."""
    return packing.PackDataset(fetch, length, seq_len=self.data_cfg.seq_len, bins=self.bins,
                               seed=_combine_seeds(self.data_cfg.shuffle_seed, self.seed, self.process_index,
                                                   *salt), specials=self.tokenizer.special_ids)

  def under(self, *, bins: int, process_index: int, process_count: int) -> "Layout":
    """The same data and seed under another process layout (an earlier run's)."""
    return Layout(self.data_cfg, self.tokenizer, bins=bins, seed=self.seed, process_index=process_index,
                  process_count=process_count)

  def rows(self) -> grain.IterDataset:
    self.documents()
    return self.pack(self._fetch, None)


def make_dataset(data_cfg: sections.Data, tokenizer: tokenizer_lib.Tokenizer, *, batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """The infinite training stream of this process: dicts of int32 [B, L] arrays (see module doc).

  Its iterator's state is the packer's; after a change of process count the trainer sets a
  re-shard state instead (`data.elastic.reshard_state`), and the stream first drains the old
  layout's unread documents.
  """
  if batch_size < 1:
    raise UserError(f"per-process batch size must be >= 1, got {batch_size}")
  layout = Layout(data_cfg, tokenizer, bins=packing_bins(batch_size), seed=seed, process_index=process_index,
                  process_count=process_count)
  if data_cfg.mixture:  # No elastic re-shard (run/elastic.py refuses it): the rows, counted per source.
    fetch = layout.mixed_fetch()
    rows = mixture.CountedRows(layout.pack(fetch, None), fetch, mixture.names(data_cfg), data_cfg.seq_len)
  else:
    rows = elastic.ElasticRows(layout)
  it_ds = packing.BatchRows(rows, batch_size)
  if data_cfg.worker_count > 0:
    it_ds = it_ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=data_cfg.worker_count,
                                     per_worker_buffer_size=data_cfg.worker_buffer_size),
        worker_init_fn=workers.exit_with_parent)
  return it_ds


def make_iterator(data_cfg: sections.Data, tokenizer: tokenizer_lib.Tokenizer, *, batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.DatasetIterator:
  """`iter(make_dataset(...))`: a checkpointable iterator (`get_state` / `set_state`)."""
  return iter(
      make_dataset(data_cfg, tokenizer, batch_size=batch_size, seed=seed, process_index=process_index,
                   process_count=process_count))


def check_paths(data_cfg: sections.Data) -> None:
  """UserError naming `data_cfg`'s path (or mixture source) that names no files; reads no file.

  For the data of a later phase, checked before the run starts rather than when the phase does.
  """
  named = ([(f"data.mixture[{k}].path ({name})", cfg.path)
            for k, (cfg, name) in enumerate(zip(mixture.source_configs(data_cfg), mixture.names(data_cfg)))]
           if data_cfg.mixture else [("data.path", data_cfg.path)])
  for key, spec in named:
    if spec != "builtin":
      sources.resolve_paths(spec, key)

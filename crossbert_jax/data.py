"""Grain input pipeline: documents -> shuffled, sharded, tokenized, packed int32 batches.

  source -> seeded shuffle (new order each epoch, repeats forever) -> per-process shard
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

from collections.abc import Iterator, Sequence
import json
import os
from typing import Any

from etils import epath
import grain
import ml_collections
import numpy as np

from crossbert_jax import tokenizer as tokenizer_lib
from crossbert_jax.errors import UserError

FORMATS = ("text", "jsonl", "parquet", "arrayrecord")
_EXTENSIONS = {
    "": "text", ".txt": "text", ".text": "text", ".tokens": "text",
    ".jsonl": "jsonl", ".json": "jsonl",
    ".parquet": "parquet",
    ".arrayrecord": "arrayrecord", ".array_record": "arrayrecord",
}
_GLOB_CHARS = "*?["
# First-fit packing keeps this many rows open (at least the batch size): more bins, less
# padding, at the cost of packing (and re-packing after a restore) that many rows at once.
MIN_PACKING_BINS = 64
# Reading in-memory documents: prefetch threads cost more than they save (2.5x slower on 2
# cores). ArrayRecord reads block on I/O, so those get threads.
_IN_MEMORY_READ = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
_IO_READ = grain.ReadOptions(num_threads=8, prefetch_buffer_size=256)


# ----------------------------------------------------------------------------- paths


def resolve_paths(spec: str) -> list[epath.Path]:
  """Files named by `spec`: files, directories (recursive), globs, comma-separated."""
  out: list[epath.Path] = []
  seen: set[str] = set()
  for entry in (e.strip() for e in spec.split(",")):
    if not entry:
      continue
    if any(c in entry for c in _GLOB_CHARS):
      cut = min(entry.find(c) for c in _GLOB_CHARS if c in entry)
      slash = entry.rfind("/", 0, cut)
      base, pattern = (entry[:slash] or "/", entry[slash + 1:]) if slash >= 0 else (".", entry)
      matches = sorted(epath.Path(base).glob(pattern)) if epath.Path(base).is_dir() else []
      files = []
      for m in matches:
        files.extend(_files_under(m) if m.is_dir() else [m])
    else:
      path = epath.Path(entry)
      if path.is_dir():
        files = _files_under(path)
      elif path.is_file():
        files = [path]
      else:
        raise UserError(f"data path {entry!r} does not exist: fix data.path / --input "
                        "(a file, directory, glob or comma-separated list)")
    if not files:
      raise UserError(f"data path {entry!r} matches no files: fix data.path / --input "
                      "(a file, directory, glob or comma-separated list)")
    for f in files:
      if str(f) not in seen:
        seen.add(str(f))
        out.append(f)
  if not out:
    raise UserError(f"data.path={spec!r} names no files: set it to 'builtin' or to files")
  return out


def _files_under(root: epath.Path) -> list[epath.Path]:
  """Non-hidden files below `root`, recursive, sorted."""
  # Explicit recursion: epath refuses `**` globs (they can mean thousands of GCS calls).
  files = []
  for p in sorted(root.iterdir()):
    if p.name.startswith("."):
      continue
    if p.is_dir():
      files.extend(_files_under(p))
    elif p.is_file():
      files.append(p)
  return files


def file_format(path: epath.Path, fmt: str = "auto") -> str:
  """The reader for `path`: `fmt` unless "auto", else by extension."""
  if fmt != "auto":
    if fmt not in FORMATS:
      raise UserError(f"data.format={fmt!r}: use auto, {', '.join(FORMATS)}")
    return fmt
  name = path.name
  ext = os.path.splitext(name)[1].lower()
  if ext not in _EXTENSIONS:
    raise UserError(f"{path}: unknown extension {ext!r}; set data.format to one of {FORMATS} "
                    f"or rename it ({', '.join(e for e in _EXTENSIONS if e)})")
  return _EXTENSIONS[ext]


# ----------------------------------------------------------------------------- readers


def _decode(raw: bytes, where: str) -> str:
  try:
    return raw.decode("utf-8").lstrip("\ufeff")
  except UnicodeDecodeError as e:
    raise UserError(f"{where}: not UTF-8 (bad byte at offset {e.start}); convert it to UTF-8, "
                    "e.g. `iconv -f latin1 -t utf-8`") from None


def _no_documents(path: epath.Path) -> UserError:
  return UserError(f"{path}: holds no documents (empty or blank); remove it from data.path")


def read_text(path: epath.Path, text_unit: str) -> list[str]:
  """Documents of a plain-text file: one per line, per blank-line paragraph, or the file."""
  text = _decode(path.read_bytes(), str(path))
  if text_unit == "file":
    docs = [text.strip()]
  elif text_unit == "line":
    docs = [line.strip() for line in text.splitlines()]
  elif text_unit == "paragraph":
    docs, cur = [], []
    for line in text.splitlines():
      if line.strip():  # Whitespace-only lines separate paragraphs too.
        cur.append(line.strip())
      elif cur:
        docs.append("\n".join(cur))
        cur = []
    docs.append("\n".join(cur))
  else:
    raise UserError(f"data.text_unit={text_unit!r}: use line, paragraph or file")
  docs = [d for d in docs if d]
  if not docs:
    raise _no_documents(path)
  return docs


def _field(record: Any, field: str, where: str) -> str:
  if not isinstance(record, dict) or field not in record:
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise UserError(f"{where}: no field {field!r} (has {keys}); set data.text_field")
  value = record[field]
  if not isinstance(value, str):
    raise UserError(f"{where}: field {field!r} is {type(value).__name__}, not text; "
                    "set data.text_field to a string field")
  return value


def read_jsonl(path: epath.Path, text_field: str) -> list[str]:
  """Documents of a JSON-lines file: the `text_field` of each object."""
  text = _decode(path.read_bytes(), str(path))
  docs = []
  for lineno, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise UserError(f"{path}:{lineno}: not JSON ({e.msg}); write one JSON object per line") from None
    docs.append(_field(record, text_field, f"{path}:{lineno}").strip())
  docs = [d for d in docs if d]
  if not docs:
    raise _no_documents(path)
  return docs


def read_parquet(path: epath.Path, text_field: str) -> list[str]:
  """Documents of a Parquet file: the `text_field` column."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  (heavy, rarely needed)

  try:
    with path.open("rb") as f:
      pf = pq.ParquetFile(f)
      names = pf.schema_arrow.names
      if text_field not in names:
        raise UserError(f"{path}: no column {text_field!r} (has {names}); set data.text_field")
      column = pf.read(columns=[text_field]).column(0)
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (pyarrow raises many types)
    raise UserError(f"{path}: unreadable Parquet ({type(e).__name__}: {str(e)[:200]}); "
                    "check the file or set data.format") from None
  docs = [d.strip() for d in column.to_pylist() if isinstance(d, str)]
  docs = [d for d in docs if d]
  if not docs:
    raise _no_documents(path)
  return docs


def _decode_record(raw: bytes, text_field: str, where: str) -> str:
  """An ArrayRecord record: a JSON object holding `text_field`, else raw UTF-8 text."""
  if raw[:1] == b"{":
    try:
      record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
      record = None
    if isinstance(record, dict):
      return _field(record, text_field, where)
  return _decode(raw, where)


class _ArrayRecordDocuments:
  """Random access to the documents of ArrayRecord files, read on demand (not in memory)."""

  def __init__(self, paths: Sequence[epath.Path], text_field: str):
    self._paths = [str(p) for p in paths]
    self._text_field = text_field
    try:
      self._source = grain.sources.ArrayRecordDataSource(self._paths)
    except Exception as e:  # pylint: disable=broad-except
      raise UserError(f"{', '.join(self._paths)}: unreadable ArrayRecord ({str(e)[:200]}); "
                      "check the files or set data.format") from None
    if len(self._source) == 0:
      raise _no_documents(epath.Path(self._paths[0]))
    self[0]  # Fails early on a missing field.  pylint: disable=pointless-statement

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> str:
    return _decode_record(self._source[index], self._text_field,
                          f"ArrayRecord record {index} of {self._paths}")


class DocumentSource(grain.sources.RandomAccessDataSource):
  """Random-access documents (str) from all files of a spec, in file order."""

  def __init__(self, parts: Sequence[Sequence[str]]):
    self._parts = list(parts)
    self._ends = np.cumsum([len(p) for p in self._parts])
    self.reads_files = any(isinstance(p, _ArrayRecordDocuments) for p in self._parts)

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def __getitem__(self, index: int) -> str:
    part = int(np.searchsorted(self._ends, index, side="right"))
    start = int(self._ends[part - 1]) if part else 0
    return self._parts[part][index - start]


def _file_parts(spec: str, fmt: str, text_field: str, text_unit: str) -> list[Sequence[str]]:
  """One sequence of documents per reader: per text/jsonl/parquet file, one for ArrayRecords."""
  parts: list[Sequence[str]] = []
  array_records: list[epath.Path] = []
  for path in resolve_paths(spec):
    kind = file_format(path, fmt)
    if kind == "text":
      parts.append(read_text(path, text_unit))
    elif kind == "jsonl":
      parts.append(read_jsonl(path, text_field))
    elif kind == "parquet":
      parts.append(read_parquet(path, text_field))
    else:
      array_records.append(path)
  if array_records:
    parts.append(_ArrayRecordDocuments(array_records, text_field))
  return parts


def document_source(data_cfg: ml_collections.ConfigDict) -> DocumentSource:
  """All documents of `data_cfg.path` ("builtin" or files) as a random-access source."""
  if data_cfg.path == "builtin":
    from crossbert_jax import corpus  # pylint: disable=g-import-not-at-top

    return DocumentSource([corpus.builtin_documents()])
  return DocumentSource(_file_parts(data_cfg.path, data_cfg.format, data_cfg.text_field,
                                    data_cfg.text_unit))


def iter_documents(spec: str, *, fmt: str = "auto", text_field: str = "text",
                   text_unit: str = "paragraph") -> Iterator[str]:
  """Documents of `spec` ("builtin" or files) in order; the tokenizer CLI trains on these."""
  if spec == "builtin":
    from crossbert_jax import corpus  # pylint: disable=g-import-not-at-top

    yield from corpus.builtin_documents()
    return
  for part in _file_parts(spec, fmt, text_field, text_unit):
    for i in range(len(part)):
      yield part[i]


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

  def _load(self, ids_N: np.ndarray) -> None:
    if len(ids_N):
      doc_N = np.concatenate([[tokenizer_lib.CLS_ID], ids_N, [tokenizer_lib.SEP_ID]]).astype(np.int32)
      self._chunks = [doc_N[i:i + self._seq_len] for i in range(0, len(doc_N), self._seq_len)]
    else:
      self._chunks = []
    self._next_chunk = 0

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


def _rename(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {"tokens": row["tokens"].astype(np.int32),
          "segment_ids": row["tokens_segment_ids"].astype(np.int32),
          "positions": row["tokens_positions"].astype(np.int32)}


def document_dataset(data_cfg: ml_collections.ConfigDict, *, seed: int, process_index: int = 0,
                     process_count: int = 1) -> grain.MapDataset:
  """One epoch of this process's documents (str), shuffled; epoch e of `ds[i]` is `ds[i + e * len]`."""
  return _shard(document_source(data_cfg), data_cfg, seed, process_index, process_count)


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


def _shard(source: DocumentSource, data_cfg: ml_collections.ConfigDict, seed: int,
           process_index: int, process_count: int) -> grain.MapDataset:
  if not 0 <= process_index < process_count:
    raise UserError(f"process_index={process_index} must be in [0, process_count={process_count})")
  ds = grain.MapDataset.source(source)
  # Shuffle before sharding so every process sees a uniform sample; both shuffles draw a
  # fresh permutation for each epoch (index // len) once the dataset is repeated.
  shuffle_seed = _combine_seeds(data_cfg.shuffle_seed, seed)
  if len(ds) <= SMALL_SHUFFLE_MAX:
    ds = _SmallShuffle(ds, shuffle_seed)
  else:
    ds = ds.shuffle(seed=shuffle_seed)
  ds = ds[process_index::process_count]
  if len(ds) == 0:
    raise UserError(f"data.path={data_cfg.path!r} has fewer documents than the {process_count} "
                    "processes reading it: add data or use text_unit='line'")
  return ds


def make_dataset(data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *,
                 batch_size: int, seed: int, process_index: int = 0,
                 process_count: int = 1) -> grain.IterDataset:
  """The infinite training stream of this process: dicts of int32 [B, L] arrays (see module doc)."""
  if batch_size < 1:
    raise UserError(f"per-process batch size must be >= 1, got {batch_size}")
  seq_len = data_cfg.seq_len
  if seq_len < 4:
    raise UserError(f"data.seq_len must be >= 4, got {seq_len}")
  source = document_source(data_cfg)
  ds = _shard(source, data_cfg, seed, process_index, process_count)
  read_options = _IO_READ if source.reads_files else _IN_MEMORY_READ
  ds = ds.map(_Tokenize(tokenizer)).repeat(None)
  it_ds = _ChunkDataset(ds.to_iter_dataset(read_options), seq_len)
  it_ds = grain.experimental.FirstFitPackIterDataset(
      it_ds, length_struct={"tokens": seq_len},
      num_packing_bins=max(batch_size, MIN_PACKING_BINS),
      seed=_combine_seeds(data_cfg.shuffle_seed, seed, process_index), shuffle_bins=True)
  it_ds = it_ds.map(_rename).batch(batch_size, drop_remainder=True)
  if data_cfg.worker_count > 0:
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=data_cfg.worker_count, per_worker_buffer_size=data_cfg.worker_buffer_size))
  return it_ds


def make_iterator(data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *,
                  batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> grain.DatasetIterator:
  """`iter(make_dataset(...))`: a checkpointable iterator (`get_state` / `set_state`)."""
  return iter(make_dataset(data_cfg, tokenizer, batch_size=batch_size, seed=seed,
                           process_index=process_index, process_count=process_count))

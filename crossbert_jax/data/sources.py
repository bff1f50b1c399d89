"""Document sources: paths (file, dir, glob, comma list; local or gs://) -> documents.

Formats (core/formats.py): plain text, JSONL and Parquet (read whole or by host part, readers.py),
and ArrayRecord (raw UTF-8 or JSON records, read lazily by index). `document_source` gives a Grain
random-access source for the pipeline; `iter_documents` streams documents (tokenizer training).
"""

from collections.abc import Callable, Iterator, Sequence
import os
from typing import Any

from array_record.python import array_record_module
from etils import epath
import grain
import numpy as np

from crossbert_jax.core import sections
from crossbert_jax.core import formats as formats_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import readers
from crossbert_jax.data import shards
from crossbert_jax.data import splits

_GLOB_CHARS = "*?["

# ----------------------------------------------------------------------------- paths


def resolve_paths(spec: str, key: str = "data.path / --input") -> list[epath.Path]:
  """Files named by `spec`: files, directories (recursive), globs, comma-separated.

  A `spec` that exists as a path is taken whole (names may hold commas); errors name `key` to fix.
  """
  out: list[epath.Path] = []
  seen: set[str] = set()
  # A file or folder whose name holds commas is taken whole; otherwise commas separate entries.
  whole = "," in spec and epath.Path(spec.strip()).exists()
  entries = [spec.strip()] if whole else [e.strip() for e in spec.split(",")]
  split_note = (f" ({spec!r} was split on commas because it is not itself an existing path)"
                if len(entries) > 1 else "")
  for entry in entries:
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
        raise UserError(f"data path {entry!r} does not exist{split_note}: fix {key} "
                        "(a file, directory, glob or comma-separated list)")
    if not files:
      raise UserError(f"data path {entry!r} matches no files: fix {key} "
                      "(a file, directory, glob or comma-separated list)")
    for f in files:
      if str(f) not in seen:
        seen.add(str(f))
        out.append(f)
  if not out:
    raise UserError(f"{key.split(' ')[0]}={spec!r} names no files: name files there")
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
  formats = formats_lib.names()
  if fmt != "auto":
    if fmt not in formats:
      raise UserError(f"data.format={fmt!r}: use auto, {', '.join(formats)}")
    return fmt
  name = path.name
  ext = os.path.splitext(name)[1].lower()
  extensions = {e: name for name, f in formats_lib.FORMAT_TABLE.items() for e in f.extensions}
  if ext not in extensions:
    raise UserError(f"{path}: unknown extension {ext!r}; set data.format (prepare, tokenizer: --format) to one of "
                    f"{formats} or rename it ({', '.join(e for e in extensions if e)})")
  return extensions[ext]


def _gather(ends: np.ndarray, indices: Sequence[int], read: Callable[[int, list[int]], Sequence[Any]]) -> list[Any]:
  """Items at `indices` of parts laid end to end (part p ends at `ends[p]`): one `read(p, keys)` per part."""
  indices_K = np.asarray(indices, np.int64)
  parts_K = np.searchsorted(ends, indices_K, side="right")
  local_K = indices_K - np.concatenate([[0], ends])[parts_K]
  out: list[Any] = [None] * len(indices_K)
  for part in np.unique(parts_K):
    where = np.flatnonzero(parts_K == part)
    for k, v in zip(where.tolist(), read(int(part), local_K[where].tolist())):
      out[k] = v
  return out


class _ArrayRecordDocuments:
  """Random access to the documents of ArrayRecord files, read on demand (not in memory)."""
  def __init__(self, paths: Sequence[epath.Path], text_field: str):
    self._paths, self._text_field = [str(p) for p in paths], text_field
    try:
      self._source = grain.sources.ArrayRecordDataSource(self._paths)
    except Exception as e:  # pylint: disable=broad-except
      raise UserError(f"{', '.join(self._paths)}: unreadable ArrayRecord ({str(e)[:200]}); "
                      "check the files or set data.format (prepare: --format)") from None
    if len(self._source) == 0:
      raise readers.no_documents(epath.Path(self._paths[0]))
    self[0]  # Fails early on a missing field.  pylint: disable=pointless-statement

  def __len__(self) -> int:
    return len(self._source)

  def _decode(self, raw: bytes, index: int) -> Any:
    return readers.decode_record(raw, self._text_field, f"ArrayRecord record {index} of {self._paths}")

  def __getitem__(self, index: int) -> Any:
    return self._decode(self._source[index], index)

  def _read(self, indices: Sequence[int]) -> list[bytes]:
    """Records at `indices`: one read per file, in this thread (Grain's batched read starts threads per call)."""
    if getattr(self, "_readers", None) is None:
      self._readers = [array_record_module.ArrayRecordReader(p, "readahead_buffer_size:0") for p in self._paths]
      self._file_ends = np.cumsum([r.num_records() for r in self._readers])
    return _gather(self._file_ends, indices, lambda f, keys: self._readers[f].read(keys))

  def __getstate__(self) -> dict[str, Any]:  # Readers do not pickle (Grain workers); they reopen lazily.
    return {**self.__dict__, "_readers": None}

  def _getitems(self, indices: Sequence[int]) -> list[Any]:
    return [self._decode(raw, i) for i, raw in zip(indices, self._read(indices))]


class _ArrayRecordTokens(_ArrayRecordDocuments):
  """Random access to the documents of pre-tokenized shards: int32 token ids, without specials."""
  def __init__(self, paths: Sequence[epath.Path], dtype: str):
    self._dtype = np.dtype(dtype)
    super().__init__(paths, "")

  def _decode(self, raw: bytes, index: int) -> np.ndarray:
    return np.frombuffer(raw, self._dtype).astype(np.int32)


class DocumentSource(grain.sources.RandomAccessDataSource):
  """Random-access documents from all files of a spec, in file order: str, or int32 token ids
  when `tokenizer` (the manifest's {sha256, vocab_size, source}) is set."""
  def __init__(self, parts: Sequence[Sequence[str]], per_process: bool = False,
               tokenizer: dict[str, Any] | None = None):
    self._parts = list(parts)
    self._ends = np.cumsum([len(p) for p in self._parts])
    # True: holds only this process's share (splits.py); False: all documents, to be strided.
    self.per_process = per_process
    self.tokenizer = tokenizer

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def __getitem__(self, index: int) -> str:
    part = int(np.searchsorted(self._ends, index, side="right"))
    start = int(self._ends[part - 1]) if part else 0
    return self._parts[part][index - start]

  def read_tokens(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:  # Pre-tokenized: one decode.
    return shards.decode_tokens(self._parts[0]._read(indices), self._parts[0]._dtype)  # pylint: disable=protected-access

  def _getitems(self, indices: Sequence[int]) -> list[Any]:
    """Batched read: one batched call per file part that has one (Grain calls this for `_getitems`)."""
    read = lambda p, keys: (
        self._parts[p]._getitems(keys) if hasattr(self._parts[p], "_getitems")  # pylint: disable=protected-access
        else [self._parts[p][k] for k in keys])
    return _gather(self._ends, indices, read)


def _file_parts(spec: str, fmt: str, text_field: str, text_unit: str, process_index: int = 0,
                process_count: int = 1) -> tuple[list[Sequence[str]], bool]:
  """(one sequence of documents per reader, whether they are only this process's share).

  Text, JSONL and Parquet are read per host (`splits.py`): a process reads only its share. With
  ArrayRecord files (read lazily, by index) every process sees all documents and strides them.
  """
  paths = resolve_paths(spec)
  shards.check_complete(paths)
  paths, tokens = _token_shards(paths, spec)
  if tokens is not None:
    return [tokens], False
  kinds = [file_format(p, fmt) for p in paths]
  per_process = process_count > 1 and all(formats_lib.FORMAT_TABLE[k].reader is not None for k in kinds)
  if per_process:
    splittable = [formats_lib.FORMAT_TABLE[k].splittable and (k != "text" or text_unit != "file") for k in kinds]
    shares = splits.host_parts(paths, process_index, process_count, splittable)
  else:
    shares = [splits.Part(p) for p in paths]
  parts: list[Sequence[str]] = []
  array_records: list[epath.Path] = []
  for share in shares:
    read = formats_lib.reader(file_format(share.path, fmt))
    if read is None:
      array_records.append(share.path)
    else:
      parts.append(read(share.path, text_field, text_unit, share))
  if array_records:
    parts.append(_ArrayRecordDocuments(array_records, text_field))
  return [p for p in parts if len(p)], per_process


def _token_shards(paths: list[epath.Path], spec: str) -> tuple[list[epath.Path], "_ArrayRecordTokens | None"]:
  """(the paths, None), or ([], the documents) when they are pre-tokenized shards and their manifests."""
  token_files = [p for p in paths if (shards.parse_name(p.name) or ("",))[0] == shards.TOKENS]
  if not token_files:
    return paths, None
  folders = sorted({str(p.parent) for p in token_files})
  manifests = [shards.read_manifest(epath.Path(f)) for f in folders]
  rest = [p for p in paths if p not in token_files and not (p.name == shards.MANIFEST and str(p.parent) in folders)]
  if rest:
    raise UserError(f"data.path={spec!r} mixes pre-tokenized shards ({folders[0]}) with other files ({rest[0]}): "
                    "train on one kind")
  if len({(m["tokenizer"]["sha256"], m["dtype"]) for m in manifests}) > 1:
    raise UserError(f"data.path={spec!r}: the shard sets {folders} were tokenized by different tokenizers: "
                    "use sets from one tokenizer")
  source = _ArrayRecordTokens(token_files, manifests[0]["dtype"])
  source.tokenizer = manifests[0]["tokenizer"]
  return [], source


def document_source(data_cfg: sections.Data, process_index: int = 0, process_count: int = 1) -> DocumentSource:
  """The documents of `data_cfg.path` ("builtin" or files) for this process, random access.

  `per_process` on the result says whether it holds only this process's share (text, JSONL,
  Parquet) or everything (builtin, ArrayRecord), which the pipeline then strides.
  """
  if data_cfg.path == "builtin":
    from crossbert_jax.data import corpus  # pylint: disable=g-import-not-at-top

    return DocumentSource([corpus.builtin_documents()])
  parts, per_process = _file_parts(data_cfg.path, data_cfg.format, data_cfg.text_field, data_cfg.text_unit,
                                   process_index, process_count)
  return DocumentSource(parts, per_process, getattr(parts[0], "tokenizer", None) if parts else None)


def iter_documents(spec: str, *, fmt: str = "auto", text_field: str = "text",
                   text_unit: str = "paragraph") -> Iterator[str]:
  """Documents of `spec` ("builtin" or files) in order; the tokenizer CLI trains on these."""
  if spec == "builtin":
    from crossbert_jax.data import corpus  # pylint: disable=g-import-not-at-top

    yield from corpus.builtin_documents()
    return
  for part in _file_parts(spec, fmt, text_field, text_unit)[0]:
    if isinstance(part, _ArrayRecordTokens):
      raise UserError(f"{spec} holds token ids (pre-tokenized shards), not text: give the text they were made from")
    for i in range(len(part)):
      yield part[i]

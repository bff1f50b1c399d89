"""Corpus -> N ArrayRecord shards, the recommended format on a pod (read lazily, by index).

Shard k of N holds the documents that process k of N would read with per-host reads
(`data/splits.py`): whole files when there are at least N, else part k of every file. Without a
tokenizer each record is one document as JSON, {"text": ...} (OUTPUT/corpus-0000k-of-0000N.arrayrecord);
with one, the document's token ids (OUTPUT/tokens-..., plus manifest.json; see data/shards.py),
which `train` reads without tokenizing. Shards are written in parallel worker processes (which
exit with this one), each to a staging file that is then moved (or, for gs://, copied) into
place: a shard appears complete or not at all.

A run records its inputs and flags in OUTPUT/.prepare.json (marked finished at the end), so a
stopped or killed run is resumed by the same command (finished shards kept, the missing ones
written), the same command on a finished set only says so, and another command is refused; a
run that fails on a bad input removes what it wrote.
"""

import concurrent.futures
import json
import multiprocessing
import os
import signal
import tempfile
import threading
import uuid
from typing import Any

import numpy as np
import tqdm
from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, one_line
from crossbert_jax.data import shards as shards_lib
from crossbert_jax.data import sources
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.data import workers as workers_lib

# One record per ArrayRecord chunk: random access reads one document, and Grain does not warn
# (it asks for group_size:1 on every shard it opens otherwise). Measured (20k records of 5-200
# uint16 ids, random reads of 256 at a time, 2 loaded cores): group_size:64 57 us per record,
# group_size:1 13 us, uncompressed 9 us. Token ids do not compress per record (the file grows),
# so token shards are written uncompressed.
WRITER_OPTIONS = {"corpus": "group_size:1", "tokens": "group_size:1,uncompressed"}
MARKER = ".prepare.json"
_ENCODE_BATCH = 512  # Documents per SentencePiece batched encode.


class Stopped(Exception):
  """prepare was stopped by SIGTERM/SIGINT; the same command resumes it."""


def shard_name(index: int, count: int, kind: str = shards_lib.TEXT) -> str:
  return shards_lib.shard_name(kind, index, count)


def _records(spec: str, index: int, count: int, fmt: str, text_field: str, text_unit: str,
             tokenizer_proto: bytes | None):
  """(record bytes, tokens) of shard `index`'s documents: JSON text, or token ids."""
  parts, _ = sources._file_parts(spec, fmt, text_field, text_unit, index, count)  # pylint: disable=protected-access
  docs = (part[i] for part in parts for i in range(len(part)))
  if tokenizer_proto is None:
    for doc in docs:
      yield json.dumps({"text": doc}, ensure_ascii=False).encode("utf-8"), 0
    return
  tok = tokenizer_lib.from_content(tokenizer_proto)
  dtype = shards_lib.token_dtype(tok.vocab_size)
  batch = []
  for doc in [*docs, None]:
    if doc is not None:
      batch.append(doc)
    if batch and (doc is None or len(batch) == _ENCODE_BATCH):
      for ids in _encode(tok, batch, index):
        yield np.asarray(ids, dtype).tobytes(), len(ids)
      batch = []


def _encode(tok: tokenizer_lib.AnyTokenizer, batch: list[str], index: int) -> list[list[int]]:
  """The ids of `batch`; a tokenizer that fails on them is a bad input (the set is removed), not a crash."""
  try:
    return tok.encode_batch(batch)
  except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception.
    raise UserError(f"--tokenizer could not encode a document of shard {index} ({one_line(e)}): give a "
                    "tokenizer that encodes any text (with an unknown token)") from None


def write_shard(spec: str, output: str, index: int, count: int, fmt: str, text_field: str, text_unit: str,
                tokenizer_proto: bytes | None = None) -> tuple[int, int]:
  """Writes shard `index` of `count` to `output`; returns its (documents, tokens)."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  kind = shards_lib.TEXT if tokenizer_proto is None else shards_lib.TOKENS
  final = epath.Path(output) / shard_name(index, count, kind)
  local_dir = output if "://" not in output else tempfile.mkdtemp(prefix="crossbert-prepare-")
  staging = os.path.join(local_dir, f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
  writer = array_record_module.ArrayRecordWriter(staging, WRITER_OPTIONS[kind])
  n = tokens = 0
  try:
    for record, length in _records(spec, index, count, fmt, text_field, text_unit, tokenizer_proto):
      writer.write(record)
      n, tokens = n + 1, tokens + length
    writer.close()
    if "://" in output:
      epath.Path(staging).copy(final, overwrite=True)
    else:
      os.replace(staging, final)
  finally:
    if os.path.exists(staging):
      os.remove(staging)
    if local_dir != output:
      os.rmdir(local_dir)
  return n, tokens


def _shard_stats(path: epath.Path, itemsize: int) -> tuple[int, int]:
  """(documents, tokens) of a finished shard (read back when a resumed run did not write it)."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  reader = array_record_module.ArrayRecordReader(str(path))
  try:
    n = reader.num_records()
    return n, (sum(len(r) for r in reader.read(range(n))) // itemsize if itemsize else 0)
  finally:
    reader.close()


def _roots(spec: str) -> list[str]:
  """The paths a --input spec names before globbing (as `sources.resolve_paths` splits it)."""
  whole = "," in spec and epath.Path(spec.strip()).exists()
  out = []
  for entry in [spec.strip()] if whole else [e.strip() for e in spec.split(",")]:
    cut = min([entry.find(c) for c in "*?[" if c in entry] or [len(entry)])
    out.append(entry[:cut].rsplit("/", 1)[0] if cut < len(entry) else entry)
  return [e for e in out if e]


def _absolute(path: str) -> str:
  return path.rstrip("/") if "://" in path else os.path.realpath(path)


def _inside(path: str, folder: str) -> bool:
  return path == folder or path.startswith(folder.rstrip("/") + "/")


def _check_output(spec: str, files: list[epath.Path], output: str) -> None:
  out = _absolute(output)
  for root in _roots(spec):
    if _inside(out, _absolute(root)):
      raise UserError(f"--output {output} is inside --input {root}: the shards would be read back as input; "
                      "choose an --output outside the input")
  for f in files:
    if _inside(_absolute(str(f)), out):
      raise UserError(f"--input file {f} is inside --output {output}: choose an --output outside the input")
  if epath.Path(output).exists() and not epath.Path(output).is_dir():
    raise UserError(f"--output {output} is an existing file: give a folder (new, or one a stopped prepare left)")
  # A file on the way (FILE/sub) or a read-only disk: one line, before any work.
  outputs.check_folder_path(output, "--output", writes_inside=True)


def _identity(spec: str, files: list[epath.Path], shards: int, fmt: str, text_field: str, text_unit: str,
              tokenizer: tokenizer_lib.Tokenizer | None) -> dict[str, Any]:
  """What a resumed run must share with the run that started the folder."""
  return {
      "input": spec, "files": [[str(f), f.stat().length] for f in files], "shards": shards, "format": fmt,
      "text_field": text_field, "text_unit": text_unit,
      "tokenizer_sha256": shards_lib.sha256(tokenizer.content) if tokenizer else None}


def _start(out: epath.Path, identity: dict[str, Any], kind: str, shards: int) -> tuple[list[int], bool]:
  """Creates or resumes the folder: (the shard indices still to write, whether this prepare had finished)."""
  marker = out / MARKER
  existing = sorted(p.name for p in out.glob("*-of-*.arrayrecord")) if out.exists() else []
  if not marker.exists():
    if existing:
      raise UserError(f"--output {out} already holds {len(existing)} shards ({existing[0]}, ...): choose a new folder")
    out.mkdir(parents=True, exist_ok=True)
    _write_marker(out, identity)
    return list(range(shards)), False
  try:
    old = json.loads(marker.read_text())
  except ValueError:
    raise UserError(f"{marker}: damaged; remove --output {out} and rerun") from None
  differs = sorted(k for k in identity if old.get(k) != identity[k])
  if differs and old.get("finished"):
    raise UserError(f"--output {out} holds a finished prepare of other inputs or flags ({', '.join(differs)} "
                    "differ): choose a new folder")
  if differs:
    raise UserError(f"--output {out} holds a stopped prepare of other inputs or flags ({', '.join(differs)} differ): "
                    "rerun that command to finish it, or choose a new folder")
  for p in out.glob(".*.tmp-*"):  # Staging files of workers that were killed.
    p.unlink()
  have = {shards_lib.parse_name(n)[1] for n in existing if shards_lib.parse_name(n)[:1] == (kind,)}
  return [k for k in range(shards) if k not in have], bool(old.get("finished"))


def _write_marker(out: epath.Path, record: dict[str, Any]) -> None:
  """Writes OUTPUT/.prepare.json whole or not at all (a staging file, then a move)."""
  staging = out / f".{MARKER}.tmp-{os.getpid()}"
  staging.write_text(json.dumps(record))
  staging.replace(out / MARKER)


def finished(output: str) -> bool:
  """Whether `output` holds a shard set that a prepare finished (its rerun writes nothing)."""
  marker = epath.Path(output) / MARKER
  try:
    return bool(json.loads(marker.read_text()).get("finished"))
  except (OSError, ValueError, AttributeError):
    return False


def _remove_set(out: epath.Path, kind: str, shards: int, created: bool) -> None:
  """Removes the shards, staging files and marker of this set (after a bad input), and the folder
  when this prepare created it and it is now empty."""
  for k in range(shards):
    (out / shard_name(k, shards, kind)).unlink(missing_ok=True)
  for p in [*out.glob(".*.tmp-*"), out / MARKER]:
    p.unlink(missing_ok=True)
  if created and "://" not in str(out) and out.is_dir() and not any(out.iterdir()):
    out.rmdir()


def _raise_stopped(signum, unused_frame):
  raise Stopped(signal.Signals(signum).name)


def prepare(spec: str, output: str, shards: int, *, fmt: str = "auto", text_field: str = "text",
            text_unit: str = "paragraph", workers: int = 0, progress: bool = True,
            tokenizer: tokenizer_lib.Tokenizer | None = None) -> list[int]:
  """Writes (or finishes) `shards` ArrayRecord files in `output` in parallel; returns documents per shard.

  With `tokenizer`, the shards hold token ids (and manifest.json). Raises `Stopped` on SIGTERM/SIGINT.
  """
  if shards < 1:
    raise UserError(f"--shards={shards}: must be >= 1")
  if workers < 0:
    raise UserError(f"--workers={workers}: must be >= 0 (0: one per CPU, at most --shards)")
  if spec == "builtin":
    raise UserError("--input=builtin is in the package already; prepare your own files")
  files = sources.resolve_paths(spec, "--input")  # Fails early, in this process, on a bad --input.
  if any((shards_lib.parse_name(f.name) or ("",))[0] == shards_lib.TOKENS for f in files):
    raise UserError(f"--input {spec} holds token ids (pre-tokenized shards), not text: give the text they came from")
  _check_output(spec, files, output)
  out = epath.Path(output)
  kind = shards_lib.TEXT if tokenizer is None else shards_lib.TOKENS
  identity = _identity(spec, files, shards, fmt, text_field, text_unit, tokenizer)
  created = not out.exists()
  todo, done = _start(out, identity, kind, shards)
  proto = tokenizer.content if tokenizer is not None else None
  stats = [(0, 0)] * shards
  itemsize = shards_lib.token_dtype(tokenizer.vocab_size).itemsize if tokenizer else 0
  for k in sorted(set(range(shards)) - set(todo)):
    stats[k] = _shard_stats(out / shard_name(k, shards, kind), itemsize)
  if not todo and done:  # The same command again on a finished set: nothing to write.
    return [n for n, _ in stats]
  bar = tqdm.tqdm(total=shards, initial=shards - len(todo), unit="shard", disable=not progress, dynamic_ncols=True)
  main_thread = threading.current_thread() is threading.main_thread()  # Only it may set signal handlers.
  handlers = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGTERM, signal.SIGINT)} if main_thread else {}
  # Spawned workers: no fork of a parent that may hold threads (grain, tqdm).
  pool = concurrent.futures.ProcessPoolExecutor(workers or min(len(todo),
                                                               os.cpu_count() or 1) or 1,
                                                mp_context=multiprocessing.get_context("spawn"),
                                                initializer=workers_lib.quiet_worker, initargs=(os.getpid(),))
  try:
    futures = {pool.submit(write_shard, spec, output, k, shards, fmt, text_field, text_unit, proto): k for k in todo}
    for future in concurrent.futures.as_completed(futures):
      stats[futures[future]] = future.result()
      bar.update(1)
      bar.set_postfix(documents=sum(n for n, _ in stats), refresh=False)
  except UserError:
    _kill(pool)
    _remove_set(out, kind, shards, created)
    raise
  except BaseException:  # Stopped (or worse): finished shards stay, the marker stays; rerun to resume.
    _kill(pool)
    raise
  finally:
    for s, h in handlers.items():
      signal.signal(s, h)
    bar.close()
  pool.shutdown()
  counts = [n for n, _ in stats]
  if sum(counts) == 0:
    _remove_set(out, kind, shards, created)
    raise UserError(f"--input {spec} holds no documents: give non-empty files")
  empty = [k for k, n in enumerate(counts) if n == 0]
  if empty:
    _remove_set(out, kind, shards, created)
    listed = ", ".join(map(str, empty[:5])) + (f" ... ({len(empty)} in all)" if len(empty) > 5 else "")
    raise UserError(f"shards {listed} of {shards} got no documents ({sum(counts)} documents in all): use fewer "
                    "--shards (or --text_unit=line)")
  if tokenizer is not None:
    shards_lib.write_manifest(
        out, {
            "tokenizer": {
                "sha256": shards_lib.sha256(proto), "vocab_size": tokenizer.vocab_size, "source": tokenizer.source},
            "dtype": shards_lib.token_dtype(tokenizer.vocab_size).name, "shards": [
                {"name": shard_name(k, shards, kind), "documents": n, "tokens": t} for k, (n, t) in enumerate(stats)]})
  _write_marker(out, {**identity, "finished": True})  # Last: a rerun of this command now only says it is done.
  return counts


def _kill(pool: concurrent.futures.ProcessPoolExecutor) -> None:
  """Stops a pool now: its workers are killed (mid-shard: their staging files are cleaned on rerun).
  Only this pool's: an in-process caller's other child processes keep running."""
  if hasattr(pool, "kill_workers"):  # Python >= 3.14.
    pool.kill_workers()
  else:
    for proc in list((pool._processes or {}).values()):  # pylint: disable=protected-access
      proc.kill()
  pool.shutdown(wait=True, cancel_futures=True)

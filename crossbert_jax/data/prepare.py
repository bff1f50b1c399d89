"""Corpus -> N ArrayRecord shards, the recommended format on a pod (read lazily, by index).

Shard k of N holds the documents that process k of N would read with per-host reads
(`data/splits.py`): whole files when there are at least N, else part k of every file. Each
record is one document as JSON, {"text": ...}, so `data.text_field` stays "text". Shards are
written in parallel worker processes, each to a local staging file that is then moved (or, for
gs://, copied) to OUTPUT/corpus-0000k-of-0000N.arrayrecord; a shard appears complete or not at all.
"""

import concurrent.futures
import json
import multiprocessing
import os
import tempfile
import uuid

import tqdm
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import sources

SHARD_PATTERN = "corpus-{index:05d}-of-{count:05d}.arrayrecord"
# Records per ArrayRecord chunk: small groups keep random access (one document) cheap.
WRITER_OPTIONS = "group_size:64"


def shard_name(index: int, count: int) -> str:
  return SHARD_PATTERN.format(index=index, count=count)


def write_shard(spec: str, output: str, index: int, count: int, fmt: str, text_field: str,
                text_unit: str) -> int:
  """Writes shard `index` of `count` to `output`; returns its number of documents."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  parts, _ = sources._file_parts(spec, fmt, text_field, text_unit, index, count)  # pylint: disable=protected-access
  final = epath.Path(output) / shard_name(index, count)
  local_dir = output if "://" not in output else tempfile.mkdtemp(prefix="crossbert-prepare-")
  staging = os.path.join(local_dir, f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
  writer = array_record_module.ArrayRecordWriter(staging, WRITER_OPTIONS)
  n = 0
  try:
    for part in parts:
      for i in range(len(part)):
        writer.write(json.dumps({"text": part[i]}, ensure_ascii=False).encode("utf-8"))
        n += 1
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
  return n


def prepare(spec: str, output: str, shards: int, *, fmt: str = "auto", text_field: str = "text",
            text_unit: str = "paragraph", workers: int = 0, progress: bool = True) -> list[int]:
  """Writes `shards` ArrayRecord files to `output` in parallel; returns documents per shard."""
  if shards < 1:
    raise UserError(f"--shards={shards}: must be >= 1")
  if spec == "builtin":
    raise UserError("--input=builtin is in the package already; prepare your own files")
  sources.resolve_paths(spec)  # Fails early, in this process, on a bad --input.
  out = epath.Path(output)
  existing = sorted(out.glob("corpus-*-of-*.arrayrecord")) if out.exists() else []
  if existing:
    raise UserError(f"--output {output} already holds {len(existing)} shards ({existing[0].name}, ...): "
                    "choose a new folder")
  out.mkdir(parents=True, exist_ok=True)
  workers = workers or min(shards, os.cpu_count() or 1)
  counts = [0] * shards
  bar = tqdm.tqdm(total=shards, unit="shard", disable=not progress, dynamic_ncols=True)
  # Spawned workers: no fork of a parent that may hold threads (grain, tqdm).
  with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
    futures = {pool.submit(write_shard, spec, output, k, shards, fmt, text_field, text_unit): k
               for k in range(shards)}
    for future in concurrent.futures.as_completed(futures):
      counts[futures[future]] = future.result()
      bar.update(1)
      bar.set_postfix(documents=sum(counts), refresh=False)
  bar.close()
  empty = [k for k, n in enumerate(counts) if n == 0]
  if empty:
    raise UserError(f"shards {empty} of {shards} got no documents: use fewer --shards (or text_unit=line)")
  return counts

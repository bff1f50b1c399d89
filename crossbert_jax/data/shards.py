"""Shard sets written by `prepare`: their names, the pre-tokenized manifest, and completeness.

A set is OUTPUT/{corpus,tokens}-0000k-of-0000N.arrayrecord, k = 0..N-1. `corpus-*` shards hold
one document per record as JSON text; `tokens-*` shards hold one document per record as the raw
little-endian bytes of its token ids (no [CLS]/[SEP]), in the dtype that OUTPUT/manifest.json
names, beside the tokenizer's sha256 and vocabulary size and the documents and tokens of each
shard. A reader refuses a set with missing members rather than train on part of a corpus.
"""

import collections
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from etils import epath
import numpy as np

from crossbert_jax.core.errors import UserError

TEXT, TOKENS = "corpus", "tokens"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^(corpus|tokens)-(\d{5})-of-(\d{5})\.arrayrecord$")


def shard_name(kind: str, index: int, count: int) -> str:
  """The file name of shard `index` of `count` (kind TEXT or TOKENS)."""
  return f"{kind}-{index:05d}-of-{count:05d}.arrayrecord"


def parse_name(name: str) -> tuple[str, int, int] | None:
  """(kind, index, count) of a shard file name, or None if it is not one."""
  m = _NAME.match(name)
  return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def token_dtype(vocab_size: int) -> np.dtype:
  """uint16 when every id fits (up to 65,536 ids), else uint32 (shards written before hold int32, named in
  their manifest)."""
  return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def decode_tokens(records: Sequence[bytes], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """Records of a tokens-* shard laid end to end, decoded at once: (int32 ids_N, lengths_D)."""
  ids_N = np.frombuffer(b"".join(records), dtype).astype(np.int32)
  return ids_N, np.fromiter(map(len, records), np.int64, len(records)) // np.dtype(dtype).itemsize


def sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def check_complete(paths: Sequence[epath.Path]) -> None:
  """UserError if the shard files among `paths` leave out members of their `-of-N` sets."""
  sets: dict[tuple[str, str, int], set[int]] = collections.defaultdict(set)
  for p in paths:
    parsed = parse_name(p.name)
    if parsed:
      sets[(str(p.parent), parsed[0], parsed[2])].add(parsed[1])
  for (folder, kind, count), have in sorted(sets.items()):
    missing = sorted(set(range(count)) - have)
    if missing:
      names = ", ".join(shard_name(kind, k, count) for k in missing[:3]) + (", ..." if len(missing) > 3 else "")
      raise UserError(f"data.path: {folder} holds {len(have)} of the {count} {kind}-*-of-{count:05d} shards "
                      f"(missing {names}): rerun the same prepare command to finish the set, or use complete sets")


def read_manifest(folder: epath.Path) -> dict[str, Any]:
  """The manifest of a pre-tokenized set in `folder`; UserError if it is missing or damaged."""
  path = folder / MANIFEST
  if not path.exists():
    raise UserError(f"{folder}: tokens-* shards without their {MANIFEST}: rerun the prepare command that wrote them")
  try:
    manifest = json.loads(path.read_text())
    manifest["tokenizer"]["sha256"], manifest["dtype"], manifest["shards"]  # pylint: disable=pointless-statement
  except (ValueError, KeyError, TypeError):
    raise UserError(f"{path}: damaged (not the JSON that prepare writes): rerun prepare into a new folder") from None
  return manifest


def write_manifest(folder: epath.Path, manifest: dict[str, Any]) -> None:
  """Writes the manifest atomically (local: temp + rename; gs:// objects appear whole)."""
  text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
  if "://" in str(folder):
    (folder / MANIFEST).write_text(text)
  else:
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(text)
    tmp.rename(folder / MANIFEST)

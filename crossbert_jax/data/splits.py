"""Per-host shares of a corpus: each process reads only its part of the files.

The rule, for P processes and the F files of `data.path` in sorted order:
  F >= P   process p reads whole files p, p + P, p + 2P, ...
  F < P    every file is split P ways and process p reads part p of each:
           Parquet: row groups p, p + P, ...;
           text / JSONL: bytes [B(p), B(p + 1)), where B(k) is the first document start at or
           after k * size / P: a line start (JSONL, text_unit=line), or the first line after a
           blank line (text_unit=paragraph). Each process finds both of its bounds by reading a
           line or a paragraph past them, so a host reads its share plus at most two documents.
Text with text_unit=file cannot be split: those files are assigned whole, as with F >= P.
Every document lands in exactly one part, whatever P is.
"""

import dataclasses
from collections.abc import Sequence

from etils import epath


@dataclasses.dataclass(frozen=True)
class Part:
  """Part `index` of `count` equal splits of one file (count 1: the whole file)."""
  path: epath.Path
  index: int = 0
  count: int = 1


def host_parts(paths: Sequence[epath.Path], process_index: int, process_count: int,
               splittable: Sequence[bool]) -> list[Part]:
  """The parts of `paths` that process `process_index` of `process_count` reads (module rule)."""
  if len(paths) >= process_count:
    return [Part(p) for p in paths[process_index::process_count]]
  parts = []
  for i, (path, split) in enumerate(zip(paths, splittable)):
    if split:
      parts.append(Part(path, process_index, process_count))
    elif i % process_count == process_index:
      parts.append(Part(path))
  return parts


def _line_start(f, x: int) -> int:
  """The first line start at or after byte `x`."""
  if x == 0:
    return 0
  f.seek(x - 1)
  if f.read(1) == b"\n":
    return x
  f.readline()
  return f.tell()


def _paragraph_start(f, x: int, size: int) -> int:
  """The first non-blank line at or after byte `x` that follows a blank line (0 at the file start)."""
  if x == 0:
    return 0
  pos = _line_start(f, x)
  f.seek(pos)
  seen_blank = False
  while pos < size:
    line = f.readline()
    if not line:
      break
    if not line.strip():
      seen_blank = True
    elif seen_blank:
      return pos
    pos += len(line)
  return size


def bounds(part: Part, unit: str) -> tuple[int, int]:
  """(start, end) bytes of `part` snapped to document starts; unit is "line" or "paragraph"."""
  size = part.path.stat().length
  if part.count == 1:
    return 0, size
  with part.path.open("rb") as f:

    def snap(k: int) -> int:
      x = k * size // part.count
      if x >= size:
        return size
      return _paragraph_start(f, x, size) if unit == "paragraph" else _line_start(f, x)

    return snap(part.index), snap(part.index + 1)


def read_part(part: Part, unit: str) -> bytes:
  """The bytes of `part` (see `bounds`)."""
  start, end = bounds(part, unit)
  if end <= start:
    return b""
  with part.path.open("rb") as f:
    f.seek(start)
    return f.read(end - start)


def row_groups(num_row_groups: int, part: Part) -> list[int]:
  """The Parquet row groups of `part`: index, index + count, ..."""
  return list(range(part.index, num_row_groups, part.count))

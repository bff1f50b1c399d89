"""Document readers, one per file format of core/formats.py: a file (or this host's part of it) ->
its documents. Plain text splits by paragraph, line or file; JSONL and Parquet read a text field;
`decode_record` reads one ArrayRecord record (raw UTF-8 or a JSON object).
"""

import json
from typing import Any

from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import splits


def _decode(raw: bytes, where: str) -> str:
  try:
    return raw.decode("utf-8").lstrip("\ufeff")
  except UnicodeDecodeError as e:
    raise UserError(f"{where}: not UTF-8 (bad byte at offset {e.start}); convert it to UTF-8, "
                    "e.g. `iconv -f latin1 -t utf-8`") from None


def no_documents(path: epath.Path) -> UserError:
  return UserError(
      f"{path}: holds no documents (empty or blank); remove it from the files named (data.path, data.mixture, or --input)"
  )


def _read(path: epath.Path, part: splits.Part | None, unit: str) -> tuple[bytes, str]:
  """(bytes, name for errors) of the whole file or of one host's part of it."""
  if part is None or part.count == 1:
    with path.open("rb") as f:
      return f.read(), str(path)
  return splits.read_part(part, unit), f"{path} (part {part.index + 1} of {part.count})"


def read_text(path: epath.Path, text_unit: str, part: splits.Part | None = None) -> list[str]:
  """Documents of a plain-text file (or `part` of it): one per line, per blank-line paragraph, or the file."""
  raw, where = _read(path, part, "line" if text_unit == "line" else "paragraph")
  if part is not None and part.count > 1 and not raw:
    return []  # A part with no document start: its neighbour holds the document.
  text = _decode(raw, where)
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
  if not docs and (part is None or part.count == 1):
    raise no_documents(path)
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


def json_lines(text: str, where: Any) -> list[tuple[int, Any]]:
  """(line number, value) of each non-blank line of JSON-lines `text`; a bad line is one UserError naming
  `where`:LINE (the JSON-lines reader of documents and of pair files, data/pairs.py)."""
  out = []
  for lineno, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      out.append((lineno, json.loads(line)))
    except json.JSONDecodeError as e:
      raise UserError(f"{where}:{lineno}: not JSON ({e.msg}); write one JSON object per line") from None
  return out


def read_jsonl(path: epath.Path, text_field: str, part: splits.Part | None = None) -> list[str]:
  """Documents of a JSON-lines file (or `part` of it): the `text_field` of each object."""
  raw, where = _read(path, part, "line")
  text = _decode(raw, where)
  docs = [_field(record, text_field, f"{where}:{lineno}").strip() for lineno, record in json_lines(text, where)]
  docs = [d for d in docs if d]
  if not docs and (part is None or part.count == 1):
    raise no_documents(path)
  return docs


def read_parquet(path: epath.Path, text_field: str, part: splits.Part | None = None) -> list[str]:
  """Documents of a Parquet file (or `part` of its row groups): the `text_field` column."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  (heavy, rarely needed)

  try:
    with path.open("rb") as f:
      pf = pq.ParquetFile(f)
      names = pf.schema_arrow.names
      if text_field not in names:
        raise UserError(f"{path}: no column {text_field!r} (has {names}); set data.text_field")
      if part is None or part.count == 1:
        column = pf.read(columns=[text_field]).column(0)
      else:
        column = pf.read_row_groups(splits.row_groups(pf.num_row_groups, part), columns=[text_field]).column(0)
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (pyarrow raises many types)
    raise UserError(f"{path}: unreadable Parquet ({type(e).__name__}: {str(e)[:200]}); "
                    "check the file or set data.format (prepare: --format)") from None
  docs = [d.strip() for d in column.to_pylist() if isinstance(d, str)]
  docs = [d for d in docs if d]
  if not docs and (part is None or part.count == 1):
    raise no_documents(path)
  return docs


def read_text_format(path: epath.Path, _: str, text_unit: str, part: splits.Part | None) -> list[str]:
  """core/formats.py's "text" reader."""
  return read_text(path, text_unit, part)


def read_jsonl_format(path: epath.Path, text_field: str, _: str, part: splits.Part | None) -> list[str]:
  """core/formats.py's "jsonl" reader."""
  return read_jsonl(path, text_field, part)


def read_parquet_format(path: epath.Path, text_field: str, _: str, part: splits.Part | None) -> list[str]:
  """core/formats.py's "parquet" reader."""
  return read_parquet(path, text_field, part)


def decode_record(raw: bytes, text_field: str, where: str) -> str:
  """An ArrayRecord record: a JSON object holding `text_field`, else raw UTF-8 text."""
  if raw[:1] == b"{":
    try:
      record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
      record = None
    if isinstance(record, dict):
      return _field(record, text_field, where)
  return _decode(raw, where)

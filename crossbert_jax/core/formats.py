"""The one table of document formats: data.format, data.mixture's "format", and the --format of
prepare and tokenizer all take their choices from FORMAT_TABLE.

A row names the file extensions data.format=auto reads as the format, its reader, and whether
hosts may share one file. The table sits in core so that the config schema can check a format;
the built-in readers live in data/readers.py and are named by "module:function" (imported on
first read), so core imports no reader. A new format is a row whose reader is a function (or a
"module:function") taking (path, text_field, text_unit, part) and returning the documents.
"""

import importlib
from typing import Any, Callable, NamedTuple


class Format(NamedTuple):
  """A document format: its extensions, its reader, whether a file may be split between hosts."""
  extensions: tuple[str, ...]
  # (path, text_field, text_unit, this host's part or None) -> documents, or "module:function" of one;
  # None: ArrayRecord, read lazily by index (every process sees all documents and strides them).
  reader: str | Callable[..., list[str]] | None
  # Whether the reader takes a part of a file (data/splits.py), so hosts may share one file; else each
  # file is read whole, by one host.
  splittable: bool = True


FORMAT_TABLE: dict[str, Format] = {
    "text": Format(("", ".txt", ".text", ".tokens"), "crossbert_jax.data.readers:read_text_format"),
    "jsonl": Format((".jsonl", ".json"), "crossbert_jax.data.readers:read_jsonl_format"),
    "parquet": Format((".parquet",), "crossbert_jax.data.readers:read_parquet_format"),
    "arrayrecord": Format((".arrayrecord", ".array_record"), None),}


def names() -> tuple[str, ...]:
  """The formats of FORMAT_TABLE, in order (data.format also takes "auto")."""
  return tuple(FORMAT_TABLE)


def choices() -> tuple[str, ...]:
  """What data.format and --format accept: "auto" (by extension), then every format."""
  return ("auto", *FORMAT_TABLE)


def check(fmt: str) -> str | None:
  """None if `fmt` is a format choice, else the fix for an error line ("use auto, text, ... or arrayrecord")."""
  options = choices()
  return None if fmt in options else f"use {', '.join(options[:-1])} or {options[-1]}"


def reader(fmt: str) -> Callable[..., list[str]] | None:
  """The reader function of format `fmt` (None: read lazily, ArrayRecord)."""
  read: Any = FORMAT_TABLE[fmt].reader
  if isinstance(read, str):
    module, function = read.split(":")
    read = getattr(importlib.import_module(module), function)
  return read

"""Supervised contrastive examples: (anchor, positive[, negative]) text pairs or triplets from files.

`read_pairs` reads JSONL, Parquet or TSV (with a header) by the file's suffix; `read_hub_pairs` a Hugging
Face Hub dataset's split (`hf:OWNER/NAME[:CONFIG][@SPLIT]`, e.g. hf:sentence-transformers/all-nli:triplet)
through `datasets`, from the Hub or its cache. Columns are named
(anchor, positive[, negative]); by default the first of COLUMN_SETS the file holds: anchor/positive/
negative, sentence1/sentence2, premise/hypothesis, query/positive/negative. `nli_triplets` makes SNLI-style
triplets (a premise, an entailed hypothesis as positive, a contradiction of the same premise as hard
negative); `read_senteval_nli` reads SentEval's SNLI layout (s1.SPLIT, s2.SPLIT, labels.SPLIT) into
(premise, hypothesis, label) rows. Every bad input is one UserError line naming the file (and row).
"""

import csv
import dataclasses
import io
import math
import zlib
from typing import Any, Iterable, Sequence

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import hub_data, readers

HUB_PREFIX = "hf:"  # data.path=hf:OWNER/NAME[:CONFIG][@SPLIT]: a Hub dataset through `datasets`.
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".tsv": "tsv"}
# (anchor, positive, negative or None): the column names tried in order when none are given.
COLUMN_SETS = (("anchor", "positive", "negative"), ("sentence1", "sentence2", None), ("premise", "hypothesis", None),
               ("query", "positive", "negative"))
_FIX_COLUMNS = ("name its columns anchor, positive[, negative] (or sentence1/sentence2, premise/hypothesis), "
                "or give the column names")


@dataclasses.dataclass(frozen=True)
class Pair:
  """One example: the anchor, its positive, and optionally a hard negative."""
  anchor: str
  positive: str
  negative: str | None = None


def _format(path: epath.Path) -> str:
  fmt = FORMATS.get(path.suffix.lower())
  if fmt is None:
    raise UserError(f"{path}: unknown pair-file type {path.suffix!r}; use one of {', '.join(FORMATS)} "
                    "(JSON lines, Parquet, or tab-separated with a header)")
  return fmt


def _rows_jsonl(path: epath.Path) -> tuple[list[str], list[tuple[str, dict]]]:
  rows, keys = [], []
  for lineno, record in readers.json_lines(_text(path), path):
    if not isinstance(record, dict):
      raise UserError(f"{path}:{lineno}: a JSON {type(record).__name__}, not an object; write one object per line")
    keys = keys or list(record)
    rows.append((f"{path}:{lineno}", record))
  return keys, rows


def _rows_tsv(path: epath.Path) -> tuple[list[str], list[tuple[str, dict]]]:
  lines = list(csv.reader(io.StringIO(_text(path)), delimiter="\t", quoting=csv.QUOTE_NONE))
  lines = [(i, line) for i, line in enumerate(lines, 1) if any(cell.strip() for cell in line)]
  if not lines:
    return [], []
  header = lines[0][1]
  rows = []
  for lineno, line in lines[1:]:
    if len(line) != len(header):
      raise UserError(f"{path}:{lineno}: {len(line)} tab-separated fields, the header has {len(header)}; "
                      "fix the row (a tab inside a text?) or remove it")
    rows.append((f"{path}:{lineno}", dict(zip(header, line))))
  return header, rows


def _rows_parquet(path: epath.Path) -> tuple[list[str], list[tuple[str, dict]]]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  (heavy, rarely needed)

  try:
    with path.open("rb") as f:
      table = pq.read_table(f)
  except Exception as e:  # pylint: disable=broad-except  (pyarrow raises many types)
    raise UserError(f"{path}: unreadable Parquet ({type(e).__name__}: {str(e)[:200]}); check the file") from None
  return table.column_names, [(f"{path} row {i}", r) for i, r in enumerate(table.to_pylist(), 1)]


def _text(path: epath.Path) -> str:
  try:
    return path.read_bytes().decode("utf-8").lstrip("\ufeff")
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 (bad byte at offset {e.start}); convert it to UTF-8") from None


def _columns(path: str, have: Sequence[str], columns: Sequence[str | None] | None) -> tuple[str, str, str | None]:
  if columns is not None:
    anchor, positive, negative = (tuple(columns) + (None,))[:3]
    for name in (anchor, positive, negative):
      if name is not None and name not in have:
        raise UserError(f"{path}: no column {name!r} (has {list(have)}); {_FIX_COLUMNS}")
    return anchor, positive, negative
  for anchor, positive, negative in COLUMN_SETS:
    if anchor in have and positive in have:
      return anchor, positive, negative if negative in have else None
  missing = "anchor and positive" if "anchor" not in have else "positive"
  raise UserError(f"{path}: no {missing} column (has {list(have)}); {_FIX_COLUMNS}")


def _cell(record: dict, column: str, where: str) -> str:
  value = record.get(column)
  if isinstance(value, float) and math.isnan(value):
    value = None
  if not isinstance(value, str) or not value.strip():
    what = "null" if value is None else "empty" if isinstance(value, str) else f"a {type(value).__name__}, not text"
    raise UserError(f"{where}: column {column!r} is {what}; fill in the text or remove the row")
  return value.strip()


def _pairs(where: str, have: Sequence[str], rows: Iterable[tuple[str, dict]],
           columns: Sequence[str | None] | None) -> list[Pair]:
  anchor, positive, negative = _columns(where, have, columns)
  out = []
  for at, record in rows:
    neg = None if negative is None else _cell(record, negative, at)
    out.append(Pair(_cell(record, anchor, at), _cell(record, positive, at), neg))
  return out


def read_pairs(path: str | epath.Path, columns: Sequence[str | None] | None = None) -> list[Pair]:
  """The examples of one JSONL / Parquet / TSV file, in file order.

  columns: (anchor, positive[, negative]) column names; None tries COLUMN_SETS. A missing column,
  a file without rows, a null or empty text: UserError naming the file (and row).
  """
  path = epath.Path(path)
  if not path.exists():
    raise UserError(f"{path}: no such pair file; check the path")
  have, rows = {"jsonl": _rows_jsonl, "tsv": _rows_tsv, "parquet": _rows_parquet}[_format(path)](path)
  if not rows:
    raise UserError(f"{path}: holds no pairs (empty, or a header only); give a file with at least one row")
  return _pairs(str(path), have, rows, columns)


def is_hub(spec: str) -> bool:
  """Whether a data.path names a Hugging Face Hub dataset (`hf:REPO[:CONFIG][@SPLIT]`)."""
  return spec.strip().startswith(HUB_PREFIX)


def parse_hub(spec: str) -> tuple[str, str | None, str]:
  """'hf:REPO[:CONFIG][@SPLIT]' -> (repo, config or None, split; train when not given)."""
  body = spec.strip()[len(HUB_PREFIX):]
  body, _, split = body.partition("@")
  repo, _, config = body.partition(":")
  if repo.count("/") != 1 or not all(repo.split("/")) or "," in body:
    raise UserError(f"data.path={spec!r}: write a Hub dataset as hf:OWNER/NAME[:CONFIG][@SPLIT], e.g. "
                    "hf:sentence-transformers/all-nli:triplet@train (one dataset; files may be comma-separated)")
  return repo, config or None, split or "train"


def read_hub_pairs(spec: str, columns: Sequence[str | None] | None = None) -> list[Pair]:
  """The examples of a Hub dataset's split (`hf:REPO[:CONFIG][@SPLIT]`) through `datasets.load_dataset`:
  from the Hub, or offline (HF_DATASETS_OFFLINE=1) from the datasets cache an earlier load filled. Columns as
  for `read_pairs`; a dataset that cannot be loaded is one UserError line with the ways round."""
  import datasets  # pylint: disable=g-import-not-at-top  (slow to import; only this source needs it)

  repo, config, split = parse_hub(spec)
  name = repo + (f" ({config})" if config else "")
  try:
    with hub_data.quiet():
      ds = datasets.load_dataset(repo, config, split=split)
  except Exception as e:  # Network, cache, Hub or split errors: one line, with the ways round.  # noqa: BLE001
    raise UserError(f"data.path={spec}: {name} split {split!r} could not be loaded ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:200]}); reach the Hub once (it fills the datasets cache), or "
                    f"give data.path the files of a local copy (hf download {repo} --repo-type=dataset "
                    "--local-dir=DIR)") from None
  if not len(ds):
    raise UserError(f"data.path={spec}: {name} split {split!r} holds no pairs; choose another split or config")
  rows = ((f"{spec} row {i}", record) for i, record in enumerate(ds, 1))
  return _pairs(spec, ds.column_names, rows, columns)


def nli_triplets(rows: Iterable[tuple[str, str, str]]) -> list[Pair]:
  """SNLI-style triplets from (premise, hypothesis, label) rows: each entailed hypothesis is a positive,
  with the premise's contradictions in turn as hard negatives (the i-th entailment gets contradiction
  i mod their count). Premises without both an entailment and a contradiction give no triplet."""
  by_premise: dict[str, tuple[list[str], list[str]]] = {}
  for premise, hypothesis, label in rows:
    entail, contra = by_premise.setdefault(premise.strip(), ([], []))
    if label == "entailment":
      entail.append(hypothesis.strip())
    elif label == "contradiction":
      contra.append(hypothesis.strip())
  return [
      Pair(premise, positive, contra[i % len(contra)]) for premise, (entail, contra) in by_premise.items() if contra
      for i, positive in enumerate(entail)]


def read_senteval_nli(folder: str | epath.Path, split: str) -> list[tuple[str, str, str]]:
  """(premise, hypothesis, label) rows of SentEval's SNLI files s1.SPLIT, s2.SPLIT, labels.SPLIT (line-aligned)."""
  folder = epath.Path(folder)
  names = [f"s1.{split}", f"s2.{split}", f"labels.{split}"]
  for name in names:
    if not (folder / name).exists():
      raise UserError(f"{folder / name}: missing; a SentEval NLI folder holds {', '.join(names)}")
  s1, s2, labels = ([line.strip() for line in _text(folder / n).splitlines()] for n in names)
  if not (len(s1) == len(s2) == len(labels)):
    raise UserError(f"{folder}: {names[0]}, {names[1]}, {names[2]} have {len(s1)}, {len(s2)}, {len(labels)} lines; "
                    "they must be line-aligned (re-copy the files)")
  if not s1:
    raise UserError(f"{folder / names[0]}: holds no pairs (empty); give the split's files")
  return list(zip(s1, s2, labels))


def text_ids(texts: Sequence[str]) -> np.ndarray:
  """int32 ids equal exactly for equal texts (CRC-32 of the stripped UTF-8 text, 31 bits): the per-example
  ids with which the loss masks duplicate positives. A collision of two different texts only masks one
  negative (about 1 in 2^31 per pair)."""
  return np.asarray([zlib.crc32(t.strip().encode("utf-8")) & 0x7FFFFFFF for t in texts], np.int32)


def as_columns(pairs: Sequence[Pair]) -> dict[str, Any]:
  """{"anchor": [...], "positive": [...]} (+ "negative" when every pair has one); a mix is refused."""
  out: dict[str, Any] = {"anchor": [p.anchor for p in pairs], "positive": [p.positive for p in pairs]}
  with_negative = sum(p.negative is not None for p in pairs)
  if with_negative not in (0, len(pairs)):
    raise UserError(f"{with_negative} of {len(pairs)} examples have a negative; give every example one or none")
  if with_negative:
    out["negative"] = [p.negative for p in pairs]
  return out

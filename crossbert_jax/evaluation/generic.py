"""Your own tasks: TSV/JSONL files named by columns, from flags or several from a task file.

Parsing is strict, because a silently mis-read row becomes a wrong score: rows split on "\n"
only (never on U+2028 and the other separators `str.splitlines` honours), a TSV row must have
exactly the header's fields (a tab inside a text, or a missing value, is an error naming the
line), every JSONL row needs every named key, numeric class labels are compared as numbers
("1" and "1.0" are one class), and too few rows or a single class stop with one line.
A task file (JSON, or YAML when PyYAML is installed) lists tasks:

  {"tasks": [{"name": "sts", "type": "regression", "train": "train.tsv", "eval": {"test": "test.tsv"},
              "columns": {"text": "sentence1", "pair": "sentence2", "label": "score"}}]}
"""

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation.tasks import (CLASSIFICATION, PAIR_CLASSIFICATION, REGRESSION, Split, Task)

PAIR_REGRESSION = "pair_regression"
TYPES = (CLASSIFICATION, REGRESSION, PAIR_CLASSIFICATION, PAIR_REGRESSION)
CV_FOLDS = 5  # As probes.CV_FOLDS (probes imports this module's readers' output, not the reverse).
# Fewest rows the probes can work with: every class in every fold's fit part and its 10%
# validation split (stratified), or enough rows for a ridge fit and a validation score.
MIN_PER_CLASS, MIN_PER_CLASS_CV = 2, CV_FOLDS
MIN_REGRESSION_ROWS, MIN_REGRESSION_ROWS_CV = 4, 2 * CV_FOLDS


@dataclasses.dataclass(frozen=True)
class GenericSpec:
  """A user's TSV (with a header) or JSONL data set, named by columns."""
  train: str
  eval: str = ""  # One evaluation file (split "eval"); empty and no eval_splits: 5-fold CV on train.
  text: str = "text"
  pair: str = ""  # Second text column: a pair task.
  label: str = "label"
  kind: str = CLASSIFICATION  # classification or regression (pair_* accepted: the pair column decides).
  name: str = "generic"
  eval_splits: tuple[tuple[str, str], ...] = ()  # (split name, file) pairs, from a task file.

  @property
  def splits(self) -> dict[str, str]:
    return {"eval": self.eval} if self.eval else dict(self.eval_splits)


# ----------------------------------------------------------------------------- files


def decode(path: str) -> str:
  """The file's text; a missing or non-UTF-8 file is a UserError naming the byte offset."""
  p = epath.Path(path)
  if not p.is_file():
    raise UserError(f"{path} does not exist (or is not a file): give a .tsv or .jsonl file")
  data = p.read_bytes()
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise UserError(f"{path} is not UTF-8 (line {line}, byte {e.start}: {e.reason}); re-save it as UTF-8") from None


def _lines(text: str) -> list[tuple[int, str]]:
  """(line number, line) of the non-blank lines; rows end at "\n" (or "\r\n") only."""
  return [(n, line.removesuffix("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]


def read_records(path: str, columns: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
  """(line number, row) of a TSV (with a header) or JSONL file; each row holds every column."""
  if not path.endswith((".tsv", ".jsonl")):
    raise UserError(f"{path}: unknown format; a task file is .tsv (with a header) or .jsonl")
  lines = _lines(decode(path))
  if not lines:
    raise UserError(f"{path} is empty: it needs {'a header and ' if path.endswith('.tsv') else ''}rows")
  if path.endswith(".jsonl"):
    rows = []
    for n, line in lines:
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"{path} line {n}: invalid JSON ({e.msg}); use one JSON object per line") from None
      if not isinstance(row, dict):
        raise UserError(f"{path} line {n}: a JSON {type(row).__name__}, not an object; use one object per line")
      missing = [c for c in columns if c not in row]
      if missing:
        raise UserError(f"{path} line {n} has no key {missing[0]!r} (keys: {', '.join(row)}); every row needs "
                        f"{', '.join(map(repr, columns))} (or fix the column names)")
      rows.append((n, row))
    return rows
  (_, head), body = lines[0], lines[1:]
  header = head.split("\t")
  missing = [c for c in columns if c not in header]
  if missing:
    raise UserError(f"{path} has no column {missing[0]!r} (columns: {', '.join(header)}); fix the column names")
  if not body:
    raise UserError(f"{path} has a header but no rows")
  rows = []
  for n, line in body:
    fields = line.split("\t")
    if len(fields) != len(header):
      why = ("a tab inside a text? remove it, or use JSONL"
             if len(fields) > len(header) else "a missing value? fill it in")
      raise UserError(f"{path} line {n} has {len(fields)} tab-separated fields, the header has {len(header)}: {why}")
    rows.append((n, dict(zip(header, fields))))
  return rows


# ----------------------------------------------------------------------------- labels


def _number(value: Any) -> float | None:
  if isinstance(value, bool):
    return None
  try:
    x = float(value)
  except (TypeError, ValueError):
    return None
  return x if math.isfinite(x) else None


def _class_key(value: Any) -> Any:
  """Numeric labels compare as numbers ("1" == "1.0"); others as stripped strings."""
  x = _number(value)
  return x if x is not None else str(value).strip()


def _class_name(key: Any) -> str:
  return f"{key:g}" if isinstance(key, float) else key


def _check_label(path: str, n: int, value: Any, label: str) -> None:
  if value is None or (isinstance(value, str) and not value.strip()):
    raise UserError(f"{path} line {n}: the label {label!r} is empty; fill it in or drop the row")


# ----------------------------------------------------------------------------- a task


def read_generic(spec: GenericSpec) -> Task:
  """A TSV/JSONL task driven by column names and a task type (pair tasks get zero-shot cosine)."""
  if spec.kind not in TYPES:
    raise UserError(f"type {spec.kind!r} of task {spec.name!r}: use one of {', '.join(TYPES)}")
  if spec.kind.startswith("pair_") and not spec.pair:
    raise UserError(f"task {spec.name!r} is {spec.kind} but names no second text column: pass --generic_pair "
                    "(or \"pair\" in the task file's columns)")
  regression = spec.kind in (REGRESSION, PAIR_REGRESSION)
  kind = REGRESSION if regression else (PAIR_CLASSIFICATION if spec.pair else CLASSIFICATION)
  columns = (spec.text, spec.label) + ((spec.pair,) if spec.pair else ())

  def split(path: str) -> tuple[list[str], list[str] | None, list[Any]]:
    rows = read_records(path, columns)
    for n, row in rows:
      _check_label(path, n, row[spec.label], spec.label)
      if regression and _number(row[spec.label]) is None:
        raise UserError(f"{path} line {n}: label {row[spec.label]!r} is not a number; a regression needs "
                        "numeric labels (or use type classification)")
    labels = [_number(r[spec.label]) if regression else _class_key(r[spec.label]) for _, r in rows]
    return ([str(r[spec.text]) for _, r in rows], [str(r[spec.pair]) for _, r in rows] if spec.pair else None, labels)

  parts = {"train": split(spec.train)} | {name: split(path) for name, path in spec.splits.items()}
  cv = not spec.splits
  if regression:
    _check_size(spec, "train", len(parts["train"][2]), MIN_REGRESSION_ROWS_CV if cv else MIN_REGRESSION_ROWS)
    splits = {k: Split(t, np.array(l, np.float32), p) for k, (t, p, l) in parts.items()}
    metrics: tuple[str, ...] = ("spearman", "pearson")
  else:
    splits, metrics = _classes(spec, parts, cv)
  for name in spec.splits:
    _check_size(spec, name, len(splits[name]), 2 if regression else 1)
  scored = tuple(spec.splits)
  binary = not regression and len(metrics) == 2
  cosine = () if not spec.pair or not (regression or binary) else (scored or ("train",))
  note = "" if scored else f"no evaluation split: {CV_FOLDS}-fold cross-validation on train"
  return Task(spec.name, kind, metrics, splits, fit="train", scored=scored, note=note, cosine_splits=cosine)


def _check_size(spec: GenericSpec, split: str, rows: int, needed: int) -> None:
  if rows < needed:
    raise UserError(f"task {spec.name!r}: {split} has {rows} rows, too few for the probes: give at least "
                    f"{needed}" + (" (or an evaluation file)" if split == "train" and not spec.splits else ""))


def _classes(spec: GenericSpec, parts: dict, cv: bool) -> tuple[dict[str, Split], tuple[str, ...]]:
  """Class ids (numeric labels sorted as numbers, others as strings) and the metrics."""
  train_keys = parts["train"][2]
  classes = sorted(set(train_keys), key=lambda k: (isinstance(k, str), k))
  if len(classes) < 2:
    raise UserError(f"task {spec.name!r}: {spec.train} has one class ({_class_name(classes[0])!r}) in "
                    f"{spec.label!r}; a classification needs at least two (or use type regression)")
  counts = {c: train_keys.count(c) for c in classes}
  need = MIN_PER_CLASS_CV if cv else MIN_PER_CLASS
  rare = [c for c in classes if counts[c] < need]
  if rare:
    raise UserError(f"task {spec.name!r}: class {_class_name(rare[0])!r} has {counts[rare[0]]} rows in "
                    f"{spec.train}; each class needs at least {need}" + (" (or an evaluation file)" if cv else ""))
  index = {c: i for i, c in enumerate(classes)}
  splits = {}
  for name, (texts, pairs, keys) in parts.items():
    unseen = [k for k in keys if k not in index]
    if unseen:
      raise UserError(f"task {spec.name!r}: {name} label {_class_name(unseen[0])!r} never occurs in "
                      f"{spec.train}; a probe cannot predict it")
    splits[name] = Split(texts, np.array([index[k] for k in keys], np.int64), pairs)
  return splits, (("accuracy", "f1") if len(classes) == 2 else ("accuracy",))


# ----------------------------------------------------------------------------- task files

_TASK_KEYS = {"name", "type", "train", "eval", "columns"}
_COLUMN_KEYS = {"text", "pair", "label"}


def _load_task_file(path: str) -> Any:
  p = epath.Path(path)
  if not p.is_file():
    what = "is a folder" if p.is_dir() else "does not exist"
    raise UserError(f"--task_file={path} {what}: give a .json (or .yaml) task file "
                    "(docs/evaluation.md shows one)")
  text = decode(path)
  if path.endswith((".yaml", ".yml")):
    try:
      import yaml  # Optional: YAML task files only.
    except ImportError:
      raise UserError(f"--task_file={path}: reading YAML needs PyYAML (pip install pyyaml); or write JSON") from None
    try:
      return yaml.safe_load(text)
    except yaml.YAMLError as e:
      raise UserError(f"--task_file={path}: invalid YAML ({' '.join(str(e).split())})") from None
  if not path.endswith(".json"):
    raise UserError(f"--task_file={path}: use a .json (or .yaml) file")
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise UserError(f"--task_file={path}: invalid JSON (line {e.lineno}: {e.msg})") from None


def read_task_file(path: str) -> list[GenericSpec]:
  """The tasks of a task file; relative data paths are relative to the task file's folder."""
  doc = _load_task_file(path)
  entries = doc.get("tasks") if isinstance(doc, dict) else doc
  if not isinstance(entries, list) or not entries:
    raise UserError(f"--task_file={path}: expected {{\"tasks\": [...]}} (or a list) with at least one task")
  base = os.path.dirname(os.path.abspath(path))

  def resolve(p: Any, where: str) -> str:
    if not isinstance(p, str) or not p:
      raise UserError(f"--task_file={path}: {where} must be a file path")
    return p if os.path.isabs(p) or "://" in p else os.path.join(base, p)

  specs, names = [], set()
  for i, e in enumerate(entries):
    where = f"task {i + 1}"
    if not isinstance(e, dict):
      raise UserError(f"--task_file={path}: {where} is not an object with name, type, train, columns")
    unknown = sorted(set(e) - _TASK_KEYS)
    if unknown or not {"name", "type", "train"} <= set(e):
      bad = f"unknown key {unknown[0]!r}" if unknown else "missing name, type or train"
      raise UserError(f"--task_file={path}: {where}: {bad}; keys are {', '.join(sorted(_TASK_KEYS))}")
    name = e["name"]
    if not isinstance(name, str) or not name.strip():
      raise UserError(f"--task_file={path}: {where}: name is {name!r}; give each task a non-empty string name")
    if name in names:
      raise UserError(f"--task_file={path}: task name {name!r} appears twice; names must be unique")
    names.add(name)
    cols = e.get("columns", {})
    if not isinstance(cols, dict) or set(cols) - _COLUMN_KEYS or not all(isinstance(v, str) for v in cols.values()):
      raise UserError(f"--task_file={path}: task {name!r}: columns must map text, pair, label to column names")
    ev = e.get("eval", {})
    ev = {"eval": ev} if isinstance(ev, str) else ev
    if not isinstance(ev, dict):
      raise UserError(f"--task_file={path}: task {name!r}: eval is a file or {{split name: file}}")
    specs.append(
        GenericSpec(resolve(e["train"], f"task {name!r} train"), "", str(cols.get("text", "text")),
                    str(cols.get("pair", "")), str(cols.get("label", "label")), str(e["type"]), name,
                    tuple((str(k), resolve(v, f"task {name!r} eval {k}")) for k, v in ev.items())))
  return specs

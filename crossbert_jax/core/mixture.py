"""The `data.mixture` schema: a source's keys, its short name, and the validation of the whole list.

A mixture is a tuple of dicts, one per source: {"path": P, "weight": w} plus, where a source differs
from the data.* defaults, "format" / "text_field" / "text_unit", and an optional "name" (the
`tokens_seen/<name>` metrics key; default: the path's last component without its extension).
config.py declares the key; data/mixture.py samples from it.
"""

import math
import re

import ml_collections

from crossbert_jax.core import choices, formats
from crossbert_jax.core.errors import config_error

KEYS = ("path", "weight", "name", "format", "text_field", "text_unit")


def source_names(mixture) -> list[str]:
  """Each source's short name: its "name", else its path's last component without extension."""
  out = []
  for k, src in enumerate(mixture):
    name = src.get("name")
    if name is None:
      path = str(src.get("path", ""))
      path = re.split(r"[*?\[,]", path)[0].rstrip("/")  # "gs://b/corpus/*.arrayrecord" -> "corpus".
      name = re.sub(r"[^A-Za-z0-9_.-]", "_", path.rsplit("/", 1)[-1].split(".")[0]) or f"source{k}"
    out.append(name)
  return out


def validate(d: ml_collections.ConfigDict) -> None:
  """data.mixture: sources with a path, a positive finite weight and only known keys; distinct names."""
  if not isinstance(d.mixture, (tuple, list)):
    raise config_error("data.mixture", f"must be a tuple of dicts {{'path': P, 'weight': w}}, got {d.mixture!r}")
  if not d.mixture:
    return
  if d.path not in ("builtin", ""):
    raise config_error(
        "data.path", f"{d.path!r} and data.mixture are both set: make it a source of data.mixture, or "
        "clear it (--config.data.path='')")

  for k, src in enumerate(d.mixture):
    key = f"data.mixture[{k}]"
    if not isinstance(src, dict):
      keys = isinstance(src, str) and src in KEYS  # One dict given without a trailing comma: read as its keys.
      raise config_error(
          key, f"must be a dict {{'path': P, 'weight': w}}, got {src!r}" +
          ("; one source needs a trailing comma: --config.data.mixture=\"({'path': P, 'weight': 1.0},)\""
           if keys else ""))
    unknown = sorted(set(src) - set(KEYS))
    if unknown:
      raise config_error(key, f"unknown key {unknown[0]!r}: use {', '.join(KEYS)}")
    if not isinstance(src.get("path"), str) or not src["path"].strip():
      raise config_error(f"{key}.path", f"must be a non-empty path (file, directory, glob, comma list), got "
                         f"{src.get('path')!r}")
    w = src.get("weight")
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
      raise config_error(f"{key}.weight", f"must be a finite number > 0, got {w!r}")
    if fix := formats.check(src.get("format", "auto")):
      raise config_error(f"{key}.format", f"{src['format']!r}: {fix}")
    choices.check(f"{key}.text_unit", src.get("text_unit", choices.TextUnit.LINE.value), choices.TextUnit)
    if not isinstance(src.get("text_field", "text"), str):
      raise config_error(f"{key}.text_field", f"must be a field name, got {src['text_field']!r}")
    name = src.get("name", "x")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
      raise config_error(f"{key}.name", f"must be letters, digits, '_', '.' or '-', got {name!r}")
  if not math.isfinite(sum(src["weight"] for src in d.mixture)):  # As data/mixture.py sums them.
    raise config_error(
        "data.mixture", "the weights sum past the largest float: scale them down (only their ratios "
        "matter, e.g. 1 and 3)")
  names = source_names(d.mixture)
  for k, name in enumerate(names):
    if name in names[:k]:
      raise config_error(
          f"data.mixture[{k}]", f"name {name!r} repeats data.mixture[{names.index(name)}]'s: give each "
          "source a distinct 'name'")

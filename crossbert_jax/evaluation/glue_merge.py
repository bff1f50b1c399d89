"""The GLUE table already in --output_dir, and an evaluation's columns added to it (never a column lost).

The table names, per column, the model it scored and its task results (`models`: {label: {"identity",
"key", "files": {task: its result under tasks/}}}). An evaluation into a folder holding a table adds its
columns: a model scored again (the same identity) keeps its label and column, the tasks it runs now
replacing those it ran before, the others kept; a new model whose label an earlier column has (another
run whose folder has the same name) gets `label (source)`. A table scored with other settings (options,
probe seeds, subset, a task's data) is refused in one line: its columns would not compare.
"""

import json
from typing import Any, Callable

from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import glue
from crossbert_jax.evaluation import glue_run
from crossbert_jax.evaluation.columns import column_label

TABLE = "glue_table.json"


def _differing(old: dict[str, Any], new: dict[str, Any]) -> str | None:
  """The first setting (or `sources.<task>` of a task both ran) whose values differ, else None."""
  keys = sorted((set(old) | set(new)) - {"sources"})
  diff = next((k for k in keys if old.get(k) != new.get(k)), None)
  if diff is not None:
    return diff
  old_src, new_src = old.get("sources") or {}, new.get("sources") or {}
  return next((f"sources.{t}" for t in glue.TASKS if t in old_src and t in new_src and old_src[t] != new_src[t]), None)


def read(out_dir: epath.Path, settings: dict[str, Any], log: Callable[[str], None] = print) -> dict[str, Any]:
  """{"settings", "models"} of the table in `out_dir` ({} when none); refuses one with other settings.

  A damaged table is left out with one warning (its task results stay under tasks/)."""
  path = out_dir / TABLE
  if not path.exists():
    return {}
  try:
    table = json.loads(path.read_text())
    old, columns = dict(table["settings"]), list(table["columns"])
    models = table.get("models") or _legacy_models(out_dir, old, columns)
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    log(f"warning: {path} is damaged ({type(e).__name__}); writing a new table of this evaluation's columns "
        f"(earlier results stay in {out_dir / 'tasks'})")
    return {}
  diff = _differing(old, settings)
  if diff is not None:
    top, _, task = diff.partition(".")
    there, here = (old.get(top), settings.get(top)) if not task else (old["sources"][task], settings["sources"][task])
    raise UserError(f"--output_dir {out_dir} holds a GLUE table scored with other settings ({diff}: {there!r} there, "
                    f"{here!r} here), so their columns would not compare: choose another --output_dir, or rerun "
                    "with those settings")
  return {"settings": old, "models": {c: models[c] for c in columns if c in models}}


def _legacy_models(out_dir: epath.Path, settings: dict[str, Any], columns: list[str]) -> dict[str, dict]:
  """`models` of a table written before it named them: each column's results folder found by its label."""
  digest, out = glue_run.settings_digest(settings), {}
  for label in columns:
    safe = glue_run.column_key(label, "")[:-9]  # The label part of a column key.
    folders = [p.parent for p in out_dir.glob(f"tasks/{safe}-*/{digest}") if p.is_dir()] if safe else []
    if len(folders) == 1:
      out[label] = {
          "identity": None, "key": folders[0].name, "files": {
              f.stem: f"{folders[0].name}/{digest}/{f.name}"
              for f in sorted((folders[0] / digest).glob("*.json"))
              if f.stem in glue.TASKS}}
  return out


def labels(earlier: dict[str, Any], models: list[tuple[str, str, str]]) -> list[str]:
  """Each model's column label, for models [(label, identity, source)]: the earlier column's when it scored
  the same model, else its own, made distinct from the earlier columns' labels."""
  known = (earlier or {}).get("models", {})
  out: list[str] = []
  for label, identity, source in models:
    same = [
        l for l, e in known.items() if e.get("identity") == identity or
        (e.get("identity") is None and e.get("key") == glue_run.column_key(label, identity))]
    if same:
      out.append(same[0])
    else:
      out.append(column_label(label, source, list(known) + out))
  return out


def merged(out_dir: epath.Path, earlier: dict[str, Any], results: dict[str, dict], files: dict[str, dict[str, str]],
           identities: dict[str, str], settings: dict[str, Any], seeds: int,
           log: Callable[[str], None] = print) -> tuple[dict[str, dict], dict[str, dict], dict[str, Any]]:
  """(results, models, settings) of the table: the earlier columns (their tasks this evaluation did not run read
  back from tasks/), then the new ones. results / files / identities: this evaluation's, by label."""
  out_results: dict[str, dict] = {}
  out_models: dict[str, dict] = {}
  for label, entry in (earlier or {}).get("models", {}).items():
    kept, kept_files = {}, {}
    for task, rel in entry.get("files", {}).items():
      if task in results.get(label, {}) or task not in glue.TASKS:
        continue
      saved = glue_run.read_saved(out_dir / "tasks" / rel, task, seeds, log, then=f"the column {label} leaves it out")
      if saved is None and not (out_dir / "tasks" / rel).exists():
        log(f"warning: {out_dir / 'tasks' / rel} is gone; the column {label} leaves {task} out")
      if saved is not None:
        kept[task], kept_files[task] = saved, rel
    out_results[label] = {**kept, **results.get(label, {})}
    out_models[label] = {
        "identity": identities.get(label, entry.get("identity")), "key": entry.get("key"),
        "files": {**kept_files, **files.get(label, {})}}
  for label, by_task in results.items():
    if label not in out_models:
      out_results[label] = dict(by_task)
      out_models[label] = {"identity": identities[label], "key": None, "files": dict(files[label])}
  for entry in out_models.values():
    entry["files"] = {t: entry["files"][t] for t in glue.TASKS if t in entry["files"]}
    entry["key"] = entry["key"] or next(iter(entry["files"].values()), "/").split("/")[0]
  out_results = {l: r for l, r in out_results.items() if r}  # An earlier column whose results are all gone.
  out_models = {l: m for l, m in out_models.items() if l in out_results}
  sources = {**(earlier or {}).get("settings", {}).get("sources", {}), **settings["sources"]}
  return out_results, out_models, {**settings, "sources": {t: sources[t] for t in glue.TASKS if t in sources}}

"""The fine-tuned GLUE table: per task the best grid point on dev (mean over its seeds), reported as the mean
and spread of its seeds, one column per encoder, the frozen linear-probe score beside it where
`evaluate --benchmark=glue` wrote one; GLUE's average of the nine rows. JSON and Markdown, x100.

Built only from the trials' result.json files, so a resumed run's table is byte for byte an uninterrupted one's.
"""

import json
from typing import Any

import numpy as np
from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.evaluation import glue

NAME = "glue_finetuned"


def _task_score(dev: dict[str, dict[str, float]]) -> float:
  """A trial's selection score: the mean of its rows' GLUE scores (MNLI: matched and mismatched)."""
  return float(np.mean([glue.row_score(m) for m in dev.values()]))


def best_point(results: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
  """(the grid point whose seeds score best on dev on average, its trials); ties: the first point in order."""
  points: dict[str, list[dict[str, Any]]] = {}
  for r in results:
    points.setdefault(_point(r["trial"]), []).append(r)
  means = {p: np.mean([_task_score(r["dev"]) for r in rs]) for p, rs in points.items()}
  best = max(points, key=lambda p: (means[p], -list(points).index(p)))
  return best, sorted(points[best], key=lambda r: r["trial"]["seed"])


def _point(t: dict[str, Any]) -> str:
  return f"lr={t['learning_rate']:g} epochs={t['epochs']} wd={t['weight_decay']:g}"


def _stats(values: list[float]) -> dict[str, float]:
  return {"mean": round(100 * float(np.mean(values)), 4), "std": round(100 * float(np.std(values)), 4)}


def frozen_scores(table_path: epath.Path | None) -> dict[str, float]:
  """{row: linear-probe mean x100} from a frozen GLUE table (glue_table.json), {} without one."""
  if table_path is None or not table_path.exists():
    return {}
  table = json.loads(table_path.read_text())
  out = {}
  for row, entry in table.get("rows", {}).items():
    cells = [c.get("linear") for c in entry.get("scores", {}).values() if c.get("linear")]
    if cells:
      out[row] = round(cells[0]["mean"], 4)
  return out


def summary(results: dict[str, dict[str, list[dict[str, Any]]]], starts: dict[str, dict[str, str]],
            frozen: dict[str, dict[str, float]], skipped: dict[str, str], settings: dict[str, Any],
            notes: dict[str, str] | None = None) -> dict[str, Any]:
  """results: {column: {task: its trials' results}}; starts: {column: {task: what its trials started from}};
  notes: {task: how its data differs from GLUE's} (the shared MRPC files)."""
  rows: dict[str, Any] = {}
  per_row: dict[str, dict[str, float]] = {c: {} for c in results}
  for name, task in glue.TASKS.items():
    for row, _ in task.rows:
      entry = {"title": glue.ROW_TITLES[row], "metrics": list(task.metrics), "skipped": skipped.get(name), "scores": {}}
      for column, by_task in results.items():
        if not by_task.get(name):
          continue
        point, trials = best_point(by_task[name])
        seeds = [glue.row_score(r["dev"][row]) for r in trials]
        per_row[column][row] = float(np.mean(seeds))
        entry["scores"][column] = {
            **_stats(seeds), "seeds": len(seeds), "point": point, "start": starts[column][name],
            "metrics": {m: _stats([r["dev"][row][m] for r in trials])["mean"] for m in task.metrics},
            "frozen": frozen.get(column, {}).get(row), "trials": len(by_task[name])}
      rows[row] = entry
  average = {}
  for column in results:
    full = glue.glue_average(per_row[column])
    part, n = glue.partial_average(per_row[column])
    fz = frozen.get(column, {})
    frozen_part = [fz[r] for r in per_row[column] if r in fz]
    average[column] = {
        "glue": None if full is None else round(100 * full, 4), "rows_run": n,
        "mean_of_rows_run": None if part is None else round(100 * part, 4),
        "frozen_of_rows_run": round(float(np.mean(frozen_part)), 4) if len(frozen_part) == n and n else None}
  return {
      "benchmark": "glue-finetuned", "settings": settings, "columns": list(results), "rows": rows, "average": average,
      "skipped": skipped}


def _cell(score: dict[str, Any] | None) -> str:
  if not score:
    return "-"
  text = f"{score['mean']:.1f} ± {score['std']:.1f}"
  if len(score["metrics"]) > 1:
    text += " (" + "/".join(f"{v:.1f}" for v in score["metrics"].values()) + ")"
  return text


def markdown(table: dict[str, Any]) -> str:
  """A row per GLUE row: per encoder the fine-tuned score (seed mean ± std) and the frozen probe's beside it."""
  cols = table["columns"]
  head = " | ".join(f"{c} fine-tuned | {c} frozen" for c in cols)
  lines = [f"| task | metric | {head} | best point (start) |", "|---|---|" + "---:|---:|" * len(cols) + "---|"]
  for row in table["rows"].values():
    metric = "/".join(glue.METRIC_LABELS[m] for m in row["metrics"])
    cells, points = [], []
    for c in cols:
      score = row["scores"].get(c)
      frozen = score and score["frozen"]
      cells.append(f"{_cell(score)} | {'-' if frozen is None or not score else f'{frozen:.1f}'}")
      if score:
        points.append(f"{score['point']} ({score['start']})")
    lines.append(f"| {row['title']} | {metric} | {' | '.join(cells)} | {'; '.join(points)} |")
  avg = [table["average"][c] for c in cols]
  fmt = lambda v: "-" if v is None else f"{v:.1f}"
  lines.append(f"| **GLUE average** | 9 rows | {' | '.join(fmt(a['glue']) + ' | -' for a in avg)} | |")
  run = [f"{fmt(a['mean_of_rows_run'])} ({a['rows_run']} rows) | {fmt(a['frozen_of_rows_run'])}" for a in avg]
  lines += [f"| mean of the rows run | | {' | '.join(run)} | |", ""]
  s = table["settings"]
  lines.append(f"Scores x100 on the dev splits: per task the grid point with the best mean dev score over its "
               f"{s['seeds']} seed(s), reported as mean ± std over those seeds; two-metric rows score the mean of "
               "their metrics (each in brackets). Frozen: the linear probe of `evaluate --benchmark=glue`.")
  if table["skipped"]:
    lines.append("Skipped: " + "; ".join(f"{t} ({why})" for t, why in table["skipped"].items()) + ".")
  lines += sorted({f"- {r['title']}: {r['note']}" for r in table["rows"].values() if r.get("note")})
  return "\n".join(lines) + "\n"


def write(folder: epath.Path, table: dict[str, Any]) -> tuple[epath.Path, epath.Path]:
  """folder/glue_finetuned.json and .md, each written whole (`outputs.write_atomic`)."""
  out = []
  for suffix, text in (("json", json.dumps(table, indent=1) + "\n"), ("md", markdown(table))):
    path = folder / f"{NAME}.{suffix}"
    outputs.write_atomic(path, text)  # Trials dispatched at once each write the table.
    out.append(path)
  return out[0], out[1]

"""The frozen-GLUE table: one column per model, one row per GLUE row, the GLUE average; JSON and Markdown.

A row's score for a probe seed is the mean of its metrics (glue.row_score); the cell is the mean over
probe seeds and their standard deviation. The GLUE average is computed per seed over the nine rows,
then averaged (blank unless all nine ran); "mean of the rows run" averages those that did. x100.
"""

import json
from typing import Any

import numpy as np
from etils import epath

from crossbert_jax.evaluation import glue

PROBE_TITLES = {"linear": "Linear probe (logistic regression; ridge for STS-B)", "knn": "KNN probe (cosine)"}


def _stats(values: list[float]) -> dict[str, float]:
  return {"mean": 100 * float(np.mean(values)), "std": 100 * float(np.std(values))}


def summary(results: dict[str, dict[str, dict]], skipped: dict[str, str], sources: dict[str, str],
            settings: dict[str, Any], models: dict[str, dict] | None = None) -> dict[str, Any]:
  """The table as a dict. results: {column: {task: run_model's saved result}}; models: {column: the model and
  its result files} (glue_merge.py)."""
  skipped = {t: why for t, why in skipped.items() if not any(t in by_task for by_task in results.values())}
  rows: dict[str, Any] = {}
  per_seed: dict[str, dict[str, dict[str, list[float]]]] = {c: {p: {} for p in ("linear", "knn")} for c in results}
  for name, task in glue.TASKS.items():
    for row, _ in task.rows:
      entry = {
          "title": glue.ROW_TITLES[row], "metrics": list(task.metrics), "source": sources.get(name),
          "skipped": skipped.get(name), "scores": {}}
      for column, by_task in results.items():
        if name not in by_task:
          continue
        r = by_task[name]
        entry["note"], entry["sizes"] = r["note"], r["sizes"]
        cell = {}
        for probe, metrics in r["rows"][row].items():
          n = len(next(iter(metrics.values())))
          seeds = [glue.row_score({m: v[i] for m, v in metrics.items()}) for i in range(n)]
          per_seed[column][probe][row] = seeds
          cell[probe] = {**_stats(seeds), "metrics": {m: _stats(v) for m, v in metrics.items()}}
        entry["scores"][column] = cell
      rows[row] = entry
  return {
      "benchmark": "glue", "settings": settings, "columns": list(results), "rows": rows,
      "average": {c: _averages(per_seed[c]) for c in results}, "skipped": skipped, "models": models or {}}


def _averages(by_probe: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
  out = {}
  for probe, rows in by_probe.items():
    n = min((len(v) for v in rows.values()), default=0)
    full = [glue.glue_average({r: v[i] for r, v in rows.items()}) for i in range(n)]
    part = [glue.partial_average({r: v[i] for r, v in rows.items()})[0] for i in range(n)]
    out[probe] = {
        "glue": _stats(full) if n and None not in full else None, "rows_run": len(rows),
        "mean_of_rows_run": _stats(part) if n else None}
  return out


def _cell(stats: dict[str, float] | None) -> str:
  return "-" if stats is None else f"{stats['mean']:.1f} ± {stats['std']:.1f}"


def markdown(table: dict[str, Any]) -> str:
  """One section per probe: a row per GLUE row (metric means in brackets for two-metric rows), the averages."""
  cols = table["columns"]
  lines = []
  for probe, title in PROBE_TITLES.items():
    lines += [f"### {title}", "", f"| task | metric | {' | '.join(cols)} |", "|---|---|" + "---:|" * len(cols)]
    for row in table["rows"].values():
      metric = "/".join(glue.METRIC_LABELS[m] for m in row["metrics"])
      cells = []
      for c in cols:
        cell = row["scores"].get(c, {}).get(probe)
        text = _cell(cell)
        if cell and len(row["metrics"]) > 1:
          text += " (" + "/".join(f"{cell['metrics'][m]['mean']:.1f}" for m in row["metrics"]) + ")"
        cells.append(text)
      lines.append(f"| {row['title']} | {metric} | {' | '.join(cells)} |")
    avg = [table["average"][c][probe] for c in cols]
    lines.append(f"| **GLUE average** | 9 rows | {' | '.join(_cell(a['glue']) for a in avg)} |")
    run = [f"{_cell(a['mean_of_rows_run'])} ({a['rows_run']} rows)" for a in avg]
    lines.append(f"| mean of the rows run | | {' | '.join(run)} |")
    lines.append("")
  s = table["settings"]
  lines.append(f"Scores x100: mean ± std over {s['probe_seeds']} probe seeds; dev splits reported (GLUE's test labels "
               "are hidden). Two-metric rows score the mean of their metrics (each in brackets).")
  if table["skipped"]:
    lines.append(f"Skipped (no data): {', '.join(table['skipped'])}.")
  notes = sorted({f"{r['title']}: {r['note']}" for r in table["rows"].values() if r.get("note")})
  lines += [f"- {n}" for n in notes]
  return "\n".join(lines) + "\n"


def write(folder: epath.Path, table: dict[str, Any], name: str = "glue_table") -> tuple[epath.Path, epath.Path]:
  """folder/name.json and .md, written whole each time (a resumed run rewrites both)."""
  folder.mkdir(parents=True, exist_ok=True)
  js, md = folder / f"{name}.json", folder / f"{name}.md"
  js.write_text(json.dumps(table, indent=1) + "\n")
  md.write_text(markdown(table))
  return js, md


def column_table(table: dict[str, Any], column: str) -> dict[str, Any]:
  """The table restricted to one column (what is written into that run's workdir)."""
  rows = {r: {**e, "scores": {c: v for c, v in e["scores"].items() if c == column}} for r, e in table["rows"].items()}
  return {
      **table, "columns": [column], "rows": rows, "average": {column: table["average"][column]},
      "models": {c: m for c, m in table.get("models", {}).items() if c == column}}


def card_scores(table: dict[str, Any], column: str) -> dict[str, float]:
  """{"glue/<row>/<probe>": score (0..1)} plus the averages: what the export's model card lists."""
  out = {}
  for probe in PROBE_TITLES:
    for row, e in table["rows"].items():
      cell = e["scores"].get(column, {}).get(probe)
      if cell:
        out[f"glue/{row}/{probe}"] = round(cell["mean"] / 100, 6)
    avg = table["average"][column][probe]
    if avg["glue"]:
      out[f"glue/average/{probe}"] = round(avg["glue"]["mean"] / 100, 6)
    elif avg["mean_of_rows_run"]:
      out[f"glue/mean_of_{avg['rows_run']}_rows/{probe}"] = round(avg["mean_of_rows_run"]["mean"] / 100, 6)
  return out

"""The MTEB summary table: each task's main score, the mean per task type, Mean (Task), Mean (TaskType).

As the leaderboard computes them: a task's score is mteb's `TaskResult.get_score()` (its main score
averaged over the evaluated splits and subsets), Mean (Task) the mean over tasks, a type's column the
mean over its tasks, Mean (TaskType) the mean of the type columns. A source with any task missing
gets no means (the leaderboard leaves them blank too). Scores are reported x100, as there.
"""

import json
import math
from typing import Any

from etils import epath


def _mean(values: list[float]) -> float | None:
  return sum(values) / len(values) if values and all(v is not None for v in values) else None


def summary(scores: dict[str, dict[str, float | None]], task_types: dict[str, str]) -> dict[str, Any]:
  """{"tasks": {task: {source: score}}, "types": {type: {source: mean}}, "Mean (Task)": ..., ...}.

  scores: {source: {task: main score (0..1) or None when not run}}; task_types: {task: type}.
  """
  tasks = list(task_types)
  types = sorted(set(task_types.values()))
  out: dict[str, Any] = {"tasks": {}, "types": {}, "Mean (Task)": {}, "Mean (TaskType)": {}}
  for task in tasks:
    out["tasks"][
        task] = {s: (None if by[task] is None else 100 * by[task]) if task in by else None for s, by in scores.items()}
  for source in scores:
    per_type = {t: _mean([out["tasks"][k][source] for k in tasks if task_types[k] == t]) for t in types}
    for t in types:
      out["types"].setdefault(t, {})[source] = per_type[t]
    out["Mean (Task)"][source] = _mean([out["tasks"][k][source] for k in tasks])
    out["Mean (TaskType)"][source] = _mean(list(per_type.values()))
  return out


def _cell(x: float | None) -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def markdown(table: dict[str, Any], task_types: dict[str, str]) -> str:
  """The table as markdown: one row per task (with its type), then the type means and the two means."""
  sources = list(table["Mean (Task)"])
  lines = [f"| task | type | {' | '.join(sources)} |", "|---|---|" + "---:|" * len(sources)]
  for task, row in table["tasks"].items():
    lines.append(f"| {task} | {task_types[task]} | {' | '.join(_cell(row[s]) for s in sources)} |")
  for t, row in table["types"].items():
    lines.append(f"| **{t}** | mean | {' | '.join(_cell(row[s]) for s in sources)} |")
  for key in ("Mean (Task)", "Mean (TaskType)"):
    lines.append(f"| **{key}** | | {' | '.join(_cell(table[key][s]) for s in sources)} |")
  return "\n".join(lines) + "\n"


def write(path: epath.Path, table: dict[str, Any], task_types: dict[str, str]) -> None:
  """path (.json) and the same name with .md; written whole each time (a resumed run rewrites both)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({**table, "task_types": task_types}, indent=1, sort_keys=False) + "\n")
  path.with_suffix(".md").write_text(markdown(table, task_types))

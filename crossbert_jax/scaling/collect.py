"""Per-run results of a sweep, read from each run's metrics rows: curves, probes, throughput.

The points of a sweep's curves are its runs of kind "run" (one budget each) and "branch" (a WSD
decay forked from a stable run, one point per budget); stable runs (kind "stable") are trunks
that no curve reads. A point is (size, objective, seed, budget). A point's contrastive run (kind
"contrast", with the spec's `contrast` key) is read apart: `contrast_results`.
"""

import dataclasses
import pathlib

import numpy as np

from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import runner

PROBE_PREFIX = "probe/"
PROBE_KINDS = ("linear", "knn")


@dataclasses.dataclass
class RunResult:
  """What the report needs from one run; probes maps 'task/probe' (and 'avg/probe') to [(step, score)]."""
  run: plan_lib.Run
  done: bool
  steps_logged: int
  loss_curve: np.ndarray  # (n, 2): step, loss.
  probes: dict[str, list[tuple[int, float]]]
  tokens_per_second: float  # Median over steps (robust to the compile step and the probe pauses).
  wall_s: float
  machines: tuple[str, ...] = ()  # What its attempts ran on (`host.describe`); empty: not recorded.
  goodput: float = float("nan")  # Productive share of its wall time, all attempts (run/goodput.py); NaN: none.
  # Each logged step's tokens/s and 1-minute load average (run/recorder.py), the first logged step left out
  # (it compiles); `step_load` is empty for runs from before rows recorded the load.
  step_tps: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
  step_load: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

  @property
  def final_loss(self) -> float:
    """Mean loss over the last 5% of logged steps (single steps are noisy)."""
    if len(self.loss_curve) == 0:
      return float("nan")
    n = max(1, len(self.loss_curve) // 20)
    return float(np.mean(self.loss_curve[-n:, 1]))

  def final_probe(self, key: str) -> float:
    points = self.probes.get(key, [])
    return points[-1][1] if points else float("nan")


def _result(run: plan_lib.Run, run_dir: pathlib.Path) -> RunResult | None:
  try:
    rows = runner.read_rows(run_dir)
  except UserError:
    return None
  by_step = {}
  for row in rows:  # A resumed run may repeat a step: the last row wins.
    by_step[int(row["step"])] = row
  steps = sorted(by_step)
  curve = np.array([(s, by_step[s]["loss"]) for s in steps if by_step[s].get("loss") is not None], float).reshape(-1, 2)
  probes: dict[str, list[tuple[int, float]]] = {}
  for s in steps:
    scores = {k[len(PROBE_PREFIX):]: v for k, v in by_step[s].items() if k.startswith(PROBE_PREFIX) and v is not None}
    for key, value in scores.items():
      probes.setdefault(key, []).append((s, float(value)))
    for kind in PROBE_KINDS:
      per_task = [v for k, v in scores.items() if k.endswith("/" + kind)]
      if per_task:
        probes.setdefault(f"avg/{kind}", []).append((s, float(np.mean(per_task))))
  tps = [by_step[s]["tokens_per_second"] for s in steps[1:] if by_step[s].get("tokens_per_second")]
  load = [by_step[s]["load_avg_1m"] for s in steps[1:] if by_step[s].get("load_avg_1m") is not None]
  wall_file = run_dir / runner.WALL_FILE
  wall = plan_lib.read_json(wall_file, "the run's wall time") if wall_file.is_file() else {}
  goodput = next((by_step[s]["goodput"] for s in reversed(steps) if by_step[s].get("goodput") is not None),
                 float("nan"))
  return RunResult(run, plan_lib.is_done(run_dir), steps[-1] if steps else 0, curve, probes,
                   float(np.median(tps)) if tps else float("nan"), wall.get("wall_s", float("nan")),
                   tuple(wall.get("machines", ())), goodput, np.asarray(tps, float), np.asarray(load, float))


def is_point(run: plan_lib.Run) -> bool:
  """Whether the run is a point of the curves (a plain run or a branch: not a WSD stable trunk, not the
  contrastive stage of a point)."""
  return run.kind not in ("stable", "contrast")


def contrast_results(root: pathlib.Path) -> list[RunResult]:
  """The contrastive runs of the sweep that logged anything (none without the spec's `contrast` key)."""
  runs = [r for r in plan_lib.load_plan(root)[1] if r.kind == "contrast"]
  return [res for run in runs if (res := _result(run, root / "runs" / run.name)) is not None]


def collect(root: pathlib.Path) -> tuple[dict, list[RunResult], list[str]]:
  """(spec, results of the point runs that logged anything, names of point runs with no metrics yet)."""
  spec, runs = plan_lib.load_plan(root)  # A damaged plan.json is one UserError line there.
  results, missing = [], []
  for run in filter(is_point, runs):
    r = _result(run, root / "runs" / run.name)
    (results.append(r) if r is not None else missing.append(run.name))
  if not results:
    raise UserError(f"--root={root}: no run has logged metrics yet; run the sweep first")
  return spec, results, missing


def probe_keys(results: list[RunResult]) -> list[str]:
  """Every 'task/probe' key seen (linear and knn only), the averages first."""
  keys = {k for r in results for k in r.probes if k.split("/")[-1] in PROBE_KINDS}
  return sorted(keys, key=lambda k: (not k.startswith("avg/"), k))


def curve(results: list[RunResult], key: str) -> list[tuple[float, float]]:
  """(training tokens, score) of one (size, objective, seed) over its budgets, by tokens.

  A branch adds its last probe (the end of its decay); a plain run adds every probe it logged.
  """
  points = []
  for r in results:
    probes = r.probes.get(key, [])
    for step, score in (probes[-1:] if r.run.kind == "branch" else probes):
      points.append((float(step * r.run.tokens_per_step), score))
  return sorted(points)


def tokens_to_reach(result: RunResult | list[RunResult], key: str, target: float) -> float:
  """Training tokens at which the probe score first reaches `target` (linear between probes); NaN if never.

  A list of results is one (size, objective, seed) over its budgets (see `curve`).
  """
  points = curve(result if isinstance(result, list) else [result], key)
  prev_tokens, prev_score = 0.0, None
  for tokens, score in points:
    if score >= target:
      if prev_score is None or score == prev_score:
        return tokens
      frac = (target - prev_score) / (score - prev_score)
      return prev_tokens + frac * (tokens - prev_tokens)
    prev_tokens, prev_score = tokens, score
  return float("nan")

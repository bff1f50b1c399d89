"""The report's throughput: tokens/s timed in training, its spread over the logged steps, and the load.

Each run's metrics rows carry the step's tokens/s and the host's 1-minute load average when the
row was made (`load_avg_1m`, run/recorder.py); the first logged step is left out (it compiles).
This is not interleaved timing: each objective's runs ran at their own times, beside whatever else
the machine ran then, so a ratio between objectives moves with the load (two identical tiny
sweeps gave 0.28x and 0.12x). A ratio taken under load is not a finding; `python -m
crossbert_jax.bench` times the objectives' train steps back to back in one process.
"""

import math

import numpy as np

from crossbert_jax.scaling.collect import RunResult

SPREAD = (10, 90)  # Percentiles of the logged steps' tokens/s: the middle 80% (the slowest hold probe pauses).
NOTE = ("Timed in training (each logged step's tokens/s, the first logged step left out: it compiles), not "
        "interleaved: each objective's runs ran at their own times, beside whatever else the machine ran, so "
        "their ratios move with the load, shown as the 1-minute load average read at each logged step. A ratio "
        "taken under load is not a finding; `python -m crossbert_jax.bench` times the objectives' train steps back "
        "to back in one process.")


def _fmt(x: float) -> str:
  """Tokens/s: whole numbers with thousands separators (no exponent), or n/a."""
  return "n/a" if not math.isfinite(x) else f"{x:,.0f}"


def median_tps(results: list[RunResult]) -> float:
  """Median over runs of each run's median tokens/s (robust to a run that shared the CPU with other work)."""
  v = [r.tokens_per_second for r in results if math.isfinite(r.tokens_per_second)]
  return float(np.median(v)) if v else float("nan")


def step_spread(results: list[RunResult]) -> tuple[float, float]:
  """The SPREAD percentiles of the runs' logged steps' tokens/s, pooled; NaN when none was logged."""
  v = np.concatenate([r.step_tps for r in results] or [np.zeros(0)])
  v = v[np.isfinite(v)]
  return tuple(float(x) for x in np.percentile(v, SPREAD)) if len(v) else (float("nan"), float("nan"))


def load(results: list[RunResult]) -> str:
  """'median (max)' of the 1-minute load average over the runs' logged steps, or why there is none."""
  v = np.concatenate([r.step_load for r in results] or [np.zeros(0)])
  v = v[np.isfinite(v)]
  if not len(v):
    return "not recorded"
  unknown = sum(not len(r.step_load) for r in results)
  return f"{np.median(v):.2f} ({v.max():.2f})" + (f"; not recorded for {unknown} of {len(results)} runs"
                                                  if unknown else "")


def bars(results: list[RunResult], labels: list[str], sizes: list[str]) -> dict[tuple[str, str], tuple]:
  """{(size, label): (median, p10, p90) tokens/s} for plots.throughput_bars."""
  out = {}
  for size in sizes:
    for label in labels:
      runs = [r for r in results if r.run.size == size and r.run.label == label]
      out[size, label] = (median_tps(runs), *step_spread(runs))
  return out


def table(results: list[RunResult], labels: list[str], sizes: list[str]) -> list[str]:
  """The section's note and one row per (size, objective): median, the steps' spread, the load."""
  lo, hi = SPREAD
  lines = [
      NOTE, "", f"| size | objective | runs | tokens/s (median of runs' medians) | steps p{lo}-p{hi} | "
      "1-min load avg over steps: median (max) |", "|---|---|---|---|---|---|"]
  for size in sizes:
    for label in labels:
      runs = [r for r in results if r.run.size == size and r.run.label == label]
      if runs:
        p_lo, p_hi = step_spread(runs)
        lines.append(f"| {size} | {label} | {len(runs)} | {_fmt(median_tps(runs))} | {_fmt(p_lo)}-{_fmt(p_hi)} | "
                     f"{load(runs)} |")
  return lines

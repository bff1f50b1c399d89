"""The report's power-law section: one fit per (target, objective), its table, fits.json and figures.

Targets: the training loss on each objective's compute frontier (the best loss per log-FLOPs bin
over all sizes) and 1 - each average probe score on every probe point; warmup (the first 10% of
each run) is left out. Where `fit.fit_power_law` made no fit (too few points, no convergence, an
exponent at its bound, too few bootstrap fits for an interval), the table reads "no fit: <why>",
fits.json has null numbers and the reason, the figure's legend "no fit (<why>)": never a number.
"""

import json
import pathlib
from typing import Any

import numpy as np

from crossbert_jax.scaling import fit, plots
from crossbert_jax.scaling.collect import RunResult

FITS_FILE = "fits.json"


def _targets(keys: list[str]) -> list[tuple[str, str, Any]]:
  """(key, name, extract: run -> (steps, error)) of the loss and of each average probe."""
  out = [("loss", "training loss", lambda r: (r.loss_curve[:, 0], r.loss_curve[:, 1]))]
  for k in keys:
    if k.startswith("avg/"):
      out.append((k, f"1 - {k} score", lambda r, k=k:
                  (np.array([s for s, _ in r.probes.get(k, [])], float), 1 - np.array([
                      v for _, v in r.probes.get(k, [])], float))))
  return out


def _points(results: list[RunResult], label: str, key: str, extract) -> tuple[np.ndarray, np.ndarray]:
  c, y = [], []
  for r in results:
    if r.run.label == label:
      s, v = extract(r)
      keep = s > 0.1 * r.run.steps  # Warmup is schedule, not scaling.
      c.append(s[keep] * r.run.flops_per_step)
      y.append(v[keep])
  c, y = (np.concatenate(c), np.concatenate(y)) if c else (np.array([]), np.array([]))
  return fit.lower_envelope(c, y) if key == "loss" else (c, y)


def cell(law: fit.PowerLaw) -> str:
  """A table cell: alpha [interval] / E (points), or "no fit: <why>"."""
  if not law.fitted:
    return f"no fit: {law.note} ({law.n_points} pts)"
  lo, hi = law.alpha_ci
  return f"{law.alpha:.3f} [{lo:.3f}, {hi:.3f}] / {law.e:.3f} ({law.n_points} pts)"


def as_json(target: str, label: str, law: fit.PowerLaw) -> dict[str, Any]:
  """A fits.json row: the numbers, or null numbers and the reason."""
  numbers = dict.fromkeys(("alpha", "alpha_ci", "e", "e_ci", "a", "c0"))
  if law.fitted:
    numbers = {
        "alpha": law.alpha, "alpha_ci": list(law.alpha_ci), "e": law.e, "e_ci": list(law.e_ci), "a": law.a,
        "c0": law.c0}
  return {
      "target": target, "objective": label, "n_points": law.n_points, "fit": law.fitted,
      "reason": None if law.fitted else law.note, **numbers, "bootstrap_resamples": law.n_boot,
      "bootstrap_fits": law.boot_fits}


def section(results: list[RunResult], labels: list[str], keys: list[str],
            out: pathlib.Path) -> tuple[list[str], list[str]]:
  """(the section's Markdown lines, its figures' names); writes out/fits.json and the figures."""
  targets = _targets(keys)
  laws_by_target, figures, rows = [], [], []
  for key, name, extract in targets:
    points = {label: _points(results, label, key, extract) for label in labels}
    laws = {label: fit.fit_power_law(*points[label]) for label in labels}
    laws_by_target.append(laws)
    rows += [as_json(key, label, laws[label]) for label in labels]
    figures.append(plots.fits(points, laws, name, out / f"fit_{key.replace('/', '_')}.png"))
  rule = {
      "min_points": fit.MIN_POINTS, "alpha_bounds": [0.0, fit.ALPHA_MAX], "level": fit.LEVEL,
      "min_bootstrap_fraction": fit.MIN_BOOT_FRACTION}
  (out / FITS_FILE).write_text(json.dumps({"rule": rule, "fits": rows}, indent=1) + "\n")
  lines = [
      "error = E + A * C^-alpha on each objective's compute frontier (loss: best loss per log-FLOPs bin over all "
      "sizes; probes: every probe point), warmup excluded; 95% bootstrap percentile intervals. A fit is shown only "
      f"where it converged with the exponent inside (0, {fit.ALPHA_MAX:g}) and at least "
      f"{fit.MIN_BOOT_FRACTION:.0%} of the resamples gave a fit; otherwise it reads \"no fit\" with the reason "
      f"(also in `{FITS_FILE}`).", "",
      "| objective | " + " | ".join(f"{name}: alpha [95% CI] / E" for _, name, _ in targets) + " |",
      "|---|" + "---|" * len(targets)]
  for label in labels:
    lines.append(f"| {label} | " + " | ".join(cell(laws[label]) for laws in laws_by_target) + " |")
  return lines, figures

"""The report's PNG figures (matplotlib, Agg backend: no display needed)."""

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402

from crossbert_jax.scaling.collect import RunResult  # noqa: E402
from crossbert_jax.scaling.fit import PowerLaw  # noqa: E402

_STYLES = ("-", "--", ":", "-.")


def _colors(labels: list[str]) -> dict[str, tuple]:
  cmap = plt.get_cmap("tab10")
  return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _save(fig, path: pathlib.Path) -> str:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path.name


def _log_x(ax, **labels) -> None:
  """Log FLOPs axis; with no point drawn (runs too short to plot), a linear one saying so."""
  if any(len(line.get_xdata()) for line in ax.get_lines()) or any(len(c.get_offsets()) for c in ax.collections):
    ax.set(xscale="log", **labels)
  else:
    ax.set(**labels)
    ax.text(0.5, 0.5, "no points yet", ha="center", va="center", transform=ax.transAxes)


def loss_vs_flops(results: list[RunResult], labels: list[str], sizes: list[str], path: pathlib.Path) -> str:
  """One panel per objective: training loss vs FLOPs, one line per size (and seed)."""
  cols = min(3, len(labels))
  rows = -(-len(labels) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, sharey=True)
  size_colors = _colors(sizes)
  for ax, label in zip(axes.flat, labels):
    for r in results:
      if r.run.label == label and len(r.loss_curve):
        ax.plot(r.loss_curve[:, 0] * r.run.flops_per_step, r.loss_curve[:, 1], color=size_colors[r.run.size], lw=0.8,
                label=f"{r.run.size} s{r.run.seed}")
    _log_x(ax, title=label, xlabel="training FLOPs", ylabel="loss (nats)")
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(labels):]:
    ax.axis("off")
  return _save(fig, path)


def probes_vs_flops(results: list[RunResult], labels: list[str], keys: list[str], path: pathlib.Path) -> str:
  """One panel per 'task/probe' key: score vs FLOPs, one colour per objective, one line per run."""
  cols = 4
  rows = -(-len(keys) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
  colors = _colors(labels)
  for ax, key in zip(axes.flat, keys):
    seen = set()
    for r in results:
      points = np.array(r.probes.get(key, []), float).reshape(-1, 2)
      if len(points):
        name = r.run.label if r.run.label not in seen else None
        seen.add(r.run.label)
        ax.plot(points[:, 0] * r.run.flops_per_step, points[:, 1], marker="o", ms=3, lw=0.8, color=colors[r.run.label],
                label=name)
    _log_x(ax, title=key, xlabel="training FLOPs")
  axes.flat[0].legend(fontsize=6)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis("off")
  return _save(fig, path)


def throughput_bars(table: dict[tuple[str, str], tuple[float, float, float]], labels: list[str], sizes: list[str],
                    path: pathlib.Path) -> str:
  """Training tokens/s per (size, objective), grouped by size: table[(size, label)] = (median, p10, p90), the
  whiskers the spread over the logged steps."""
  fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(sizes) * max(1, len(labels)) / 4, 3.6))
  width = 0.8 / max(1, len(labels))
  colors = _colors(labels)
  for j, label in enumerate(labels):
    mid, lo, hi = np.array([table.get((size, label), (np.nan,) * 3) for size in sizes], float).reshape(-1, 3).T
    whiskers = np.nan_to_num(np.stack([mid - lo, hi - mid]).clip(min=0))
    ax.bar(np.arange(len(sizes)) + j * width, mid, width, yerr=whiskers, capsize=2, label=label, color=colors[label])
  ax.set_xticks(np.arange(len(sizes)) + 0.4 - width / 2, sizes)
  ax.set(ylabel="training tokens / s", title="throughput in training: median step, whiskers p10-p90 of steps")
  ax.legend(fontsize=7)
  return _save(fig, path)


def law_label(label: str, law: PowerLaw) -> str:
  """The legend entry of an objective's fit: its exponent and interval, or "no fit" and why (never a number)."""
  if not law.fitted:
    return f"{label}: no fit ({law.reason})"
  return f"{label}: alpha {law.alpha:.3g} [{law.alpha_ci[0]:.3g}, {law.alpha_ci[1]:.3g}]"


def fits_figure(points: dict[str, tuple[np.ndarray, np.ndarray]], laws: dict[str, PowerLaw], ylabel: str):
  """The frontier points per objective and their fitted power law (drawn only where there is a fit)."""
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  colors = _colors(list(points))
  for label, (c, y) in points.items():
    law = laws[label]
    ax.scatter(c, y, s=12, color=colors[label], label=law_label(label, law))
    if law.fitted and len(c):
      grid = np.geomspace(c.min(), c.max(), 50)
      ax.plot(grid, law(grid), color=colors[label], lw=1)
  _log_x(ax, xlabel="training FLOPs", ylabel=ylabel, title=f"{ylabel}: E + A C^-alpha")
  ax.legend(fontsize=7)
  return fig


def fits(points: dict[str, tuple[np.ndarray, np.ndarray]], laws: dict[str, PowerLaw], ylabel: str,
         path: pathlib.Path) -> str:
  return _save(fits_figure(points, laws, ylabel), path)

"""Power laws error = E + A * C^-alpha, fitted with scipy's curve_fit, bootstrap intervals.

C is normalised by its smallest value before fitting (A is then the excess error at the
smallest compute), which keeps the problem well conditioned across many decades of FLOPs.
"""

import dataclasses
import warnings

import numpy as np
from scipy import optimize

MIN_POINTS = 4  # Three parameters: fewer points than this leave no degree of freedom.


@dataclasses.dataclass(frozen=True)
class PowerLaw:
  """A fit and its bootstrap percentile intervals (None when there were too few points)."""
  n_points: int
  e: float | None = None
  a: float | None = None
  alpha: float | None = None
  c0: float | None = None  # The normalisation: error(C) = e + a * (C / c0)^-alpha.
  alpha_ci: tuple[float, float] | None = None
  e_ci: tuple[float, float] | None = None
  note: str = ""

  def __call__(self, c: np.ndarray) -> np.ndarray:
    return self.e + self.a * (np.asarray(c) / self.c0) ** -self.alpha


def _law(x, e, a, alpha):
  return e + a * x ** -alpha


def _law_jacobian(x, e, a, alpha):
  """d(_law)/d(e, a, alpha), exact (finite differences cost most of a fit)."""
  p = x ** -alpha
  return np.stack([np.ones_like(x), p, -a * p * np.log(x)], axis=-1)


def _fit_once(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float] | None:
  lo = float(np.min(y))
  p0 = (0.9 * lo, max(float(y[np.argmin(x)]) - 0.9 * lo, 1e-6), 0.3)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      p, _ = optimize.curve_fit(_law, x, y, p0=p0, bounds=([0.0, 0.0, 0.0], [lo, np.inf, 5.0]), jac=_law_jacobian,
                                maxfev=20000)
  except (RuntimeError, ValueError):
    return None
  return tuple(float(v) for v in p)


def fit_power_law(compute: np.ndarray, error: np.ndarray, n_boot: int = 200, seed: int = 0) -> PowerLaw:
  """Fits error = E + A * C^-alpha; bootstrap (resampling points) 95% intervals on alpha and E."""
  c, y = np.asarray(compute, float), np.asarray(error, float)
  ok = np.isfinite(c) & np.isfinite(y) & (c > 0)
  c, y = c[ok], y[ok]
  n = len(c)
  if n < MIN_POINTS or len(np.unique(c)) < MIN_POINTS:
    return PowerLaw(n, note=f"too few points for a fit ({n} distinct compute values; needs {MIN_POINTS})")
  c0 = float(np.min(c))
  best = _fit_once(c / c0, y)
  if best is None:
    return PowerLaw(n, note="curve_fit did not converge")
  rng = np.random.default_rng(seed)
  boots = []
  for _ in range(n_boot):
    i = rng.integers(0, n, n)
    if len(np.unique(c[i])) >= MIN_POINTS and (p := _fit_once(c[i] / c0, y[i])) is not None:
      boots.append(p)
  boots = np.asarray(boots)
  ci = lambda col: (float(np.percentile(boots[:, col], 2.5)), float(np.percentile(boots[:, col], 97.5)))
  note = "" if len(boots) >= n_boot // 2 else f"only {len(boots)} of {n_boot} bootstrap fits converged"
  return PowerLaw(n, best[0], best[1], best[2], c0, ci(2) if len(boots) else None, ci(0) if len(boots) else None, note)


def lower_envelope(compute: np.ndarray, error: np.ndarray, bins: int = 16) -> tuple[np.ndarray, np.ndarray]:
  """The best error reached in each log-spaced compute bin (the compute-efficient frontier)."""
  c, y = np.asarray(compute, float), np.asarray(error, float)
  ok = np.isfinite(c) & np.isfinite(y) & (c > 0)
  c, y = c[ok], y[ok]
  if len(c) == 0:
    return c, y
  edges = np.geomspace(c.min(), c.max() * (1 + 1e-9), bins + 1)
  which = np.clip(np.searchsorted(edges, c, side="right") - 1, 0, bins - 1)
  xs, ys = [], []
  for b in range(bins):
    in_bin = which == b
    if in_bin.any():
      j = np.argmin(np.where(in_bin, y, np.inf))
      xs.append(c[j])
      ys.append(y[j])
  return np.asarray(xs), np.asarray(ys)

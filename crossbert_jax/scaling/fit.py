"""Power laws error = E + A * C^-alpha, fitted with scipy's curve_fit, bootstrap intervals.

C is normalised by its smallest value before fitting (A is then the excess error at the
smallest compute), which keeps the problem well conditioned across many decades of FLOPs.

A fit is reported (numbers set) only when it is one: at least MIN_POINTS distinct compute values,
a fit that converged with its exponent inside its bounds (an exponent run to 0 or ALPHA_MAX is a
constant or a step, not a power law: E and A are then not determined), and an interval from at
least MIN_BOOT_FRACTION of the bootstrap resamples. Otherwise every number is None and `note`
says why: an interval from a few resamples is no interval (with 4 points only the resamples that
are a permutation of the data, about 9%, have 4 distinct values, and all give the one fit: a
zero-width "interval" of the point estimate). A resample whose exponent stops at a bound counts as a
fit (an estimate under the constraint): leaving it out would narrow the interval away from the bound.
"""

import dataclasses
import warnings

import numpy as np
from scipy import optimize

MIN_POINTS = 4  # Three parameters: fewer points than this leave no degree of freedom.
ALPHA_MAX = 5.0  # The exponent's upper bound in the fit.
# An interval needs at least this share of the resamples to give a fit: the percentiles of fewer are
# those of the resamples that happen to fit (with few points, copies of the data), not an interval.
MIN_BOOT_FRACTION = 0.5
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class PowerLaw:
  """A fit and its bootstrap percentile intervals; every number None when there is no fit (`note`: why)."""
  n_points: int
  e: float | None = None
  a: float | None = None
  alpha: float | None = None
  c0: float | None = None  # The normalisation: error(C) = e + a * (C / c0)^-alpha.
  alpha_ci: tuple[float, float] | None = None
  e_ci: tuple[float, float] | None = None
  note: str = ""  # Why there is no fit, in a sentence; empty when there is one.
  reason: str = ""  # The same in a few words (a figure's legend).
  n_boot: int = 0  # Resamples drawn (0: none, no fit was tried).
  boot_fits: int = 0  # Resamples that gave a fit (the interval's sample).

  @property
  def fitted(self) -> bool:
    return self.alpha is not None

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
      p, _ = optimize.curve_fit(_law, x, y, p0=p0, bounds=([0.0, 0.0, 0.0], [lo, np.inf, ALPHA_MAX]), jac=_law_jacobian,
                                maxfev=20000)
  except (RuntimeError, ValueError):
    return None
  return tuple(float(v) for v in p)


def _at_bound(alpha: float) -> bool:
  return alpha <= 1e-6 or alpha >= ALPHA_MAX * (1 - 1e-6)


def fit_power_law(compute: np.ndarray, error: np.ndarray, n_boot: int = 200, seed: int = 0) -> PowerLaw:
  """Fits error = E + A * C^-alpha; bootstrap (resampling points) 95% intervals on alpha and E, or no fit."""
  c, y = np.asarray(compute, float), np.asarray(error, float)
  ok = np.isfinite(c) & np.isfinite(y) & (c > 0)
  c, y = c[ok], y[ok]
  n = len(c)
  if n < MIN_POINTS or len(np.unique(c)) < MIN_POINTS:
    return PowerLaw(n, reason="too few points",
                    note=f"too few points ({len(np.unique(c))} distinct compute values; a fit needs {MIN_POINTS})")
  c0 = float(np.min(c))
  best = _fit_once(c / c0, y)
  if best is None:
    return PowerLaw(n, reason="did not converge", note="curve_fit did not converge")
  if _at_bound(best[2]):
    bound, shape = (0, "a constant") if best[2] < ALPHA_MAX / 2 else (ALPHA_MAX, "a step")
    return PowerLaw(n, reason="exponent at its bound",
                    note=f"the exponent ran to its bound {bound:g} ({shape}, not a power law: E and A undetermined)")
  rng = np.random.default_rng(seed)
  boots, few = [], 0
  for _ in range(n_boot):
    i = rng.integers(0, n, n)
    if len(np.unique(c[i])) < MIN_POINTS:
      few += 1
    elif (p := _fit_once(c[i] / c0, y[i])) is not None:
      boots.append(p)
  need = int(np.ceil(MIN_BOOT_FRACTION * n_boot))
  if len(boots) < max(need, 2):
    return PowerLaw(
        n, n_boot=n_boot, boot_fits=len(boots), reason="too few bootstrap fits",
        note=f"only {len(boots)} of {n_boot} bootstrap resamples gave a fit (an interval needs {need}; "
        f"{few} had fewer than {MIN_POINTS} distinct compute values, {n_boot - few - len(boots)} did not "
        "converge)")
  boots = np.asarray(boots)
  tail = 100 * (1 - LEVEL) / 2
  ci = lambda col: (float(np.percentile(boots[:, col], tail)), float(np.percentile(boots[:, col], 100 - tail)))
  return PowerLaw(n, best[0], best[1], best[2], c0, ci(2), ci(0), n_boot=n_boot, boot_fits=len(boots))


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

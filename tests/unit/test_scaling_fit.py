"""The power-law fit recovers known exponents from synthetic data, and says when it cannot fit."""

import numpy as np
import pytest

from crossbert_jax.scaling import fit


@pytest.mark.parametrize("e,a,alpha", [(1.7, 2.0, 0.3), (0.2, 0.5, 0.08), (3.0, 5.0, 0.6)])
def test_fit_recovers_known_exponent(e, a, alpha):
  rng = np.random.default_rng(0)
  c = np.geomspace(1e12, 1e16, 12)
  y = e + a * (c / c[0]) ** -alpha
  noisy = y * (1 + 0.003 * rng.standard_normal(len(c)))
  law = fit.fit_power_law(c, noisy, n_boot=100)
  assert law.alpha is not None, law.note
  assert abs(law.alpha - alpha) < 0.15 * alpha, f"alpha {law.alpha:.4f}, true {alpha} (tolerance 15%)"
  assert abs(law.e - e) < 0.05 * e + 0.02, f"E {law.e:.4f}, true {e}"
  lo, hi = law.alpha_ci
  assert lo <= law.alpha <= hi and lo < alpha * 1.2 and hi > alpha * 0.8, f"alpha CI {law.alpha_ci} vs true {alpha}"
  np.testing.assert_allclose(law(c), y, rtol=0.01, err_msg="the fitted curve must follow the data")


def test_too_few_points_is_said_not_fitted():
  law = fit.fit_power_law(np.array([1e12, 1e13, 1e14]), np.array([3.0, 2.5, 2.2]))
  assert law.alpha is None and "too few points" in law.note


def test_lower_envelope_keeps_the_best_point_per_bin():
  c = np.array([1.0, 1.1, 5.0, 20.0, 100.0])  # Two log bins: [1, 10) and [10, 100].
  y = np.array([5.0, 4.0, 4.5, 3.5, 1.0])
  xs, ys = fit.lower_envelope(c, y, bins=2)
  assert list(ys) == [4.0, 1.0] and list(xs) == [1.1, 100.0], (xs, ys)
  assert (np.diff(xs) > 0).all()

"""The learning-rate schedule: the first update is not wasted at learning rate 0."""

import numpy as np

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.training import optimizer


def test_warmup_starts_above_zero_and_reaches_the_peak():
  t = config_lib.get_config("crossbert", "tiny").train
  t.steps, t.warmup_steps, t.learning_rate = 100, 10, 1e-3
  lr = optimizer.learning_rate_schedule(t)
  first = float(lr(0))
  assert first > 0, "step 1 (optax count 0) must run at a non-zero learning rate"
  np.testing.assert_allclose(first, 1e-3 / 10, rtol=1e-6, err_msg="warmup step i runs at peak * (i + 1) / warmup")
  np.testing.assert_allclose(float(lr(9)), 1e-3, rtol=1e-6, err_msg="the last warmup step reaches the peak")
  np.testing.assert_allclose(float(lr(99)), 1e-4, rtol=1e-2, err_msg="the schedule ends at final_lr_ratio * peak")
  assert all(float(lr(i)) <= float(lr(i + 1)) for i in range(9)), "warmup must not decrease"
  t.warmup_steps = 0
  np.testing.assert_allclose(float(optimizer.learning_rate_schedule(t)(0)), 1e-3, rtol=1e-6,
                             err_msg="without warmup the first step runs at the peak")


def _wsd(steps: int, shape: str):
  t = config_lib.get_config("crossbert", "tiny").train
  t.steps, t.warmup_steps, t.learning_rate, t.final_lr_ratio = steps, 4, 1e-3, 0.1
  t.decay, t.decay_fraction, t.decay_shape = "wsd", 0.2, shape
  return optimizer.learning_rate_schedule(t)


def test_wsd_curve_is_pinned():
  """Warmup, the constant peak, then the last 20% of the steps decay to final_lr_ratio * peak."""
  peak, end = 1e-3, 1e-4
  for shape, decayed in (("linear", lambda p: end + (peak - end) * (1 - p)), ("1-sqrt", lambda p: end + (peak - end) *
                                                                              (1 - np.sqrt(p)))):
    lr = _wsd(50, shape)
    want = [peak * (i + 1) / 4 for i in range(4)] + [peak] * 36 + [decayed((i - 40 + 1) / 10) for i in range(40, 50)]
    got = [float(lr(i)) for i in range(50)]
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"wsd {shape}")
    assert optimizer.wsd_decay_start(50, 0.2) == 40
    np.testing.assert_allclose(got[-1], end, rtol=1e-6, err_msg="the last step runs at final_lr_ratio * peak")
  # The stable phase does not depend on train.steps: a 50-step run and a 100-step one agree up to step 40.
  short, long = _wsd(50, "1-sqrt"), _wsd(100, "1-sqrt")
  assert [float(short(i)) for i in range(40)] == [float(long(i)) for i in range(40)]
  assert float(long(79)) == float(long(10)) and float(long(80)) < float(long(79)), "100 steps: stable to step 80"


def test_wsd_is_validated():
  import pytest
  from crossbert_jax.core.errors import UserError
  c = config_lib.get_config("crossbert", "tiny")
  c.train.decay, c.train.steps, c.train.warmup_steps = "wsd", 100, 90
  with pytest.raises(UserError, match="train.warmup_steps"):
    plan_lib.build(c)
  c.train.warmup_steps, c.train.decay_shape = 10, "sqrt"
  with pytest.raises(UserError, match="train.decay_shape"):
    plan_lib.build(c)
  c.train.decay_shape, c.train.decay_fraction = "linear", 0.0
  with pytest.raises(UserError, match="train.decay_fraction"):
    plan_lib.build(c)

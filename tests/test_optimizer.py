"""The learning-rate schedule: the first update is not wasted at learning rate 0."""

import numpy as np

from crossbert_jax.core import config as config_lib
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

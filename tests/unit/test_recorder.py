"""The step recorder: data wait per row, the one input-bound warning, divergence, the outcome."""

import time

import jax.numpy as jnp
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.run import metrics, recorder


def _recorder(tmp_path, warnings):
  c = config_lib.get_config("crossbert", "tiny")
  c.metrics.log_every = 1
  logger = metrics.MetricsLogger(str(tmp_path), total_steps=c.train.steps, start_step=0, enabled=True,
                                 tensorboard=False, progress_bar=False)
  outcome, progress = recorder.Outcome(), recorder.Progress(doing="")
  rec = recorder.StepRecorder(plan_lib.build(c), 1, logger, lambda s: s * 100, progress, outcome, str(tmp_path),
                              warnings.append)
  return rec, logger, outcome


def _device_metrics(loss=2.0):
  return {"loss": jnp.float32(loss), "accuracy": jnp.float32(0.5)}


def _run_steps(rec, n, wait_s, step_s):
  for step in range(1, n + 1):
    t0 = time.perf_counter()
    time.sleep(step_s)
    rec.dispatched(step, _device_metrics(), t0, wait_s)
  rec.flush()


def test_rows_carry_data_wait_and_an_input_bound_run_warns_once(tmp_path):
  warnings = []
  rec, logger, outcome = _recorder(tmp_path, warnings)
  # The host reports 9 ms blocked on input per ~10 ms step: input-bound.
  _run_steps(rec, recorder.DATA_WAIT_WINDOW + 10, wait_s=0.009, step_s=0.01)
  logger.close()
  rows = metrics.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == list(range(1, recorder.DATA_WAIT_WINDOW + 11))
  assert all(r["data_wait_s"] == pytest.approx(0.009) and 0 < r["data_wait_fraction"] <= 1 for r in rows)
  assert len(warnings) == 1 and "pre-tokenized shards" in warnings[0] and "data.worker_count" in warnings[0], warnings
  assert outcome.step == recorder.DATA_WAIT_WINDOW + 10 and outcome.first_loss == 2.0
  assert outcome.as_dict()["status"] == "finished" and outcome.as_dict()["tokens_seen"] == 100 * outcome.step


def test_a_device_bound_run_does_not_warn(tmp_path):
  warnings = []
  rec, logger, _ = _recorder(tmp_path, warnings)
  _run_steps(rec, recorder.DATA_WAIT_WINDOW + 10, wait_s=0.0002, step_s=0.01)
  logger.close()
  assert warnings == []


def test_a_non_finite_loss_stops_with_the_kept_checkpoint(tmp_path):
  rec, logger, _ = _recorder(tmp_path, [])
  rec.dispatched(1, _device_metrics(float("nan")), time.perf_counter(), 0.0)
  with pytest.raises(recorder.TrainingDiverged, match=r"loss is nan at step 1; stopping\. .*no checkpoint was saved"):
    rec.flush()
  logger.close()


def test_the_last_step_is_logged_also_when_the_run_stops_early(tmp_path):
  """A WSD stable run ends at train.stop_at_step: its row is the sweep's proof that it finished."""
  c = config_lib.get_config("crossbert", "tiny")
  c.metrics.log_every, c.train.steps, c.train.stop_at_step = 5, 20, 7
  logger = metrics.MetricsLogger(str(tmp_path), total_steps=c.train.steps, start_step=0, enabled=True,
                                 tensorboard=False, progress_bar=False)
  rec = recorder.StepRecorder(plan_lib.build(c), 1, logger, lambda s: s * 100, recorder.Progress(doing=""),
                              recorder.Outcome(), str(tmp_path), [].append)
  for step in range(1, 8):
    rec.dispatched(step, _device_metrics(), time.perf_counter(), 0.0)
  rec.flush()
  logger.close()
  assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [5, 7]


class _EtaLogger(metrics.MetricsLogger):
  """The real logger (its progress bar on), also keeping the ETA each row was shown with."""
  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.etas = {}

  def log(self, step, scalars, eta_s=None):
    self.etas[step] = eta_s
    super().log(step, scalars, eta_s=eta_s)


def test_with_phases_rows_carry_the_phase_and_the_eta_prices_the_remaining_steps_by_flops(tmp_path):
  from crossbert_jax.core import phases as phases_lib
  c = config_lib.get_config("crossbert", "tiny")
  c.metrics.log_every, c.train.steps = 1, 10
  c.train.phases = ({"steps": 5}, {"data.seq_len": 128})
  phases = phases_lib.expand(c)
  logger = _EtaLogger(str(tmp_path), total_steps=10, start_step=0, enabled=True, tensorboard=False, progress_bar=True,
                      eta_by_work=True)
  tokens_at = lambda s: phases_lib.tokens_between(phases, 0, s)
  rec = recorder.StepRecorder(plan_lib.build(c), 1, logger, tokens_at, recorder.Progress(doing=""), recorder.Outcome(),
                              str(tmp_path), [].append, phases=phases)
  _run_steps(rec, 10, wait_s=0.0, step_s=0.01)
  logger.close()
  rows = {r["step"]: r for r in metrics.read_metrics(str(tmp_path))}
  assert [rows[s]["phase"] for s in range(1, 11)] == [0] * 5 + [1] * 5
  assert [rows[s]["tokens_seen"] for s in (5, 10)] == [5 * 16 * 64, 5 * 16 * 64 + 5 * 16 * 128]
  f0, f1 = rows[1]["flops_per_step"], rows[10]["flops_per_step"]
  assert f1 > 2 * f0  # Twice the tokens per step, and longer attention.
  rate = None  # Seconds per FLOP, smoothed; a start's and a phase's first step (compiles) excluded.
  for s in range(2, 11):
    if s != 6:
      r = rows[s]["step_time"] / rows[s]["flops_per_step"]
      rate = r if rate is None else 0.9 * rate + 0.1 * r
    left = max(0, 5 - s) * f0 + min(5, 10 - s) * f1
    assert logger.etas[s] == pytest.approx(left * rate, rel=1e-9), s
  assert logger.etas[1] is None and logger.etas[10] == 0

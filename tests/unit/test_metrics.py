"""MetricsLogger writes metrics.jsonl (appending across restarts) and TensorBoard, on process 0 only."""

import sys

import jax.numpy as jnp
import numpy as np
import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.run import metrics


def _logger(workdir, **kwargs):
  args = dict(total_steps=10, start_step=0, enabled=True, tensorboard=True, progress_bar=False)
  args.update(kwargs)
  return metrics.MetricsLogger(str(workdir), **args)


def test_jsonl_roundtrip_and_append(tmp_path):
  with _logger(tmp_path, progress_bar=True) as logger:
    for step in (1, 2, 3):
      logger.log(step, {
          "train/loss": jnp.float32(3.0 / step), "tokens_per_sec": np.float64(100.0), "tokens_seen": np.int64(step * 64)
      })
    logger.log_text("hello")
  # A resumed run appends to the same file.
  with _logger(tmp_path, start_step=3) as logger:
    logger.log(4, {"train/loss": float("nan"), "lr": float("inf")})
  rows = metrics.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  assert set(rows[0]) == {"step", "train/loss", "tokens_per_sec", "tokens_seen"}
  assert rows[2]["train/loss"] == pytest.approx(1.0)
  assert rows[2]["tokens_seen"] == 192 and isinstance(rows[2]["tokens_seen"], int)
  # Non-finite values are JSON null, keeping the file strict JSON.
  assert rows[3] == {"step": 4, "train/loss": None, "lr": None}
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents*"))


def test_tensorboard_writes_without_importing_torch(tmp_path, monkeypatch):
  """torch's import is 2-3 s of a training process's start-up, and tensorboardX imports it when it can."""
  for name in [n for n in sys.modules if n.split(".")[0] in ("torch", "tensorboardX")]:
    monkeypatch.delitem(sys.modules, name)  # Put back after the test.
  with _logger(tmp_path) as logger:
    logger.log(1, {"loss": 2.0})
  assert "torch" not in sys.modules
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents*"))


def test_truncated_last_line_is_survived(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
  with _logger(tmp_path, tensorboard=False) as logger:
    logger.log(2, {"loss": 1.5})
  assert metrics.read_metrics(str(tmp_path)) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]


def test_disabled_logger_writes_nothing(tmp_path, capsys):
  workdir = tmp_path / "run"
  logger = _logger(workdir, enabled=False, progress_bar=True)
  logger.log(1, {"loss": 1.0})
  logger.log_text("hidden")
  logger.close()
  assert not workdir.exists()
  assert "hidden" not in capsys.readouterr().out


def test_read_metrics_missing_workdir(tmp_path):
  with pytest.raises(UserError, match="metrics.jsonl"):
    metrics.read_metrics(str(tmp_path / "nope"))

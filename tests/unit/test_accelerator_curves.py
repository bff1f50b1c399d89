"""The accelerator check's curves step: how a path's loss curve is judged against the reference's."""

import sys

import pytest

from tests import helpers

sys.path.insert(0, str(helpers.ROOT / "tools"))
import accelerator_curves  # noqa: E402  (tools/)


def _rows(losses, every=10):
  return [{"step": every * (i + 1), "loss": x} for i, x in enumerate(losses)]


def test_late_loss_is_the_mean_over_the_last_quarter():
  rows = _rows([8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0])  # Steps 10..80: the last quarter is steps 61-80.
  assert accelerator_curves.late_loss(rows + [{"step": 80, "lr": 1.0}], 80) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "seed_gap,path_gap,tracks",
    [
        (0.10, 0.19, True),  # Within twice the seed's gap.
        (0.10, 0.21, False),
        (0.001, 0.015, True),  # A tiny seed gap: the floor (0.02) holds.
        (0.001, 0.025, False),])
def test_a_path_tracks_within_twice_the_seed_gap_or_the_floor(seed_gap, path_gap, tracks):
  paths = {
      "reference": {"late_loss": 5.0}, "seed": {"late_loss": 5.0 - seed_gap}, "cudnn": {"late_loss": 5.0 + path_gap}}
  accelerator_curves.verdicts(paths)
  assert paths["cudnn"]["tracks"] is tracks and paths["cudnn"]["gap"] == pytest.approx(path_gap)
  assert "tracks" not in paths["seed"] and paths["reference"]["gap"] == 0.0


def test_each_path_changes_only_its_keys_over_the_reference(tmp_path):
  """Every path runs ModernBERT's pattern over the dense float32-head reference; only its own keys differ."""
  ref = accelerator_curves.curve_config("bert_r0.15", {}, tmp_path / "spm.model", dry_run=False)
  assert (ref.model.global_every, ref.model.local_window, ref.model.attention, ref.model.head_dtype) == (3, 128, "xla",
                                                                                                         "float32")
  assert (ref.objective, ref.train.steps, ref.data.seq_len, ref.model.dtype) == ("mlm", accelerator_curves.CURVE_STEPS,
                                                                                 256, "bfloat16")
  flat = lambda p: {f"{s}.{k}": v for s, d in p.to_dict().items() if isinstance(d, dict) for k, v in d.items()}
  for name, keys in accelerator_curves.PATHS:
    c = accelerator_curves.curve_config("bert_r0.15", keys, tmp_path / "spm.model", dry_run=False)
    assert {k for k, v in flat(c).items() if flat(ref).get(k) != v} == set(keys), name

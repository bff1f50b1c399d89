"""The training loop's public hooks (run/hooks.py): `run(..., hooks=...)` / `Trainer.add_hook`, in process."""

import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.run import checkpoint, hooks as hooks_lib, metrics, trainer


def test_an_added_hook_runs_at_its_steps_after_the_metrics_and_before_the_save(tmp_path, spm_model):
  """A hook every 2 steps sees its step's config and the run's context; its scores land in that step's
  row; the step's checkpoint is saved after it (the save stage follows the hooks)."""
  c = config_lib.get_config("crossbert", "tiny")
  with c.unlocked():
    c.data.tokenizer, c.model.vocab_size = spm_model, 512
    c.train.steps, c.train.warmup_steps, c.checkpoint.every_steps = 4, 1, 2
    c.metrics.progress_bar = c.metrics.tensorboard = False
    c.metrics.log_every = 100  # Rows at the last step, and at the hook's steps (scores logged).
  workdir = tmp_path / "run"
  seen = []

  def count(info: hooks_lib.StepInfo) -> None:
    saved = checkpoint.Checkpointer.reader(workdir).all_steps() if (workdir / checkpoint.DIRECTORY).exists() else []
    seen.append((info.step, info.config.train.steps, info.context.primary, info.step in saved))
    info.context.log_scores(lambda: {"hook/step": float(info.step)})

  result = trainer.run(plan_lib.build(c), str(workdir), hooks=[hooks_lib.Hook("count", 2, count)])
  assert result["status"] == "finished" and result["hook/step"] == 4.0
  assert seen == [(2, 4, True, False), (4, 4, True, False)]
  rows = {r["step"]: r for r in metrics.read_metrics(str(workdir))}
  assert sorted(rows) == [2, 4] and rows[2]["hook/step"] == 2.0 and rows[4]["hook/step"] == 4.0


def test_hook_names_are_unique():
  t = trainer.Trainer.__new__(trainer.Trainer)  # add_hook needs only the hook list, not a run.
  t.hooks = []
  hook = t.add_hook(lambda info: None, every=3, name="probes")
  assert (hook.name, hook.every) == ("probes", 3) and not hook.due(hooks_lib.StepInfo(2, *[None] * 7))
  with pytest.raises(ValueError, match="'probes' is already added"):
    t.add_hook(lambda info: None, name="probes")
  with pytest.raises(ValueError, match="'metrics' is already added"):
    t.add_hook(lambda info: None, name="metrics")

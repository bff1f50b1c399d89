"""A sweep spec's `contrast` key planned (no run trains): each point followed by its contrastive run, started
from the point's workdir, after it on every executor, and the key's bad values refused in one line."""

import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import placement
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import slurm_executor
from crossbert_jax.scaling import spec as spec_lib

SPEC = '''
def get_spec():
  return dict(
      name="tiny_contrast", variant="tiny", data_path="builtin", tokenizer_vocab_size=512,
      common={"model.vocab_size": 512, "data.seq_len": 32, "train.batch_size": 8, "metrics.tensorboard": False},
      sizes={"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=FLOPS)},
      objectives={"bert_r15": dict(objective="mlm", ratio=0.15, views=1),
                  "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2)},
      seeds=[0], warmup_fraction=0.1, probes=dict(count=2, tasks="stsb", data_dir="DATA", max_examples=50),
      EXTRA
      contrast=CONTRAST)
'''
STAGE = "dict(variant='tiny_simcse', overrides={'train.steps': 4, 'train.batch_size': 8})"


def _spec(tmp_path, flops="3e9", extra="", contrast=STAGE):
  path = tmp_path / "spec.py"
  path.write_text(SPEC.replace("FLOPS", flops).replace("EXTRA", extra).replace("CONTRAST", contrast))
  return spec_lib.load_spec(str(path))


def test_each_point_is_followed_by_its_contrastive_run(tmp_path):
  spec = _spec(tmp_path)
  runs = plan_lib.plan(spec, "/root/tokenizer/spm.model")
  assert [(r.name, r.kind) for r in runs] == [("xs__bert_r15__s0", "run"), ("xs__bert_r15__s0__contrast", "contrast"),
                                              ("xs__cb_r50_k2__s0", "run"), ("xs__cb_r50_k2__s0__contrast", "contrast")]
  stage = runs[1]
  assert stage.fork_from == "xs__bert_r15__s0" and stage.variant == "tiny_simcse" and stage.objective == "contrast"
  assert stage.steps == 4 and stage.overrides["eval.every_steps"] == 2 and stage.overrides["eval.tasks"] == "stsb"
  assert stage.overrides["data.path"] == "builtin" and stage.overrides["train.seed"] == 0
  assert stage.flops == pytest.approx(4 * stage.flops_per_step) and stage.flops_per_step > 0
  argv = plan_lib.train_command(stage, spec, "/root/runs/xs__bert_r15__s0__contrast")
  assert argv[:4] == ["python", "-m", "crossbert_jax.contrast", "--config=configs/contrast.py:tiny_simcse"]
  assert "--config.contrast.init_from=/root/runs/xs__bert_r15__s0" in argv
  assert not any(a.startswith("--config.model.") for a in argv)  # The shape is the point's run's.
  places = placement.placements(spec, runs)
  assert [p.after for p in places] == ["", "xs__bert_r15__s0", "", "xs__cb_r50_k2__s0"]
  assert "--dependency=afterok:" not in slurm_executor.script(places[1], spec, tmp_path, "/repo", "python")
  assert plan_lib.run_config(stage, spec).contrast.recipe == "simcse"


def test_wsd_branches_each_get_a_contrastive_run_and_plans_without_one_keep_their_hash(tmp_path):
  spec = _spec(tmp_path, flops="[2e9, 4e9]", extra="wsd=dict(decay_fraction=0.2, shape='linear'),")
  runs = plan_lib.plan(spec, "tok")
  kinds = [(r.kind, r.fork_from) for r in runs if r.label == "bert_r15"]
  assert [k for k, _ in kinds] == ["stable", "branch", "contrast", "branch", "contrast"]
  assert kinds[2][1] == runs[1].name and kinds[4][1] == runs[3].name  # Each after its own branch, not the trunk.
  plain = {k: v for k, v in spec.items() if k != "contrast"}
  points = plan_lib.plan(plain, "tok")
  assert all(r.variant == "" for r in points)
  assert "variant" not in plan_lib._resolved(points[0])  # pylint: disable=protected-access


@pytest.mark.parametrize("contrast,needle", [
    ("dict(variant='nope')", "config variant 'nope': use one of tiny_pairs"),
    ("dict(variant='tiny_pairs')", "the pairs recipe reads pair files; give contrast.data_path"),
    ("dict(variant='tiny_simcse', overrides={'data.path': 'x'})", "contrast.overrides sets data.path: the sweep"),
    ("dict(variant='tiny_simcse', steps=3)", "contrast: missing keys [], unknown keys ['steps']"),
    ("dict(variant='tiny_simcse', overrides={'train.nope': 1})", "unknown config key 'train.nope'"),])
def test_bad_contrast_keys_are_one_line(tmp_path, contrast, needle):
  with pytest.raises(UserError, match=None) as e:
    plan_lib.plan(_spec(tmp_path, contrast=contrast), "tok")
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)

"""A sweep with a contrastive stage end to end: the point trains, then its contrastive run starts from it (a
subprocess each, as the sweep runs them), and the report compares the probes after the stage with the point's;
the SLURM dry run submits the contrastive run after its point.

The sweep and report commands run in this process (`run_command`); the sweep's trainers are its subprocesses, as
always (on one CPU device: `cpu_env`). The commands' subprocess smoke tests are test_scaling_sweep's."""

import json

import pytest

from crossbert_jax.scaling import plan as plan_lib
from tests.helpers import cpu_env, run_command

SPEC = '''
def get_spec():
  return dict(
      name="tiny_contrast", variant="tiny", data_path="builtin", tokenizer_vocab_size=512,
      common={"model.vocab_size": 512, "data.seq_len": 32, "train.batch_size": 8, "metrics.tensorboard": False},
      sizes={"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=3e9)},
      objectives={"cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2)},
      seeds=[0], warmup_fraction=0.1, probes=dict(count=2, tasks="stsb", data_dir=DATA, max_examples=50),
      contrast=dict(variant="tiny_simcse", overrides={"train.steps": 4, "train.batch_size": 8,
                                                      "checkpoint.every_steps": 1000}))
'''


def _here(module, *args):
  """The command in this process, its exit checked (its trainers are subprocesses on one CPU device: `cpu_env`)."""
  return run_command(module, *args, env=cpu_env(), check=True)


@pytest.mark.slow  # Two training processes and their probes: about a minute on 2 cores.
def test_a_sweep_trains_each_points_contrastive_stage_and_reports_it(tmp_path, shared_data):
  spec_file = tmp_path / "spec.py"
  spec_file.write_text(SPEC.replace("DATA", repr(str(shared_data))))
  root = tmp_path / "sweep"
  sweep = lambda *flags: _here("crossbert_jax.sweep", f"--spec={spec_file}", f"--root={root}", *flags)
  dry = sweep("--dry_run", "--executor=slurm")
  assert "--dependency=afterok:JOB_OF_xs__cb_r50_k2__s0" in dry.stdout and "crossbert_jax.contrast" in dry.stdout
  first = sweep()
  point, stage = root / "runs" / "xs__cb_r50_k2__s0", root / "runs" / "xs__cb_r50_k2__s0__contrast"
  assert plan_lib.is_done(point) and plan_lib.is_done(stage), first.stdout[-2000:]
  assert "(the contrastive stage of xs__cb_r50_k2__s0)" in first.stdout
  assert f"contrast.init_from={point}" in (stage / "train.log").read_text().splitlines()[0]
  rows = [json.loads(l) for l in (stage / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "probe/stsb/linear" in r] == [2, 4]
  again = sweep()
  assert again.stdout.count("done, skipped") == 2
  out = tmp_path / "report"
  _here("crossbert_jax.report", f"--root={root}", f"--output={out}")
  md = (out / "report.md").read_text()
  section = md.split("## After the contrastive stage", 1)[1].split("\n## ", 1)[0]
  assert "`configs/contrast.py:tiny_simcse` on `builtin`" in section
  (row,) = [l for l in section.splitlines() if l.startswith("| xs |")]
  assert row.startswith("| xs | cb_r50_k2 | 3e+09 | 1 |") and "n/a" not in row, section
  assert "1 of 1 points finished" in md  # The contrastive run is not a point of the curves.

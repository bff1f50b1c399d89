"""The sweep planner (equal FLOPs per size) and a tiny two-run sweep end to end: resumable, reported."""

import pytest
import numpy as np

from crossbert_jax.core import host
from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import collect, report
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import spec as spec_lib
from tests.helpers import ROOT, cpu_env, run_command, run_module


def test_every_objective_of_a_size_gets_the_same_flops():
  spec = spec_lib.load_spec(str(ROOT / "experiments" / "gutenberg_cpu.py"))
  runs = plan_lib.plan(spec, "unused.model")
  seeds = {name: size.get("seeds", spec["seeds"]) for name, size in spec["sizes"].items()}
  assert len(runs) == len(spec["objectives"]) * sum(map(len, seeds.values())) and len(spec["sizes"]) >= 3
  assert {(r.size, r.label, r.seed) for r in runs} == {
      (n, l, s) for n in seeds for l in spec["objectives"] for s in seeds[n]}
  assert all(r.overrides["train.seed"] == r.seed for r in runs)
  count = spec["probes"]["count"]
  for size, s in spec["sizes"].items():
    sized = [r for r in runs if r.size == size]
    assert {r.label for r in sized} == set(spec["objectives"])
    assert len({r.flops_per_step for r in sized}) > 1, "objectives differ in FLOPs per step, so in steps"
    for r in sized:
      # Steps are a multiple of the probe count (the last probe lands on the last step), so a run is
      # within count/2 steps of the budget.
      assert r.steps % count == 0 and r.overrides["eval.every_steps"] * count == r.steps
      assert abs(r.flops - s["flops"]) <= count / 2 * r.flops_per_step, (
          f"{r.name}: {r.flops:.4g} FLOPs vs budget {s['flops']:.4g} (step {r.flops_per_step:.3g})")
      assert abs(r.flops - s["flops"]) / s["flops"] < 0.02, f"{r.name}: more than 2% off the budget"


def test_seed_spread_is_mean_and_sample_sd():
  spec = {"objectives": {"bert_r15": {}, "cb_r50_k2": {}}}
  results = []
  for label, losses in (("bert_r15", [3.0, 3.2, 3.4]), ("cb_r50_k2", [2.5])):
    for seed, loss in enumerate(losses):
      run = plan_lib.Run(f"xs__{label}__s{seed}", "xs", label, seed, "mlm", {}, 1e9, 1e7, 100, 256)
      results.append(
          collect.RunResult(run, True, 100, np.array([[100, loss]]), {"avg/knn": [(100, loss / 10)]}, 1000.0 + seed,
                            10.0))
  text = "\n".join(report._seed_spread(spec, results, ["xs"], ["avg/knn"]))  # pylint: disable=protected-access
  assert "| xs | bert_r15 | 3 | 3.2 +- 0.2 | 0.32 +- 0.02 | 1001 +- 1 |" in text, text
  assert "cb_r50_k2" not in text  # One seed: no spread.
  one = report._seed_spread(spec, results[3:], ["xs"], ["avg/knn"])  # pylint: disable=protected-access
  assert one == ["One seed per run: no seed spread measured."]


def _cli(module, *args):
  return run_module([module, *args], check=False, timeout=900)


def _here(module, *args):
  """The command in this process (`run_command`), where the process boundary is not the point; a sweep's trainers
  are still its subprocesses (on one CPU device: `cpu_env`)."""
  return run_command(module, *args, env=cpu_env())


TINY_SPEC = '''
def get_spec():
  return dict(
      name="tiny_two_runs", variant="tiny", data_path="builtin", tokenizer_vocab_size=512,
      common={"model.vocab_size": 512, "data.seq_len": 32, "train.batch_size": 8, "checkpoint.every_steps": 1000,
              "metrics.tensorboard": False},
      sizes={"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=FLOPS)},
      objectives={"bert_r15": dict(objective="mlm", ratio=0.15, views=1),
                  "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2)},
      seeds=[0], warmup_fraction=0.1,
      probes=dict(count=2, tasks="stsb", data_dir=DATA, max_examples=50),
  )
'''


@pytest.mark.slow
def test_tiny_sweep_resumes_and_reports(tmp_path, shared_data):
  spec_file = tmp_path / "tiny.py"
  # ~12 steps per run: seconds of training, two probes each.
  spec_file.write_text(TINY_SPEC.replace("FLOPS", "3e9").replace("DATA", repr(str(shared_data))))
  root = tmp_path / "sweep"
  first = _cli("crossbert_jax.sweep", f"--spec={spec_file}", f"--root={root}")
  assert first.returncode == 0, first.stderr[-3000:]
  runs = plan_lib.load_plan(root)[1]
  assert len(runs) == 2 and all(plan_lib.is_done(root / "runs" / r.name) for r in runs), first.stdout
  metrics_before = {r.name: (root / "runs" / r.name / "metrics.jsonl").read_text() for r in runs}
  # The sweep's and the report's subprocess smoke tests are `first` and `rep`; the rerun only reads the root.
  again = _here("crossbert_jax.sweep", f"--spec={spec_file}", f"--root={root}")
  assert again.returncode == 0 and again.stdout.count("done, skipped") == 2, again.stdout + again.stderr[-2000:]
  assert metrics_before == {r.name: (root / "runs" / r.name / "metrics.jsonl").read_text() for r in runs}
  out = tmp_path / "report"
  rep = _cli("crossbert_jax.report", f"--root={root}", f"--output={out}")
  assert rep.returncode == 0, rep.stderr[-3000:]
  text = (out / "report.md").read_text()
  for section in ("## Training loss vs FLOPs", "## Frozen probes vs FLOPs", "## Throughput", "## Sample efficiency",
                  "## Power-law fits", "## Seed spread", "## What the paper claims", "## Every run"):
    assert section in text, f"report.md lacks {section}"
  for r in runs:
    assert r.name in text, f"the run table lacks {r.name}"
  assert "too few points" in text or "alpha" in text
  assert f"Machines: {host.describe()} (2 runs)." in text  # The sweep's record of each run's machine.
  pngs = sorted(p.name for p in out.glob("*.png"))
  assert {"loss_vs_flops.png", "probes_vs_flops.png", "throughput.png", "fit_loss.png"} <= set(pngs), pngs
  assert all((out / p).stat().st_size > 5000 for p in pngs), "a plot is suspiciously small"


def test_bad_spec_is_one_line_error(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def get_spec():\n  return dict(name='x')\n")
  proc = _here("crossbert_jax.sweep", f"--spec={bad}", f"--root={tmp_path / 'r'}", "--dry_run")
  assert proc.returncode == 2 and proc.stderr.strip().startswith("error:") and "missing keys" in proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("key, value", [("train.phases", ({"steps": 5, "data.seq_len": 64},)),
                                        ("train.batch_ramp.start", 8)])
def test_a_spec_with_phases_is_refused_naming_the_key(tmp_path, key, value):
  """The planner turns FLOPs into steps at one batch x length: phases or a ramp would make every budget wrong."""
  spec_file = tmp_path / "phased.py"
  source = (ROOT / "experiments" / "gutenberg_cpu.py").read_text()
  spec_file.write_text(source + f"\n_base = get_spec\nget_spec = lambda: {{**_base(), 'common': "
                       f"{{**_base()['common'], {key!r}: {value!r}}}}}\n")
  with pytest.raises(UserError, match=f"common sets {key}: a sweep's runs have one shape"):
    spec_lib.load_spec(str(spec_file))


@pytest.mark.parametrize("patch, needle", [
    ("{**_base(), 'seeds': [0, 0]}", "seed 0 is listed twice"),
    ("{**_base(), 'sizes': {**_base()['sizes'], 'again': next(iter(_base()['sizes'].values()))}}",
     "sizes['again'] has the same settings as"),
    ("{**_base(), 'objectives': {**_base()['objectives'], 'again': next(iter(_base()['objectives'].values()))}}",
     "objectives['again'] has the same settings as"),])
def test_a_spec_that_names_a_run_twice_is_refused(tmp_path, patch, needle):
  """Duplicate seeds, or two sizes / objectives with the same settings, would train and report runs twice."""
  spec_file = tmp_path / "twice.py"
  source = (ROOT / "experiments" / "gutenberg_cpu.py").read_text()
  spec_file.write_text(source + f"\n_base = get_spec\nget_spec = lambda: {patch}\n")
  with pytest.raises(UserError, match=needle.replace("[", r"\[").replace("]", r"\]")):
    spec_lib.load_spec(str(spec_file))

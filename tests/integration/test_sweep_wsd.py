"""WSD decay branches in the sweep (planner, cost, runner) and the sweep's reliability:
bad specs refused in one line, one plan per root, atomic state files,
a stop exits 75, a killed sweep takes its trainer with it."""

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from crossbert_jax.core import host
from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import spec as spec_lib
from crossbert_jax.training import optimizer
from crossbert_jax.run import metrics
from tests.helpers import ROOT, cpu_env, run_command, run_module

sys.path.insert(0, str(ROOT / "tools"))
import archive_sweep  # noqa: E402  pylint: disable=g-import-not-at-top
import fault_inject_sweep  # noqa: E402  pylint: disable=g-import-not-at-top

WSD_SPEC = fault_inject_sweep.SPEC.replace("WSD", 'dict(decay_fraction=0.2, shape="1-sqrt")')


def _spec(tmp_path, text: str, name: str = "spec.py") -> str:
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def _sweep_here(spec: str, root, *flags: str):
  """The sweep command in this process (`run_command`): its trainers are still its subprocesses, on one CPU
  device (`cpu_env`). The process boundary is the point of the stop and kill cases below, which start it as a
  subprocess (test_scaling_sweep holds its smoke test)."""
  return run_command("crossbert_jax.sweep", f"--spec={spec}", f"--root={root}", *flags, env=cpu_env(), check=True)


def _wsd_plan(tmp_path, flops="[2e9, 4e9]"):
  probed = WSD_SPEC.replace("count=0", "count=2").replace('data_dir=""', 'data_dir="unused"')
  spec = spec_lib.load_spec(_spec(tmp_path, probed.replace("FLOPS", flops)))
  return spec, plan_lib.plan(spec, "tok.model")


def test_wsd_plan_has_one_stable_run_then_a_branch_per_budget(tmp_path):
  spec, runs = _wsd_plan(tmp_path, "[1e9, 2e9, 4e9]")
  for label in spec["objectives"]:
    mine = [r for r in runs if r.label == label]
    stable, branches = mine[0], mine[1:]
    assert stable.kind == "stable" and stable.name == f"xs__{label}__s0__stable"
    assert [b.kind for b in branches] == ["branch"] * 3 and [b.budget_index for b in branches] == [0, 1, 2]
    steps = [b.steps for b in branches]
    assert steps == sorted(steps) and stable.steps == steps[-1]
    starts = [optimizer.wsd_decay_start(t, 0.2) for t in steps]
    assert [b.fork_step for b in branches] == starts and {b.fork_from for b in branches} == {stable.name}
    assert [b.name for b in branches] == [f"xs__{label}__s0__T{t}" for t in steps]
    assert stable.overrides["train.stop_at_step"] == starts[-1] == stable.end_step
    assert tuple(stable.overrides["checkpoint.keep_steps"]) == tuple(starts)
    assert stable.overrides["eval.every_steps"] == 0 and all(b.overrides["eval.every_steps"] > 0 for b in branches)
    assert len({r.overrides["train.warmup_steps"] for r in mine}) == 1, "one absolute warmup for every budget"
    assert all(r.overrides["train.decay"] == "wsd" for r in mine)
    assert all(b.steps % b.overrides["eval.every_steps"] == 0 for b in branches), "a probe on the last step"
    cmd = plan_lib.train_command(branches[0], spec, f"/r/runs/{branches[0].name}")
    assert cmd[-1] == f"--config.train.fork_from=/r/runs/{stable.name}:{starts[0]}"
    assert "--compilation_cache=/r/compilation_cache" in cmd, "one compilation cache for the sweep's runs"
  cost, independent = plan_lib.total_cost(runs)
  stable_cost = sum(r.cost_flops for r in runs if r.kind == "stable")
  branch_cost = sum((r.steps - r.fork_step) * r.flops_per_step for r in runs if r.kind == "branch")
  assert cost == pytest.approx(stable_cost + branch_cost)
  assert independent == pytest.approx(sum(r.steps * r.flops_per_step for r in runs if r.kind == "branch"))
  assert cost < independent
  # plan.json of a version before the WSD fields still loads: the fields take their defaults.
  old = {k: v for k, v in runs[0].__dict__.items() if k not in ("kind", "fork_from", "fork_step", "budget_index")}
  assert plan_lib.Run(**old).kind == "run"


BAD_SIZES = [("sizes={}", "sizes={}: must be a non-empty dict"), ("seeds=[]", "seeds=[]: must be a non-empty list"),
             ("flops=-3e9", "must be positive finite"), ("flops=0", "must be positive finite"),
             ("flops=float('inf')", "must be positive finite"), ("count=-2", "probes.count=-2"),
             ("sizes=[1]", "must be a non-empty dict"), ("flops=[2e9, 1e9]", "ascending"),
             ("raise", "get_spec() raised ZeroDivisionError")]


@pytest.mark.parametrize("change,needle", BAD_SIZES)
def test_nonsense_specs_are_refused(tmp_path, change, needle):
  text = WSD_SPEC.replace("FLOPS", "[2e9, 4e9]")
  if change == "raise":
    text = text.replace("def get_spec():", "def get_spec():\n  1 / 0")
  elif change.startswith("sizes="):
    text = text.replace("sizes=SIZES", change)
  elif change.startswith("seeds="):
    text = text.replace("seeds=[0]", change)
  elif change.startswith("count="):
    text = text.replace("count=0", change)
  else:
    text = text.replace("flops=[2e9, 4e9]", change)
  with pytest.raises(UserError) as e:
    spec_lib.load_spec(_spec(tmp_path, text))
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_one_plan_per_root_and_damaged_state_files_are_one_line(tmp_path):
  spec, runs = _wsd_plan(tmp_path)
  root = tmp_path / "root"
  plan_lib.save_plan(root, spec, runs, "a.py")
  saved = (root / plan_lib.PLAN_FILE).read_bytes()
  plan_lib.save_plan(root, spec, runs, "a.py")  # The same plan: accepted.
  other_spec, other = _wsd_plan(tmp_path, "[2e9, 8e9]")
  with pytest.raises(UserError) as e:
    plan_lib.save_plan(root, other_spec, other, "b.py")
  msg = str(e.value)
  assert "'tiny_sweep' from a.py" in msg and "--spec=b.py" in msg and "use a new --root" in msg, msg
  assert "the root's FLOPs budgets 2e+09, 4e+09, this command's 2e+09, 8e+09" in msg, msg
  with pytest.raises(UserError, match="changes or drops some of its runs"):  # What sweep --dry_run calls.
    plan_lib.check_plan(root, other_spec, other, "b.py")
  assert (root / plan_lib.PLAN_FILE).read_bytes() == saved, "the old plan was overwritten"
  # A plan that only adds runs (a seed) replaces it; one that then drops them is refused.
  more_spec = spec_lib.load_spec(
      _spec(
          tmp_path,
          WSD_SPEC.replace("count=0", "count=2").replace('data_dir=""', 'data_dir="unused"').
          replace("FLOPS", "[2e9, 4e9]").replace("seeds=[0]", "seeds=[0, 1]"), "c.py"))
  more = plan_lib.plan(more_spec, "tok.model")
  assert plan_lib.save_plan(root, more_spec, more, "c.py") == len(more) - len(runs) == len(runs)
  assert plan_lib.plan_hash(plan_lib.load_plan(root)[1]) == plan_lib.plan_hash(more)
  assert plan_lib.load_plan(root)[0]["seeds"] == [0, 1]
  extended = (root / plan_lib.PLAN_FILE).read_bytes()
  with pytest.raises(UserError) as e:
    plan_lib.save_plan(root, spec, runs, "a.py")
  assert "changes or drops some of its runs" in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert (root / plan_lib.PLAN_FILE).read_bytes() == extended
  # Damaged state files: one line naming the file.
  run_dir = root / "runs" / runs[0].name
  run_dir.mkdir(parents=True)
  (run_dir / plan_lib.DONE_FILE).write_text('{"steps": 1')
  with pytest.raises(UserError, match=f"{run_dir / plan_lib.DONE_FILE}.*damaged"):
    plan_lib.is_done(run_dir)
  (root / plan_lib.PLAN_FILE).write_text(saved.decode()[:100])
  with pytest.raises(UserError, match=f"{root / plan_lib.PLAN_FILE}.*damaged"):
    plan_lib.load_plan(root)
  leftovers = [p.name for p in root.iterdir() if p.name.endswith(".tmp")]
  assert not leftovers


def test_bad_sweep_flags_are_one_line(tmp_path):
  spec = _spec(tmp_path, WSD_SPEC.replace("FLOPS", "[2e9, 4e9]"))
  (tmp_path / "afile").write_text("x")
  txt = _spec(tmp_path, "def get_spec(): pass\n", "spec.txt")
  for args, needle in ((["--flops_scale=inf", f"--root={tmp_path / 'r'}"], "--flops_scale=inf"),
                       ([f"--root={tmp_path / 'afile'}"], "is a file"), ([f"--spec={txt}", f"--root={tmp_path / 'r'}"],
                                                                         "is not a .py file")):
    proc = run_command("crossbert_jax.sweep", f"--spec={spec}", *args, "--dry_run")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("error:") and needle in proc.stderr, proc.stderr


@pytest.mark.slow
def test_wsd_sweep_trains_stable_then_branches_and_prints_the_cost(tmp_path, spm_model):
  one_objective = WSD_SPEC.replace(',\n                  "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2)}',
                                   "}")
  assert one_objective != WSD_SPEC
  spec = _spec(tmp_path, one_objective.replace("FLOPS", "[1e9, 2e9]"))
  root = tmp_path / "sweep"
  fault_inject_sweep.train_tokenizer(root, spm_model)
  dry = _sweep_here(spec, root, "--dry_run")
  assert "total cost:" in dry.stdout and "stable runs" in dry.stdout and "as independent runs" in dry.stdout, dry.stdout
  assert not (root / plan_lib.PLAN_FILE).exists(), "--dry_run writes nothing"
  _sweep_here(spec, root)
  _, runs = plan_lib.load_plan(root)
  assert [r.kind for r in runs] == ["stable", "branch", "branch"]
  for r in runs:
    steps = [row["step"] for row in metrics.read_metrics(str(root / "runs" / r.name))]
    assert steps == list(range(r.fork_step + 1, r.end_step + 1)), f"{r.name}: {steps}"
    assert plan_lib.is_done(root / "runs" / r.name)
  again = _sweep_here(spec, root)
  assert again.stdout.count("done, skipped") == len(runs), again.stdout
  # Another machine: the committed archive brings the finished runs back. The last branch is not in
  # it, so its trunk (no checkpoints in the archive) trains again: bit for bit the same rows.
  archive = tmp_path / "archive"
  archive_sweep.archive(root, archive, stable_every=50)
  shutil.rmtree(archive / "runs" / runs[2].name)
  fresh = tmp_path / "fresh"
  said = archive_sweep.restore(archive, fresh)
  assert said.startswith("restored 1 finished run(s) of 3") and f"not archived: {runs[0].name}" in said, said
  resumed = _sweep_here(spec, fresh)
  assert resumed.stdout.count("done, skipped") == 1 and f"{runs[1].name}: done, skipped" in resumed.stdout
  for r in (runs[0], runs[2]):
    trained = lambda where: [
        (row["step"], row["loss"], row["grad_norm"]) for row in metrics.read_metrics(str(where / "runs" / r.name))]
    assert trained(fresh) == trained(root), f"{r.name} retrained differently"


def test_restore_refuses_another_plan_or_tokenizer_and_overwrites_nothing(tmp_path):
  spec, runs = _wsd_plan(tmp_path)
  archive = tmp_path / "archive"
  plan_lib.save_plan(archive, spec, runs, "spec.py")
  (archive / "tokenizer").mkdir()
  (archive / "tokenizer" / "spm.model").write_bytes(b"pieces")
  for r in runs[1:]:  # All finished but the first trunk.
    (archive / "runs" / r.name).mkdir(parents=True)
    (archive / "runs" / r.name / plan_lib.DONE_FILE).write_text(json.dumps({"steps": r.end_step, "wall_s": 1.0}))
  other_tok = tmp_path / "other_tok"
  (other_tok / "tokenizer").mkdir(parents=True)
  (other_tok / "tokenizer" / "spm.model").write_bytes(b"other pieces")
  with pytest.raises(UserError, match="holds another tokenizer"):
    archive_sweep.restore(archive, other_tok)
  assert sorted(p.name for p in other_tok.iterdir()) == ["tokenizer"]
  other_spec, other_runs = _wsd_plan(tmp_path, "[2e9, 8e9]")
  other_plan = tmp_path / "other_plan"
  plan_lib.save_plan(other_plan, other_spec, other_runs, "spec.py")
  with pytest.raises(UserError, match="holds another sweep's plan"):
    archive_sweep.restore(archive, other_plan)
  fresh = tmp_path / "fresh"
  (fresh / "runs" / runs[1].name).mkdir(parents=True)  # The root's own folder (in progress) is kept.
  said = archive_sweep.restore(archive, fresh)
  assert said.startswith(f"restored {len(runs) - 2} finished run(s)"), said
  assert not list((fresh / "runs" / runs[1].name).iterdir())
  assert all(plan_lib.is_done(fresh / "runs" / r.name) for r in runs[2:])
  _, restored = plan_lib.load_plan(fresh)
  assert plan_lib.plan_hash(restored) == plan_lib.plan_hash(runs)
  assert {r.overrides["data.tokenizer"] for r in restored} == {str(fresh.absolute() / "tokenizer" / "spm.model")}
  cli = subprocess.run([
      sys.executable,
      str(ROOT / "tools" / "archive_sweep.py"), "--restore", f"--root={fresh}", f"--out={tmp_path / 'none'}"],
                       capture_output=True, text=True, timeout=60)
  assert cli.returncode == 2 and cli.stderr.startswith("error: --out=") and "Traceback" not in cli.stderr


def test_sweep_stop_exits_75_and_kill_takes_the_trainer_with_it(tmp_path, spm_model):
  spec = _spec(tmp_path, fault_inject_sweep.SPEC.replace("WSD", "None").replace("FLOPS", "3e10"))
  root = tmp_path / "sweep"
  fault_inject_sweep.train_tokenizer(root, spm_model)
  proc = run_module(["crossbert_jax.sweep", f"--spec={spec}", f"--root={root}"], wait=False)
  fault_inject_sweep.wait_for_training(root, proc)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 75, (proc.returncode, err[-2000:])
  assert err.strip().splitlines()[-1].startswith("stopped:") and "Traceback" not in err, err[-2000:]
  assert not fault_inject_sweep.processes_under(root)
  # kill -9 of the sweep: the trainer dies with it; the attempt's wall time was written as it ran.
  wall = lambda: {p.parent.name: json.loads(p.read_text())["wall_s"] for p in root.glob("runs/*/sweep_wall.json")}
  before = wall()
  assert len(before) == 1, before
  # The next attempt runs "on another machine": the file keeps the first one's name and adds this one.
  wall_file, = root.glob("runs/*/sweep_wall.json")
  assert json.loads(wall_file.read_text())["machines"] == [host.describe()]
  wall_file.write_text(json.dumps({**json.loads(wall_file.read_text()), "machines": ["Elsewhere CPU, 1 CPUs"]}))
  proc = run_module(["crossbert_jax.sweep", f"--spec={spec}", f"--root={root}"], wait=False)
  fault_inject_sweep.wait_for_training(root, proc)
  time.sleep(7)
  after = wall()
  proc.kill()
  proc.communicate(timeout=60)
  fault_inject_sweep.assert_no_orphans(root)
  (name, old), = before.items()
  assert after[name] >= old + 4, f"the killed attempt's wall time was not written as it ran: {before} -> {after}"
  assert json.loads(wall_file.read_text())["machines"] == ["Elsewhere CPU, 1 CPUs", host.describe()]


@pytest.mark.slow
def test_random_kills_of_a_sweep_finish_every_run_once(tmp_path, spm_model):
  """tools/fault_inject_sweep.py, short: 2 random kill -9s of a 2-run sweep (make fault-inject-sweep runs 20)."""
  fault_inject_sweep.run(kills=2, root=tmp_path / "sweep", seed=1, max_delay=4.0, flops=5e9, tokenizer=spm_model)


def test_archive_refuses_bad_outputs_before_writing(tmp_path):
  """--out holding another plan, --stable_every < 1, --out / --root that are files: one line, nothing written."""
  spec, runs = _wsd_plan(tmp_path)
  root = tmp_path / "root"
  plan_lib.save_plan(root, spec, runs, "spec.py")
  other_spec, other_runs = _wsd_plan(tmp_path, "[2e9, 8e9]")
  other = tmp_path / "other_archive"
  plan_lib.save_plan(other, other_spec, other_runs, "spec.py")
  before = (other / plan_lib.PLAN_FILE).read_bytes()
  with pytest.raises(UserError, match="archives another sweep's plan"):
    archive_sweep.archive(root, other, stable_every=50)
  assert (other / plan_lib.PLAN_FILE).read_bytes() == before and sorted(p.name for p in other.iterdir()) == [
      plan_lib.PLAN_FILE]
  for every in (0, -3):
    with pytest.raises(UserError, match=f"--stable_every={every}"):
      archive_sweep.archive(root, tmp_path / "new", stable_every=every)
  assert not (tmp_path / "new").exists()
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  for out in (a_file, a_file / "sub"):
    with pytest.raises(UserError, match="is a file, not a folder"):
      archive_sweep.archive(root, out, stable_every=50)
  with pytest.raises(UserError, match="--root=.* is a file, not a folder"):
    archive_sweep.restore(root, a_file)
  assert a_file.read_text() == "x"
  archive_sweep.archive(root, tmp_path / "same", stable_every=50)  # Archiving the same plan again is fine.
  archive_sweep.archive(root, tmp_path / "same", stable_every=50)

"""sweep --executor=ray on a real local Ray cluster (`ray start --head` on 127.0.0.1, 2 CPUs):
gang-scheduled 2-host runs bitwise equal to the same runs launched by hand, a killed host's run
restarted, a killed driver's sweep finished by the same command, exit 2 never retried."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from crossbert_jax.run import metrics
from crossbert_jax.scaling import placement
from crossbert_jax.scaling import plan as plan_lib
from tests import ray_cluster
from tests.helpers import ROOT, cpu_env, run_module

sys.path.insert(0, str(ROOT / "tools"))
import fault_inject_sweep  # noqa: E402  pylint: disable=g-import-not-at-top

ONE_OBJECTIVE = fault_inject_sweep.SPEC.replace(
    ',\n                  "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2)}',
    "}").replace("WSD", 'dict(decay_fraction=0.2, shape="1-sqrt")')
XS = '"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=[1e9])'
S2 = '"s2": dict(embed_dim=32, num_heads=2, num_layers=2, mlp_dim=64, flops=[1.5e9], hosts=2)'


def _spec(tmp_path, sizes: str, name: str, probes_dir: str = "") -> str:
  text = ONE_OBJECTIVE.replace('{"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=FLOPS)}',
                               "{" + sizes + "}").replace("seeds=[0],", "seeds=[0], max_retries=1,")
  if probes_dir:
    text = text.replace('count=0, tasks="stsb", data_dir=""', f'count=2, tasks="stsb", data_dir={probes_dir!r}')
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def _sweep(spec: str, root: pathlib.Path, *args: str, wait: bool = True):
  return run_module(["crossbert_jax.sweep", f"--spec={spec}", f"--root={root}", *args], check=False, wait=wait,
                    timeout=1500, env={**ray_cluster.ENV, "PYTHONPATH": str(ROOT)})


def _rows(workdir: pathlib.Path) -> dict[int, tuple]:
  """step -> (loss, grad_norm); a step trained twice (again after a restart) must agree bit for bit."""
  out = {}
  for r in metrics.read_metrics(str(workdir)):
    row = (r["loss"], r["grad_norm"])
    assert out.setdefault(r["step"], row) == row, f"{workdir}: step {r['step']} retrained differently"
  return out


def _trainer(workdir: pathlib.Path, needle: str = "") -> int | None:
  """The pid of a live trainer of `workdir` whose command line also holds `needle`."""
  for pid in ray_cluster.processes_under(f"--workdir={workdir}"):
    try:
      if needle.encode() in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
        return pid
    except OSError:
      continue
  return None


def _wait_for_checkpoint(workdir: pathlib.Path, proc, needle: str = "", timeout: float = 600) -> int:
  """Waits until a trainer of `workdir` runs and has saved a step; its pid."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    pid = _trainer(workdir, needle)
    if pid and any(p.name.isdigit() for p in (workdir / "checkpoints").glob("*")):
      return pid
    time.sleep(0.5)
  raise AssertionError(f"no checkpointing trainer of {workdir} within {timeout} s")


def _by_hand(p: placement.Placement, spec: dict, workdir: pathlib.Path) -> None:
  """The run as a user launches it: its hosts as processes on this machine, joined by jax.distributed."""
  coordinator = f"127.0.0.1:{ray_cluster.free_port()}"
  procs = [
      subprocess.Popen(placement.host_command(p, spec, str(workdir), sys.executable, i, coordinator), cwd=ROOT,
                       env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
      for i in range(p.hosts)]
  errs = [proc.communicate(timeout=900)[1] for proc in procs]
  assert all(proc.returncode == 0 for proc in procs), errs[0][-3000:] + errs[-1][-3000:]


@pytest.mark.slow
def test_ray_ladder_with_two_host_runs_and_a_killed_host(tmp_path, spm_model):
  """2 sizes (1 host; 2 hosts) x WSD (stable + a branch): every run finishes; host 1 of the 2-host
  stable run is killed -9 mid-run and the run restarts whole; the 2-host runs equal the same runs
  launched by hand, step by step; the 1-host runs equal what `--executor=local` trains."""
  spec_file = _spec(tmp_path, f"{XS}, {S2}", "ladder.py")
  root = tmp_path / "ray_root"
  fault_inject_sweep.train_tokenizer(root, spm_model)
  cluster = ray_cluster.LocalCluster(tmp_path, num_cpus=2)
  try:
    proc = _sweep(spec_file, root, "--executor=ray", f"--ray_address={cluster.address}", wait=False)
    stable = root / "runs" / "s2__bert_r15__s0__stable"
    os.kill(_wait_for_checkpoint(stable, proc, "--process_id=1"), signal.SIGKILL)
    out, err = proc.communicate(timeout=1500)
  finally:
    cluster.stop()
  assert proc.returncode == 0, out[-3000:] + err[-3000:]
  assert "s2__bert_r15__s0__stable: attempt ended: host 1: exit -9" in out and "restarting the run (1/1)" in out, out
  spec, runs = plan_lib.load_plan(root)
  assert all(plan_lib.is_done(root / "runs" / r.name) for r in runs) and len(runs) == 4
  wall = json.loads((stable / "sweep_wall.json").read_text())
  assert [a["outcome"] for a in wall["attempts"]] == ["retry", "done"], wall
  assert all(len(a["hosts"]) == 2 and a["dispatch_s"] is not None for a in wall["attempts"]), wall
  hand = tmp_path / "hand" / "runs"
  for p in placement.placements(spec, runs):
    if p.hosts == 2:  # The stable run first: the branch forks from its sibling under hand/runs.
      _by_hand(p, spec, hand / p.run.name)
      assert _rows(root / "runs" / p.run.name) == _rows(hand / p.run.name), p.run.name
  local_root = tmp_path / "local_root"
  fault_inject_sweep.train_tokenizer(local_root, spm_model)
  local = _sweep(_spec(tmp_path, XS, "xs_only.py"), local_root)
  assert local.returncode == 0, local.stderr[-3000:]
  for r in runs:
    if r.size == "xs":
      assert _rows(root / "runs" / r.name) == _rows(local_root / "runs" / r.name), r.name
  report = run_module(["crossbert_jax.report", f"--root={root}", f"--output={tmp_path / 'report'}"], timeout=600)
  assert "## Every run" in (tmp_path / "report" / "report.md").read_text(), report.stdout


@pytest.mark.slow
def test_ray_driver_killed_then_rerun_and_exit_2_not_retried(tmp_path, spm_model):
  """kill -9 of the driver mid-run takes its trainer along; the same command resumes the run from its
  checkpoint (not from scratch) and finishes it; a branch that exits 2 (its probe data is missing)
  is tried once, and the sweep ends with one line naming it, exit 1."""
  spec_file = _spec(tmp_path, XS, "xs.py", probes_dir=str(tmp_path / "no_such_probe_data"))
  root = tmp_path / "root"
  fault_inject_sweep.train_tokenizer(root, spm_model)
  cluster = ray_cluster.LocalCluster(tmp_path, num_cpus=2)
  args = ("--executor=ray", f"--ray_address={cluster.address}")
  stable = root / "runs" / "xs__bert_r15__s0__stable"
  try:
    proc = _sweep(spec_file, root, *args, wait=False)
    _wait_for_checkpoint(stable, proc)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.time() + 60
    while _trainer(stable) and time.time() < deadline:
      time.sleep(0.5)
    assert not _trainer(stable), "the killed driver's trainer lives on"
    trained = _rows(stable)
    again = _sweep(spec_file, root, *args)
  finally:
    cluster.stop()
  assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
  branch = next(p.name for p in (root / "runs").iterdir() if "__T" in p.name)
  assert again.stderr.strip().splitlines()[-1] == (
      f"sweep failed: 1 run(s): {branch} (host 0: exit 2 (a user error: not retried))"), again.stderr[-2000:]
  assert plan_lib.is_done(stable) and not plan_lib.is_done(root / "runs" / branch)
  wall = json.loads((stable / "sweep_wall.json").read_text())
  assert [a["outcome"] for a in wall["attempts"]] == ["interrupted", "done"], wall
  rows = _rows(stable)
  assert {k: rows[k] for k in trained} == trained and len(rows) > len(trained) > 0
  assert sorted(rows) == list(range(1, max(rows) + 1))
  log = (stable / "train.log").read_text()
  assert log.count("$ ") == 2 and "resuming from step" in log.split("$ ")[-1], log[-3000:]
  assert [a["outcome"] for a in json.loads((root / "runs" / branch / "sweep_wall.json").read_text())["attempts"]
         ] == ["failed"]

"""sweep --executor=slurm against a real one-node SLURM (slurmctld + slurmd + munged on 127.0.0.1,
started by the test as root): a branch after its stable run (afterok), a stopped trainer (exit 75)
requeued and resumed, a rerun that re-attaches instead of submitting twice. Skips, saying why, where
SLURM cannot start (the dry run of the same path is tested in tests/integration/test_sweep_executors.py)."""

import json
import os
import pathlib
import signal
import time

import pytest

from crossbert_jax.scaling import plan as plan_lib
from tests import ray_cluster, slurm_cluster
from tests.helpers import ROOT, run_module
from tests.slow.test_sweep_ray import XS, _rows, _spec, _wait_for_checkpoint
import fault_inject_sweep  # noqa: E402  pylint: disable=g-import-not-at-top  (tools/, on sys.path via test_sweep_ray)


@pytest.mark.slow
def test_slurm_sweep_requeues_a_stopped_run_and_a_rerun_reattaches(tmp_path, spm_model):
  if why := slurm_cluster.available():
    pytest.skip(f"no one-node SLURM here: {why}")
  spec_file = _spec(tmp_path, XS, "xs.py")
  root = tmp_path / "root"
  fault_inject_sweep.train_tokenizer(root, spm_model)
  cluster = slurm_cluster.OneNode(tmp_path)
  env = {**ray_cluster.ENV, **{"SLURM_CONF": cluster.env["SLURM_CONF"]}, "PYTHONPATH": str(ROOT)}
  sweep = lambda: run_module(["crossbert_jax.sweep", f"--spec={spec_file}", f"--root={root}", "--executor=slurm"], env=
                             env, check=False, timeout=300)
  try:
    first = sweep()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    stable, branch = (root / "runs" / r.name for r in plan_lib.load_plan(root)[1])
    job = json.loads((stable / "slurm_job.json").read_text())["job"]
    assert f"{branch.name}: submitted as job" in first.stdout and f"(after job {job})" in first.stdout, first.stdout
    again = sweep()  # Re-attach: both jobs are in SLURM's queue; nothing is submitted twice.
    assert again.returncode == 0 and "submitted as job" not in again.stdout, again.stdout
    assert again.stdout.count("is queued or running, left as it is") == 2, again.stdout
    _wait_for_checkpoint(stable, _Alive(), timeout=600)
    os.kill(_python_trainer(stable), signal.SIGTERM)  # The trainer saves and exits 75: the job requeues itself.
    deadline = time.time() + 900
    while time.time() < deadline and not plan_lib.is_done(branch):
      time.sleep(2)
    last = sweep()
  finally:
    cluster.stop()
  assert plan_lib.is_done(stable) and plan_lib.is_done(branch), (stable / "train.0.log").read_text()[-3000:]
  assert last.returncode == 0 and last.stdout.count("done, skipped") == 2, last.stdout
  assert json.loads((stable / "slurm_exit.json").read_text())["restart"] == 1, "the stopped job was not requeued"
  rows = _rows(stable)
  assert sorted(rows) == list(range(1, max(rows) + 1))
  log = (stable / "train.0.log").read_text()
  assert "resuming from step" in log and "exit 75" in log, log[-3000:]


def _python_trainer(workdir) -> int:
  """The trainer's own pid. srun's command line holds the same train command and lists first (a lower pid):
  a SIGTERM to srun cancels the step and SIGKILLs the trainer mid-save (exit 137, no requeue), which is what
  kept this test from finishing before 2026-12-05."""
  for pid in ray_cluster.processes_under(f"--workdir={workdir}"):
    argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if argv[1:3] == [b"-m", b"crossbert_jax.train"]:
      return pid
  raise AssertionError(f"no trainer of {workdir} runs")


class _Alive:
  """A stand-in for a driver process: the SLURM sweep returns at once, the jobs run on."""
  def poll(self):
    return None

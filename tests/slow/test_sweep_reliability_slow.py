"""Stop signals and a second driver, on real processes (issue 49): SIGTERM and Ctrl-C (SIGINT) to a Ray
sweep driver on a real local Ray cluster (every trainer saves, exit 75, the attempt closed as
"stopped"), and a second sweep driver on a root whose first driver is training (refused in one
line; the first driver's wall time stays its own)."""

import json
import os
import pathlib
import re
import signal
import time

import pytest

from crossbert_jax.scaling import plan as plan_lib
from tests import ray_cluster
from tests.helpers import ROOT, run_module
from tests.slow.test_sweep_ray import XS, _rows, _spec, _trainer, _wait_for_checkpoint
import fault_inject_sweep  # noqa: E402  pylint: disable=g-import-not-at-top  (tools/, on sys.path via test_sweep_ray)


def _long_spec(tmp_path, flops: str = "1e10") -> str:
  """The tiny WSD spec of test_sweep_ray with more FLOPs (1e10: ~430 stable steps) and a checkpoint every 20
  steps: the trainer is still training when the signal comes."""
  path = pathlib.Path(_spec(tmp_path, XS.replace("flops=[1e9]", f"flops=[{flops}]"), "long.py"))
  path.write_text(path.read_text().replace('"checkpoint.every_steps": 2', '"checkpoint.every_steps": 20'))
  return str(path)


def _saved(workdir: pathlib.Path) -> int:
  return max((int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()), default=0)


def _sweep(spec: str, root: pathlib.Path, *args: str, wait: bool = True):
  return run_module(["crossbert_jax.sweep", f"--spec={spec}", f"--root={root}", *args], check=False, wait=wait,
                    timeout=900, env={**ray_cluster.ENV, "PYTHONPATH": str(ROOT)})


def _no_partial_saves(workdir: pathlib.Path) -> None:
  partial = [p.name for p in (workdir / "checkpoints").glob("*") if not p.name.isdigit()]
  assert not partial, f"{workdir}: a save was cut short: {partial}"


def _wait_for_pending_sigterm(pid: int, driver, timeout: float = 120) -> None:
  """Waits until SIGTERM is pending in the (stopped) process `pid`: the driver's stop has reached it."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    pending = {k: int(v, 16) for k, v in re.findall(r"^(SigPnd|ShdPnd):\s*([0-9a-f]+)$", status, re.M)}
    if any(mask >> (signal.SIGTERM - 1) & 1 for mask in pending.values()):
      return
    assert driver.poll() is None, f"the driver exited {driver.returncode} before its stop reached the trainer"
    time.sleep(0.1)
  raise AssertionError(f"the driver's SIGTERM did not reach the trainer (pid {pid}) within {timeout:.0f} s")


@pytest.mark.slow
def test_sigterm_and_ctrl_c_to_the_ray_driver_save_every_trainer_and_exit_75(tmp_path, spm_model):
  """SIGTERM, then (after a rerun) SIGINT to the driver while its trainer trains: the driver exits 75 with
  one `stopped:` line, the trainer saved (exit 75, no partial checkpoint) and is gone, the attempt is
  closed as "stopped" (not left "running"), and a rerun resumes from the saved step.
  Before: rc 1 within 2 s (`SystemError` from ray.wait), the trainer killed mid-save.
  The trainer is paused (SIGSTOP) from its save until the driver's SIGTERM is pending in it: it cannot reach its
  last step first, however loaded the cores, and a stop that never reaches it fails by name. That is what made
  this test fail before (its trainer "ended before the stop reached it" at 1e10, 3e10 and 1e11 FLOPs): the driver
  relied on Ray's graceful cancel, which once had not reached the running task after 120 s; it now writes the
  run's stop file, which the host task polls."""
  spec_file = _long_spec(tmp_path)
  root = tmp_path / "root"
  fault_inject_sweep.train_tokenizer(root, spm_model)
  stable = root / "runs" / "xs__bert_r15__s0__stable"
  cluster = ray_cluster.LocalCluster(tmp_path, num_cpus=2)
  args = ("--executor=ray", f"--ray_address={cluster.address}")
  try:
    saved, deadline = 0, time.time() + 900
    for sig, attempt in ((signal.SIGTERM, 1), (signal.SIGINT, 2)):
      proc = _sweep(spec_file, root, *args, wait=False)
      trainer = _wait_for_checkpoint(stable, proc)
      while _saved(stable) <= saved:  # This attempt's own first save: its trainer is past startup.
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
      before = _saved(stable)
      os.kill(trainer, signal.SIGSTOP)
      try:
        proc.send_signal(sig)
        _wait_for_pending_sigterm(trainer, proc)
      finally:
        os.kill(trainer, signal.SIGCONT)
      out, err = proc.communicate(timeout=300)
      assert proc.returncode == 75, f"{sig.name}: rc {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
      assert err.strip().splitlines()[-1].startswith(f"stopped: {sig.name} received"), err[-3000:]
      assert "Traceback" not in err and "SystemError" not in err, err[-3000:]
      assert not os.path.exists(f"/proc/{trainer}") or _trainer(stable) is None, "the trainer outlived the driver"
      _no_partial_saves(stable)
      log = (stable / "train.log").read_text().split("$ ")[-1]
      assert "done: step" not in log, f"{sig.name}: the trainer ended before the stop reached it\n{log[-3000:]}"
      assert "SIGTERM received: saving step" in log and "(exit 75)" in log, log[-3000:]
      attempts = json.loads((stable / "sweep_wall.json").read_text())["attempts"]
      assert [a["outcome"] for a in attempts] == ["stopped"] * attempt, attempts
      assert "host 0: exit 75" in attempts[-1]["cause"] and sig.name in attempts[-1]["cause"], attempts[-1]
      saved = _saved(stable)
      stop_step = int(re.search(r"SIGTERM received: saving step (\d+)", log).group(1))
      assert saved == stop_step >= before and (stable / "checkpoints" / str(saved)).is_dir(), (saved, stop_step)
    again = _sweep(spec_file, root, *args)
  finally:
    cluster.stop()
  assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
  assert plan_lib.is_done(stable)
  rows = _rows(stable)
  assert sorted(rows) == list(range(1, max(rows) + 1))
  assert "resuming from step" in (stable / "train.log").read_text().split("$ ")[-1]


@pytest.mark.slow
def test_a_second_driver_on_the_same_root_is_refused_in_one_line(tmp_path, spm_model):
  """While a driver trains a run, a second `sweep` on the same root is refused in one line and touches
  nothing: the first driver's attempt is not marked "interrupted" and its wall time stays its own.
  Before: the second driver started the same run (refused by the workdir lock, exit 2) and rewrote
  the run's sweep_wall.json. The lease of a driver killed with -9 does not block the next one."""
  spec_file = _long_spec(tmp_path)
  root = tmp_path / "root"
  fault_inject_sweep.train_tokenizer(root, spm_model)
  stable = root / "runs" / "xs__bert_r15__s0__stable"
  first = _sweep(spec_file, root, wait=False)
  try:
    _wait_for_checkpoint(stable, first)
    wall_before = json.loads((stable / "sweep_wall.json").read_text())["wall_s"]
    t0 = time.time()
    second = _sweep(spec_file, root)
    err = second.stderr.strip()
    assert second.returncode == 2 and err.splitlines() == [err], second.stdout[-2000:] + err[-3000:]
    assert err.startswith(f"error: --root={root} is in use by another sweep driver (") and (f"pid {first.pid},"
                                                                                            in err), err
    assert "starting" not in second.stdout and "resuming" not in second.stdout, second.stdout
    wall = json.loads((stable / "sweep_wall.json").read_text())
    assert wall["wall_s"] <= wall_before + (time.time() - t0) + 6, (wall, wall_before)  # Only the first's clock.
    first.kill()  # kill -9: its lease must not block the next driver.
    first.communicate(timeout=60)
    again = _sweep(spec_file, root)
  finally:
    if first.poll() is None:
      first.kill()
      first.communicate(timeout=60)
  assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
  assert "breaking the lock" in again.stdout and plan_lib.is_done(stable), again.stdout[-2000:]

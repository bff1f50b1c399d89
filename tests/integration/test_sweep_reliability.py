"""sweep --executor=ray|slurm, refused before anything is written or queued (issue 49): a failed squeue
stops the re-attach, no SLURM commands, resources the SLURM script cannot express, a batch the run's
devices cannot split, an address that answers but is not Ray, a bad RAY_ADDRESS named as such, a
config key through a leaf. tests/slow/test_sweep_reliability_slow.py: stop signals, a second driver."""

import http.server
import json
import pathlib
import shutil
import sys
import threading
import time

import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import slurm_executor
from tests import ray_cluster
from tests.helpers import ROOT, run_command, run_module
from tests.integration.test_sweep_executors import _places, _spec_file


def _one_line_refusal(proc, needle: str) -> str:
  err = proc.stderr.strip()
  assert proc.returncode == 2 and err.splitlines() == [err] and err.startswith("error: "), proc.stderr[-3000:]
  assert needle in err, err
  return err


def _sweep(tmp_path, spec: str, *args: str, env: dict | None = None, in_process: bool = True):
  """The sweep command in this process (`run_command`), or in a subprocess where it talks to Ray (a Ray client
  connection stays in the process that makes it)."""
  args = [f"--spec={spec}", f"--root={tmp_path / 'r'}", *args]
  if in_process:
    return run_command("crossbert_jax.sweep", *args, env=env)
  return run_module(["crossbert_jax.sweep", *args], check=False, timeout=300,
                    env={**ray_cluster.ENV, "PYTHONPATH": str(ROOT), **(env or {})})


def test_a_failed_squeue_stops_the_reattach_and_submits_nothing(tmp_path, monkeypatch):
  """squeue against a controller that does not answer (exit 1, as a transient socket timeout) must not read
  as "no job queued": nothing is resubmitted, no script or job record is touched."""
  if shutil.which("squeue") is None:
    pytest.skip("squeue is not installed here (apt-get install slurm-client)")
  conf = tmp_path / "slurm.conf"  # A controller on a closed port: the real squeue fails as it does on a timeout.
  conf.write_text("\n".join([
      "ClusterName=down", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={ray_cluster.free_port()}",
      f"AuthInfo=socket={tmp_path}/munge.sock", "MessageTimeout=1", "TCPTimeout=1",
      "NodeName=localhost CPUs=1 State=UNKNOWN", "PartitionName=debug Nodes=ALL Default=YES", ""]))
  monkeypatch.setenv("SLURM_CONF", str(conf))
  spec, places = _places(tmp_path, hosts="hosts=2")
  root = tmp_path / "root"
  records = {}
  for i, p in enumerate(places[:3]):  # Three live jobs of an earlier submission.
    path = root / "runs" / p.run.name / slurm_executor.JOB_FILE
    path.parent.mkdir(parents=True)
    path.write_text(records.setdefault(path, json.dumps({"job": str(101 + i), "after": ""})))
  lines = []
  with pytest.raises(UserError) as e:
    slurm_executor.submit(places, spec, root, str(ROOT), sys.executable, log=lines.append)
  msg = str(e.value)
  assert msg.startswith("--executor=slurm: squeue failed (exit 1: ") and "nothing was submitted" in msg, msg
  assert "\n" not in msg and lines == [], (msg, lines)
  assert not list(root.rglob(slurm_executor.SCRIPT)), "a script was written for a resubmission"
  assert {p: p.read_text() for p in records} == records, "a job record was overwritten"


def test_slurm_without_its_commands_is_refused_before_anything_is_written(tmp_path):
  """No sbatch on PATH: one line, exit 2, before plan.json, the tokenizer or a script."""
  proc = _sweep(tmp_path, _spec_file(tmp_path), "--executor=slurm",
                env={"PATH": str(pathlib.Path(sys.executable).parent)})
  _one_line_refusal(proc, "--executor=slurm: sbatch, squeue, scontrol not found on PATH")
  assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("hosts, needle", [
    ("hosts=2, resources={'GPU': 0.5}", "SLURM gives whole GPUs (GPU: 0.5)"),
    ("hosts=2, resources={'TPU': 4}", "the SLURM executor asks only for CPUs and GPUs per node, not 'TPU'"),
    ("slice='v5p:2x2x2'", "slice='v5p:2x2x2': the SLURM executor has no TPU slices"),])
def test_slurm_refuses_resources_its_script_cannot_express(tmp_path, hosts, needle):
  """Before: the dry run printed a plain CPU job (or one without --gpus-per-node) for each of these."""
  proc = _sweep(tmp_path, _spec_file(tmp_path, hosts=hosts), "--executor=slurm", "--dry_run")
  _one_line_refusal(proc, needle)
  assert "#SBATCH" not in proc.stdout


def test_the_batch_check_counts_the_devices_a_run_will_have(tmp_path):
  """2 hosts x 8 GPUs are 16 devices: a batch of 8 cannot split over them (the trainer would refuse it
  after queueing); 2 hosts x 4 GPUs divide it."""
  _places(tmp_path, hosts="hosts=2, resources={'GPU': 4}")
  with pytest.raises(UserError) as e:
    _places(tmp_path, hosts="hosts=2, resources={'GPU': 8}")
  assert str(e.value).startswith("spec sizes['s2']: s2__bert_r15__s0__stable has 16 devices (2 host(s) x 8), "
                                 "whose mesh data*fsdp = 16 does not divide its micro-batch of 8"), str(e.value)
  _places(tmp_path, hosts="slice='v5p:2x2x2'")  # 2 hosts x 4 chips divide 8.
  with pytest.raises(UserError, match="has 16 devices"):
    _places(tmp_path, hosts="slice='v5p:2x2x4'")  # 4 hosts x 4 chips do not.


class _NotRay(http.server.BaseHTTPRequestHandler):
  def do_GET(self):  # noqa: N802 - http.server's name.
    self.send_response(200)
    self.end_headers()

  def log_message(self, *args):
    pass


def test_an_address_that_answers_but_is_not_ray_is_one_quick_line(tmp_path):
  """An HTTP server at --ray_address: one line within seconds (before: 20 lines of gcs_client.cc over 24 s)."""
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotRay)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  address = f"127.0.0.1:{server.server_address[1]}"
  try:
    t0 = time.time()
    proc = _sweep(tmp_path, _spec_file(tmp_path), "--executor=ray", f"--ray_address={address}", in_process=False)
    took = time.time() - t0
  finally:
    server.shutdown()
  _one_line_refusal(proc, f"--ray_address={address}: something answers there but not a Ray cluster's GCS")
  assert took < 60 and not (tmp_path / "r").exists(), took


def test_a_bad_ray_address_from_the_environment_is_named_as_such(tmp_path):
  proc = _sweep(tmp_path, _spec_file(tmp_path), "--executor=ray", env={"RAY_ADDRESS": "127.0.0.1:1"}, in_process=False)
  _one_line_refusal(
      proc, "error: RAY_ADDRESS=127.0.0.1:1 (from the environment; --ray_address overrides it): "
      "no Ray cluster answers there")
  assert "--ray_address=127.0.0.1:1" not in proc.stderr


def test_a_spec_key_through_a_leaf_is_an_unknown_key():
  """train.steps.x names no section: one line (before: TypeError: argument of type 'int' is not iterable)."""
  with pytest.raises(UserError, match=r"^sweep spec: unknown config key 'train.steps.x' \(every key: "):
    plan_lib.make_config("mlm", "tiny", {"train.steps.x": 3})

"""sweep --executor=ray|slurm, the fast part: placement plans, bad inputs refused before anything
starts, the attempts record, the SLURM scripts. tests/slow/test_sweep_ray.py trains on a real cluster."""

import json
import re
import shutil

import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import attempts as attempts_lib
from crossbert_jax.scaling import placement
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import spec as spec_lib
from tests import ray_cluster
from tests.helpers import run_command, run_module
from tests.integration.test_sweep_wsd import WSD_SPEC

TWO_SIZES = WSD_SPEC.replace("FLOPS", "[2e9]").replace(
    'SIZES = {"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=[2e9])}',
    'SIZES = {"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=[2e9]),\n'
    '         "s2": dict(embed_dim=32, num_heads=2, num_layers=2, mlp_dim=64, flops=[3e9], HOSTS)}')


def _spec_file(tmp_path, hosts="hosts=2", extra="", name="spec.py"):
  text = TWO_SIZES.replace("HOSTS", hosts)
  if extra:
    text = text.replace("seeds=[0],", f"seeds=[0], {extra},")
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def _places(tmp_path, **kw):
  spec = spec_lib.load_spec(_spec_file(tmp_path, **kw))
  placement.check_spec(spec)
  return spec, placement.placements(spec, plan_lib.plan(spec, "tok.model"))


def test_placement_plan_names_hosts_resources_and_order(tmp_path):
  spec, places = _places(tmp_path, hosts="hosts=2, resources={'CPU': 1, 'GPU': 4}", extra="max_concurrent=3")
  by_name = {p.run.name: p for p in places}
  assert len(places) == 8 and {p.hosts for p in places if p.run.size == "s2"} == {2}
  assert {p.hosts for p in places if p.run.size == "xs"} == {1}
  assert all(p.bundle == {"CPU": 1} for p in places if p.run.size == "xs")
  for p in places:
    assert (p.after == p.run.fork_from) and (bool(p.after) == (p.run.kind == "branch"))
    if p.after:
      assert by_name[p.after].run.kind == "stable"
  lines = placement.plan_lines(places, "ray", spec)
  assert "at most 3 at once" in lines[0] and "up to 3 retries" in lines[0], lines[0]
  row = next(l for l in lines if l.startswith("s2__cb_r50_k2__s0__T"))
  assert re.search(r"\s2\s+CPU:1, GPU:4\s+s2__cb_r50_k2__s0__stable$", row), row
  assert lines[-2:] == ["wave 0: 4 run(s) may train at once", "wave 1: 4 run(s) may train at once"]
  # Host i's trainer: the run's own command, then jax.distributed's coordinator, count and id.
  p = by_name["s2__bert_r15__s0__stable"]
  cmd = placement.host_command(p, spec, "/r/runs/x", "py", 1, "10.0.0.5:1234")
  assert cmd[:len(cmd) - 4] == plan_lib.train_command(p.run, spec, "/r/runs/x", "py")
  assert cmd[-4:] == ["--jax_distributed", "--coordinator_address=10.0.0.5:1234", "--num_processes=2", "--process_id=1"]
  one = by_name["xs__bert_r15__s0__stable"]
  assert placement.host_command(one, spec, "/w", "py", 0, "h:1") == plan_lib.train_command(one.run, spec, "/w", "py")


def test_a_tpu_slice_sets_hosts_and_chips():
  assert placement.slice_hosts("v5p:2x2x4", "s") == (4, 4)
  assert placement.slice_hosts("v5p:2x2x1", "s") == (1, 4)
  assert placement.slice_hosts("v6e:2x4", "s") == (1, 8)
  assert placement.slice_hosts("v6e:4x4", "s") == (4, 4)
  with pytest.raises(UserError, match="'v5p-32': give a TPU slice as <version>:<topology>"):
    placement.slice_hosts("v5p-32", "s")


@pytest.mark.parametrize("hosts, extra, needle", [
    ("hosts=0", "", "hosts=0: must be an integer >= 1"),
    ("hosts=3", "", "3 hosts do not divide s2__bert_r15__s0__stable's batch of 8 sequences"),
    ("resources={'GPU': -1}", "", "resources={'GPU': -1}: must be a dict of resource name -> positive amount"),
    ("slice='v5p:2x2x4', hosts=2", "", "hosts=2 but slice 'v5p:2x2x4' has 4 hosts"),
    ("hosts=2", "max_concurrent=0", "max_concurrent=0: must be an integer >= 1"),
    ("hosts=2", "max_retries=-1", "max_retries=-1: must be an integer >= 0"),])
def test_bad_placement_keys_are_one_line(tmp_path, hosts, extra, needle):
  with pytest.raises(UserError) as e:
    _places(tmp_path, hosts=hosts, extra=extra)
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_verdicts_retry_preemptions_and_crashes_never_user_errors():
  assert placement.verdict(0)[0] == "done"
  assert placement.verdict(2) == ("failed", "exit 2 (a user error: not retried)")
  assert placement.verdict(75)[0] == placement.verdict(-9)[0] == placement.verdict(1)[0] == "retry"
  assert placement.verdict(None, lost="NodeDiedError") == ("retry", "host lost (NodeDiedError)")


def test_attempts_record_keeps_the_local_fields_and_marks_an_interrupted_attempt(tmp_path):
  (tmp_path / attempts_lib.WALL_FILE).write_text(json.dumps({"wall_s": 10.0, "machines": ["A"]}))
  rec = attempts_lib.Record(tmp_path, "ray")
  rec.start(["10.0.0.1", "10.0.0.2"], ["B", "B"], queued_s=1.5)
  saved = json.loads((tmp_path / attempts_lib.WALL_FILE).read_text())
  assert saved["machines"] == ["A", "B"] and saved["wall_s"] >= 10.0
  assert saved["attempts"][0]["outcome"] == "running" and saved["attempts"][0]["hosts"] == ["10.0.0.1", "10.0.0.2"]
  again = attempts_lib.Record(tmp_path, "ray")  # A new driver: the old one died mid-attempt.
  assert again.attempts[0]["outcome"] == "interrupted"
  again.start(["10.0.0.3"], ["B"], queued_s=0.0)
  total = again.end("retry", "exit 75")
  again.end("failed", "host 0: exit 2")  # Ended before its hosts started: recorded all the same.
  saved = json.loads((tmp_path / attempts_lib.WALL_FILE).read_text())
  assert [a["outcome"] for a in saved["attempts"]] == ["interrupted", "retry", "failed"]
  assert [a["attempt"] for a in saved["attempts"]] == [1, 2, 3] and saved["wall_s"] == total >= 10.0


def _sweep(tmp_path, *args, spec=None, in_process=True):
  """The sweep command in this process (`run_command`), or in a subprocess where it talks to Ray."""
  args = [f"--spec={spec or _spec_file(tmp_path)}", f"--root={tmp_path / 'r'}", *args]
  if in_process:
    return run_command("crossbert_jax.sweep", *args)
  return run_module(["crossbert_jax.sweep", *args], check=False, timeout=300)


def test_bad_executor_inputs_are_one_line_and_start_nothing(tmp_path):
  """An unknown executor, no cluster at --ray_address, hosts that do not divide the batch: exit 2, nothing written."""
  for args, spec, needle in ((["--executor=kubernetes"], None,
                              "--executor=kubernetes: unknown executor; use one of local, ray, slurm"),
                             (["--executor=ray",
                               "--ray_address=127.0.0.1:1"], None, "--ray_address=127.0.0.1:1: no Ray cluster answers"),
                             (["--executor=ray", "--dry_run"], _spec_file(tmp_path, "hosts=3",
                                                                          name="three.py"), "3 hosts do not divide")):
    proc = _sweep(tmp_path, *args, spec=spec, in_process="--ray_address=127.0.0.1:1" not in args)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("error: ") and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_slurm_dry_run_prints_each_job_with_its_dependency_and_requeue(tmp_path):
  proc = _sweep(tmp_path, "--executor=slurm", "--dry_run")
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = proc.stdout
  assert "placement (slurm): 8 runs" in out and not (tmp_path / "r").exists()
  submits = re.findall(r"^# sbatch --parsable (.*)$", out, re.M)
  assert len(submits) == 8, out
  branch = next(s for s in submits if "s2__bert_r15__s0__T" in s)
  assert branch.startswith("--dependency=afterok:JOB_OF_s2__bert_r15__s0__stable "), branch
  assert all(s.startswith(str(tmp_path / "r" / "runs")) for s in submits if "__stable" in s.split("/")[-2]), submits
  stable = out.split("s2__bert_r15__s0__stable/slurm.sbatch\n", 1)[1].split("exit \"$rc\"", 1)[0]
  assert "#SBATCH --nodes=2" in stable and "#SBATCH --ntasks-per-node=1" in stable and "--requeue" in stable
  assert "--jax_distributed" in stable and "scontrol requeue" in stable and "$rc -eq 75" in stable
  assert "--config.train.stop_at_step=" in stable and "sweep_done.json" in stable


def test_a_run_the_cluster_cannot_hold_is_refused_before_anything_starts(tmp_path, monkeypatch):
  """A local Ray (ray.init, 2 CPUs): 3 hosts of 1 CPU, or any host of 8 GPUs, never fit; 2 hosts do."""
  ray = pytest.importorskip("ray")
  from crossbert_jax.scaling import ray_executor  # pylint: disable=g-import-not-at-top

  temp_dir = ray_cluster.short_temp_dir()
  monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # Else ray.init writes ~/.ray/auth_token (tests/ray_cluster.py).
  ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False, _temp_dir=temp_dir)
  try:
    _, places = _places(tmp_path, hosts="hosts=2")
    ray_executor.check_capacity(places, "local")
    for hosts, needle in (("hosts=4", "a run needs 4 host(s) of {'CPU': 1} but the Ray cluster at local has room "
                           "for 2 (1 node(s), {'CPU': 2.0} in all)"), ("resources={'GPU': 8}",
                                                                       "a run needs 1 host(s) of {'GPU': 8}")):
      _, places = _places(tmp_path, hosts=hosts)
      with pytest.raises(UserError) as e:
        ray_executor.check_capacity(places, "local")
      assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    ray_executor.check_shared_root(tmp_path / "r")  # One node: any root will do.
    assert ray.available_resources().get("CPU") == 2.0, "a check took a CPU"
  finally:
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)

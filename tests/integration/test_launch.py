"""The launchers' dry runs: the gcloud / srun commands they would run, flag by flag."""

import os
import pathlib
import shlex
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TPU_ENV = {"TPU": "cb-v5p-64", "ZONE": "us-east5-a", "ACCELERATOR": "v5p-64"}
TRAIN_FLAGS = [
    "--config=configs/crossbert.py:base", "--workdir=gs://bkt/runs/cb base",
    "--config.data.path=gs://bkt/corpus/*.arrayrecord", "--config.model.dtype=float32"]


def _sh(script: str, *args: str, env: dict | None = None, cwd=ROOT) -> subprocess.CompletedProcess:
  full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TPU", "ZONE", "SPOT"))}
  full_env.update(env or {})
  return subprocess.run(["bash", str(ROOT / script), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                        timeout=60)


def _commands(r: subprocess.CompletedProcess) -> list[list[str]]:
  assert r.returncode == 0, r.stderr
  return [shlex.split(line) for line in r.stdout.splitlines() if line and not line.startswith("#")]


def _tpu(*args: str, **env: str) -> list[list[str]]:
  return _commands(_sh("launch/tpu.sh", "--dry-run", *args, env={**TPU_ENV, **env}))


def _ssh_command(argv: list[str]) -> str:
  assert argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"], argv
  (command,) = [a.removeprefix("--command=") for a in argv if a.startswith("--command=")]
  return command


def test_tpu_create_on_demand_and_queued_spot():
  (create,) = _tpu("create")
  assert create == [
      "gcloud", "compute", "tpus", "tpu-vm", "create", "cb-v5p-64", "--zone=us-east5-a", "--accelerator-type=v5p-64",
      "--version=v2-alpha-tpuv5"]
  queued, describe = _tpu("create", SPOT="1", PROJECT="proj")
  assert queued[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "cb-v5p-64"]
  assert {"--spot", "--node-id=cb-v5p-64", "--runtime-version=v2-alpha-tpuv5", "--project=proj"} <= set(queued)
  assert describe[4] == "describe"


def test_tpu_setup_copies_the_checkout_to_every_worker_and_installs_jax_tpu(tmp_path):
  tar_line, scp, ssh = _sh("launch/tpu.sh", "--dry-run", "setup",
                           env={**TPU_ENV, "TMPDIR": str(tmp_path)}).stdout.strip().splitlines()
  assert scp.startswith("gcloud compute tpus tpu-vm scp ") and "--worker=all" in scp
  # The archive step itself is local and harmless: run it and look inside.
  subprocess.run(tar_line, shell=True, check=True, cwd=ROOT)
  archive = tmp_path / "crossbert_jax-cb-v5p-64.tar.gz"
  assert str(archive) in scp
  with tarfile.open(archive) as tar:
    names = set(tar.getnames())
  assert {
      "requirements.txt", "requirements-tpu.txt", "launch/tpu_worker.sh", "crossbert_jax/train.py",
      "configs/crossbert.py"} <= names
  assert not any(n.startswith((".venv", "runs/")) for n in names)
  argv = shlex.split(ssh)
  assert "--worker=all" in argv
  install = _ssh_command(argv)
  assert "python3.11 -m venv .venv-tpu" in install
  assert ".venv-tpu/bin/python -m pip install -q -r requirements.txt -r requirements-tpu.txt" in install
  assert "jax[tpu]==0.10.2" in (ROOT / "requirements-tpu.txt").read_text()


def test_tpu_run_starts_one_detached_trainer_per_worker_with_its_own_log():
  (ssh,) = _tpu("run", *TRAIN_FLAGS)
  assert "--worker=all" in ssh  # gcloud runs the command once on every worker: one process each.
  remote = shlex.split(_ssh_command(ssh).split("(", 1)[1].split(">", 1)[0])
  assert remote[:4] == ["setsid", "nohup", "bash", "launch/tpu_worker.sh"]
  assert remote[4:] == TRAIN_FLAGS  # Quoted through both shells intact, in order.
  assert "> logs/worker-$(hostname).log 2>&1 < /dev/null &" in _ssh_command(ssh)


def test_tpu_logs_stop_delete_and_errors():
  (logs,) = _tpu("logs", WORKER="3")
  assert "--worker=3" in logs and "logs/worker-*.log" in _ssh_command(logs)
  (stop,) = _tpu("stop")
  assert "--worker=all" in stop and "touch logs/STOP" in _ssh_command(stop)
  assert "kill -TERM -- -$(cat logs/worker.pid)" in _ssh_command(stop)
  (delete,) = _tpu("delete")
  assert delete[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "cb-v5p-64"] and "--quiet" in delete
  r = _sh("launch/tpu.sh", "--dry-run", "run", env={"ZONE": "z"})
  assert r.returncode == 2 and r.stderr.strip() == "error: set TPU to the TPU VM name, e.g. TPU=cb-v5p-64"
  r = _sh("launch/tpu.sh", "--dry-run", "reboot", env=TPU_ENV)
  assert r.returncode == 2 and r.stderr.startswith("error: unknown command 'reboot'")


def test_tpu_worker_reruns_the_trainer_while_it_exits_75(tmp_path):
  # The loop runs `.venv-tpu/bin/python -m crossbert_jax.train ...` from the checkout; here that
  # python is a script that exits 75 (resumable) twice, then 3, and records each call.
  (tmp_path / "launch").mkdir()
  (tmp_path / "launch" / "tpu_worker.sh").write_text((ROOT / "launch" / "tpu_worker.sh").read_text())
  python = tmp_path / ".venv-tpu" / "bin" / "python"
  python.parent.mkdir(parents=True)
  python.write_text('#!/usr/bin/env bash\necho "$*" >> calls.txt\n'
                    'n=$(wc -l < calls.txt); if [ "$n" -le 2 ]; then exit 75; fi; exit 3\n')
  python.chmod(0o755)
  r = subprocess.run(["bash", "launch/tpu_worker.sh", "--config=configs/crossbert.py:tiny", "--workdir=w"],
                     cwd=tmp_path, env={**os.environ, "RESTART_DELAY": "0"}, capture_output=True, text=True, timeout=60)
  assert r.returncode == 3, r.stdout + r.stderr
  calls = (tmp_path / "calls.txt").read_text().splitlines()
  assert calls == ["-m crossbert_jax.train --jax_distributed --config=configs/crossbert.py:tiny --workdir=w"] * 3
  assert (tmp_path / "logs" / "worker.pid").read_text().strip().isdigit()
  # A stop request ends the loop even on a resumable exit.
  (tmp_path / "calls.txt").unlink()
  (tmp_path / "logs" / "STOP").touch()
  r = subprocess.run(["bash", "launch/tpu_worker.sh", "--workdir=w"], cwd=tmp_path,
                     env={**os.environ, "RESTART_DELAY": "0"}, capture_output=True, text=True, timeout=60)
  assert r.returncode == 75 and len((tmp_path / "calls.txt").read_text().splitlines()) == 1


def _slurm(*args: str, **env: str) -> list[list[str]]:
  return _commands(_sh("launch/slurm_gpu.sbatch", "--dry-run", *args, env=env))


def test_slurm_one_process_per_gpu_install_then_requeue_on_75():
  header = [
      line.split()[1]
      for line in (ROOT / "launch/slurm_gpu.sbatch").read_text().splitlines()
      if line.startswith("#SBATCH")]
  assert {"--ntasks-per-node=8", "--gpus-per-node=8", "--requeue"} <= set(header)
  assert not any(h.startswith("--gpus-per-task") for h in header)  # Would hide the other GPUs from a task.
  mkdir, make, srun, requeue = _slurm(*TRAIN_FLAGS)
  assert mkdir[:2] == ["mkdir", "-p"] and make == ["make", "setup-gpu"]
  assert srun[0] == "srun" and "--ntasks-per-node=8" in srun and "--gpu-bind=none" in srun
  tail = srun[srun.index("-m"):]
  # The trainer's flags come first and whole: a --config.* override before --config fails to parse.
  assert tail == ["-m", "crossbert_jax.train", "--jax_distributed", *TRAIN_FLAGS]
  assert requeue == ["scontrol", "requeue", "DRYRUN"]
  # SLURM's own environment for 4-GPU nodes.
  _, _, srun4, _ = _slurm(*TRAIN_FLAGS, SLURM_NTASKS_PER_NODE="4", SLURM_GPUS_PER_NODE="h100:4", SLURM_JOB_ID="77")
  assert "--ntasks-per-node=4" in srun4 and "--output=logs/crossbert-77/task-%t.log" in srun4


def test_slurm_mismatched_tasks_and_gpus_is_one_line():
  r = _sh("launch/slurm_gpu.sbatch", "--dry-run", *TRAIN_FLAGS,
          env={"SLURM_NTASKS_PER_NODE": "1", "SLURM_GPUS_PER_NODE": "8"})
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and "one process per GPU" in r.stderr


def test_slurm_trainer_flags_parse_in_the_trainer():
  # The exact argv srun would start, through the trainer's own flag parser (absl + config_flags).
  _, _, srun, _ = _slurm(*TRAIN_FLAGS)
  argv = srun[srun.index("crossbert_jax.train") + 1:]
  code = ("import sys; from absl import flags; import crossbert_jax.train; flags.FLAGS(['train', *sys.argv[1:]]); "
          "c = flags.FLAGS.config; print(c.model.dtype, flags.FLAGS.workdir, flags.FLAGS.jax_distributed)")
  r = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                     env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == ["float32", "gs://bkt/runs/cb", "base", "True"]


@pytest.mark.parametrize("script", [
    "launch/tpu.sh", "launch/tpu_worker.sh", "launch/slurm_gpu.sbatch", "launch/local_multiprocess.sh"])
def test_launchers_are_valid_bash(script):
  assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0

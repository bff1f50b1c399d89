"""A real one-node SLURM for tests: munged, slurmctld and slurmd on 127.0.0.1, in a temp dir.

Debian's `slurm-wlm` and `munge` packages, run as root with their own config, sockets, state and
free ports, so they touch no system daemon. `stop()` cancels the cluster's jobs and ends the
three daemons it started, by their pids. `env` is what sbatch/squeue need to find it (SLURM_CONF).
"""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel")


def available() -> str:
  """'' when a one-node SLURM can start here, else why not."""
  missing = [b for b in BINARIES if shutil.which(b) is None]
  if missing:
    return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
  if os.geteuid() != 0:
    return "slurmd must run as root"
  if not pathlib.Path("/etc/munge/munge.key").is_file():
    return "no /etc/munge/munge.key"
  return ""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class OneNode:
  """munged + slurmctld + slurmd for node `hostname -s` with `cpus` CPUs, partition `debug`."""
  def __init__(self, tmp: pathlib.Path, cpus: int = 2):
    self.dir = tmp / "slurm"
    for sub in ("state", "spool"):
      (self.dir / sub).mkdir(parents=True, exist_ok=True)
    host, d = socket.gethostname().split(".")[0], self.dir
    conf = d / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=crossbert_test", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={d}/munge.sock", f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
        f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid", f"SlurmctldLogFile={d}/slurmctld.log",
        f"SlurmdLogFile={d}/slurmd.log", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "ReturnToService=2", "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none", "MinJobAge=600", f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    self.env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run([
        "munged", f"--socket={d}/munge.sock", f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
        f"--seed-file={d}/munge.seed", "--force"], check=True, timeout=30)
    subprocess.run(["slurmctld", "-f", str(conf)], env=self.env, check=True, timeout=30)
    subprocess.run(["slurmd", "-f", str(conf)], env=self.env, check=True, timeout=30)
    deadline = time.time() + 60
    while time.time() < deadline:
      out = subprocess.run(["sinfo", "--noheader", "--format=%t"], env=self.env, capture_output=True, text=True)
      if out.stdout.strip() == "idle":
        return
      time.sleep(1)
    self.stop()
    raise RuntimeError(f"the one-node SLURM did not come up: {(d / 'slurmctld.log').read_text()[-2000:]}")

  def stop(self) -> None:
    """Cancels every job of this cluster, then ends its daemons (by the pids they wrote)."""
    subprocess.run(["scancel", "--user=root"], env=self.env, capture_output=True, timeout=60)
    time.sleep(2)
    for name in ("slurmd", "slurmctld", "munged"):
      pid_file = self.dir / f"{name}.pid"
      try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
      except (OSError, ValueError, IndexError):
        continue
      deadline = time.time() + 20
      while time.time() < deadline and pathlib.Path(f"/proc/{pid}").exists():
        if "Z" in (pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2:3] or [""]):
          break
        time.sleep(0.3)

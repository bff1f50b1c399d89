"""A real local Ray cluster for tests: `ray start --head --block` on 127.0.0.1, a temp dir, free ports.

`LocalCluster` starts it in its own session and, on `stop()`, ends that session only (never
`ray stop`, which would end every Ray cluster on the machine, other users' included).
"""

import os
import pathlib
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Container

from tests.helpers import ROOT, TEST_XLA_FLAGS

# A test cluster and its drivers: CPU JAX with one device per process, no RAY_ADDRESS from outside,
# no token authentication (a local ray.init would otherwise write ~/.ray/auth_token, which the
# next `ray start` and driver on this machine pick up).
ENV = {
    **os.environ, "XLA_FLAGS": TEST_XLA_FLAGS, "JAX_PLATFORMS": "cpu", "RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"}


def short_temp_dir() -> str:
  """A fresh folder under /tmp: Ray's socket paths under it must fit 107 bytes (pytest's tmp_path is too deep)."""
  return tempfile.mkdtemp(prefix="ray", dir="/tmp")


def free_port(avoid: Container[int] = ()) -> int:
  """A port nothing listens on now, outside `avoid`."""
  while True:
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    if port not in avoid:
      return port


# The head's worker ports: a block this wide, and every other component's port picked outside it.
# Ray refuses to start when two of its components are given the same port (CI hit this when a
# free port fell inside the worker block), and a port it picks at random could land in the block.
WORKER_PORTS = 200


def cluster_ports() -> tuple[range, dict[str, int]]:
  """The worker block and a distinct free port for each of the head's other components."""
  while True:
    low = free_port()
    workers = range(low, low + WORKER_PORTS + 1)
    if workers.stop <= 65535:
      break
  names = ("port", "node-manager-port", "object-manager-port", "ray-client-server-port", "dashboard-agent-listen-port",
           "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
  ports: dict[str, int] = {}
  taken = set(workers)
  for name in names:
    ports[name] = free_port(avoid=taken)
    taken.add(ports[name])
  return workers, ports


def processes_under(needle: str) -> list[int]:
  """Pids of live processes whose command line names `needle` (the cluster's temp dir)."""
  out = []
  for p in pathlib.Path("/proc").iterdir():
    if not p.name.isdigit() or int(p.name) == os.getpid():
      continue
    try:
      if needle.encode() in (p / "cmdline").read_bytes() and "zombie" not in (p / "status").read_text():
        out.append(int(p.name))
    except OSError:
      continue
  return out


class LocalCluster:
  """One head node with `num_cpus` CPUs; `address` is host:port for --ray_address."""
  def __init__(self, tmp: pathlib.Path, num_cpus: int = 2, env: dict[str, str] | None = None):
    self.temp_dir = short_temp_dir()
    workers, ports = cluster_ports()
    port = ports["port"]
    self.address = f"127.0.0.1:{port}"
    ray_bin = str(pathlib.Path(sys.executable).parent / "ray")
    cmd = [
        ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
        f"--temp-dir={self.temp_dir}", "--include-dashboard=false", "--disable-usage-stats",
        f"--min-worker-port={workers.start}", f"--max-worker-port={workers.stop - 1}",
        *(f"--{name}={value}" for name, value in ports.items())]
    env = {**ENV, "PYTHONPATH": str(ROOT), **(env or {})}
    self.log = open(tmp / "ray_head.log", "w")  # pylint: disable=consider-using-with
    self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
      try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        if list(pathlib.Path(self.temp_dir).glob("session_latest/sockets/raylet*")):
          return
      except OSError:
        pass
      if self.proc.poll() is not None:
        raise RuntimeError(f"ray start exited {self.proc.returncode}: {(tmp / 'ray_head.log').read_text()[-2000:]}")
      time.sleep(0.5)
    self.stop()
    raise RuntimeError("the local Ray cluster did not come up in 120 s")

  def stop(self) -> None:
    """Ends the cluster's session (SIGTERM, then SIGKILL) and waits until none of its processes is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
      try:
        os.killpg(self.proc.pid, sig)
      except ProcessLookupError:
        pass
      deadline = time.time() + (5 if sig == signal.SIGTERM else 20)
      while time.time() < deadline and processes_under(self.temp_dir):
        time.sleep(0.5)
      if not processes_under(self.temp_dir):
        break
    for pid in processes_under(self.temp_dir):  # Left its session (Ray daemonizes some): ours all the same.
      os.kill(pid, signal.SIGKILL)
    self.proc.wait(timeout=30)
    self.log.close()
    shutil.rmtree(self.temp_dir, ignore_errors=True)

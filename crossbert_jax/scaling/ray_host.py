"""What the Ray executor runs on a cluster's hosts: where a host is, and one trainer process on it.

Kept free of JAX and of the planner, so a Ray worker imports it in milliseconds (the dispatch
overhead). The trainer is a child of the Ray worker and dies with it, however it dies
(PR_SET_PDEATHSIG): cancelling a host's task, or losing the driver, takes its trainer along.
"""

import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

from crossbert_jax.core import host

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5  # How soon a graceful cancel reaches the trainer.
STOP_GRACE_S = 120.0  # A stopped trainer's time to save its checkpoint.
PYTHON = "__python__"  # In a command: the host's own Python (the driver's path may not exist there).


def _die_with_parent() -> None:
  try:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  except (OSError, AttributeError):  # Not Linux.
    pass


def where() -> dict:
  """This host: its address, a free port for jax.distributed's coordinator, its kind of machine."""
  import ray  # pylint: disable=g-import-not-at-top

  with socket.socket() as s:
    s.bind(("", 0))
    port = s.getsockname()[1]
  return {"ip": ray.util.get_node_ip_address(), "port": port, "machine": host.describe()}


def train(cmd: list[str], cwd: str, log: str, stop_file: str = "") -> dict:
  """Runs the trainer `cmd` in `cwd` to its end, output appended to `log`; {rc, spawned: its start time}.

  Once `stop_file` exists (the driver's stop: every host of the run polls the same file on the shared root), or on a
  graceful cancel (a KeyboardInterrupt in the task), the trainer gets SIGTERM: it saves and exits 75. The driver
  relies on the file: Ray's graceful cancel is best effort, and once (2026-12-07, two test workers on 2 cores) it
  had not reached a running task after 120 s.
  """
  cmd = [sys.executable if c == PYTHON else c for c in cmd]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)}
  os.makedirs(os.path.dirname(log), exist_ok=True)
  with open(log, "a") as f:
    f.write(f"$ {shlex.join(cmd)}\n")
    f.flush()
    spawned = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    rc = None
    try:
      while rc is None and not (stop_file and os.path.exists(stop_file)):
        try:  # Polled: a KeyboardInterrupt is raised between bytecodes, which a blocking waitpid would hold back.
          rc = proc.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
          pass
    except KeyboardInterrupt:
      pass
    if rc is None:
      proc.send_signal(signal.SIGTERM)
      try:
        rc = proc.wait(timeout=STOP_GRACE_S)
      except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
  return {"rc": rc, "spawned": spawned}

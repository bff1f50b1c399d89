"""Worker processes that die with their parent (Grain's data workers, prepare's shard writers)."""

import ctypes
import ctypes.util
import os
import pathlib
import signal
import threading
import time

_PR_SET_PDEATHSIG = 1


def exit_with_parent(*unused_args: object, parent: int | None = None) -> None:
  """Worker init: the worker exits within a second of its parent dying (even by `kill -9`).

  Spawned workers otherwise outlive a killed parent, blocked on a full queue or still writing.
  A thread polls the parent pid rather than prctl(PR_SET_PDEATHSIG): that fires when the
  *thread* that spawned the worker exits, which for Grain is not the parent's lifetime.
  """
  parent = os.getppid() if parent is None else parent

  def watch():
    while os.getppid() == parent:
      time.sleep(0.5)
    os._exit(0)  # The parent is gone: nobody reads our results; skip cleanup that may block.

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def quiet_worker(parent: int) -> None:
  """Worker init for a pool that the main thread of process `parent` starts and stops (prepare's writers).

  A spawned worker re-imports the parent's modules before it gets here (seconds under load), so
  it checks that `parent` still lives; then the kernel kills it when the parent dies (prctl
  PR_SET_PDEATHSIG), because a busy worker can starve a polling thread of the GIL for seconds.
  Ctrl-C is the parent's to handle (the terminal sends it to the whole group: one line, not N tracebacks).
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):  # Not Linux: the polling thread below still runs.
    pass
  if os.getppid() != parent:  # The parent died before prctl took effect (or before we started).
    os._exit(0)
  exit_with_parent(parent=parent)


# -- Watching them (Linux /proc): the tests and tools/fault_inject_prepare.py check nothing is orphaned.


def _stat_fields(pid: int) -> list[str]:
  """/proc/PID/stat after the command name (state, ppid, ...); OSError if there is no such process."""
  return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def child_pids(pid: int) -> list[int]:
  """The processes whose parent is `pid`."""
  out = []
  for d in os.listdir("/proc"):
    if d.isdigit():
      try:
        if int(_stat_fields(int(d))[1]) == pid:
          out.append(int(d))
      except (OSError, IndexError, ValueError):
        pass
  return out


def alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie does not)."""
  try:
    return _stat_fields(pid)[0] != "Z"
  except (OSError, IndexError):
    return False

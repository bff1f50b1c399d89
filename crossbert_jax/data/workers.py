"""Worker processes that die with their parent (Grain's data workers, prepare's shard writers)."""

import os
import signal
import threading
import time


def exit_with_parent(*unused_args: object) -> None:
  """Worker init: the worker exits within a second of its parent dying (even by `kill -9`).

  Spawned workers otherwise outlive a killed parent, blocked on a full queue or still writing.
  A thread polls the parent pid rather than prctl(PR_SET_PDEATHSIG): that fires when the
  *thread* that spawned the worker exits, which for Grain is not the parent's lifetime.
  """
  parent = os.getppid()

  def watch():
    while os.getppid() == parent:
      time.sleep(0.5)
    os._exit(0)  # The parent is gone: nobody reads our results; skip cleanup that may block.

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def quiet_worker(*unused_args: object) -> None:
  """Worker init for a pool the parent stops: exit with the parent; Ctrl-C is the parent's to handle."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # The terminal sends it to the whole group: one line, not N tracebacks.
  exit_with_parent()

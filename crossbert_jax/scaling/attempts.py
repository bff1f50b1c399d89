"""A run's attempts on a cluster, recorded in ROOT/runs/<name>/sweep_wall.json.

The file keeps what the local runner writes (`wall_s`: the attempts' wall time summed, written as
a run trains; `machines`: the kinds of host it ran on) and adds `attempts`: one entry per attempt
with its executor, start time, hosts, dispatch overhead, and its outcome and cause. An attempt
still "running" when a driver starts again was cut short by the driver's end: it is marked so.
Written atomically, like every state file of the sweep.
"""

import json
import pathlib
import time

from crossbert_jax.core import outputs
from crossbert_jax.scaling import plan as plan_lib

WALL_FILE = "sweep_wall.json"  # The local runner's file (runner.WALL_FILE).


class Record:
  """The attempts of one run; `start`, `tick` and `end` write the file."""
  def __init__(self, run_dir: pathlib.Path, executor: str):
    self.path, self.executor = run_dir / WALL_FILE, executor
    saved = plan_lib.read_json(self.path, "the run's wall time") if self.path.is_file() else {}
    self.wall_s, self.machines = float(saved.get("wall_s", 0.0)), list(saved.get("machines", []))
    self.attempts = list(saved.get("attempts", []))
    if self.attempts and self.attempts[-1].get("outcome") == "running":
      self.attempts[-1].update(outcome="interrupted", cause="the sweep's driver ended while it ran")
    self._t0 = None

  def start(self, hosts: list[str], machines: list[str], queued_s: float) -> None:
    """A new attempt, training from now on `hosts` (addresses) of kinds `machines`, after `queued_s`
    seconds waiting for them (its dispatch overhead, `dispatch_s`, is set once known)."""
    self._t0 = time.time()
    self.machines = list(dict.fromkeys([*self.machines, *machines]))
    entry = {
        "executor": self.executor, "attempt": len(self.attempts) + 1, "started": self._t0, "hosts": hosts,
        "queued_s": round(queued_s, 3), "dispatch_s": None, "outcome": "running", "cause": ""}
    self.attempts.append(entry)
    self.tick()

  def tick(self) -> None:
    """Writes the running attempt's wall time so far (a killed driver keeps what it trained)."""
    self._write(self._elapsed())

  def end(self, outcome: str, cause: str) -> float:
    """Closes the running attempt; returns the run's total wall time."""
    elapsed = self._elapsed()
    self.wall_s += elapsed
    if not (self.attempts and self.attempts[-1]["outcome"] == "running"):  # Ended before its hosts started.
      self.attempts.append({
          "executor": self.executor, "attempt": len(self.attempts) + 1, "started": time.time(), "hosts": [],
          "outcome": "running"})
    self.attempts[-1].update(outcome=outcome, cause=cause, wall_s=round(elapsed, 3))
    self._t0 = None
    self._write(0.0)
    return self.wall_s

  def _elapsed(self) -> float:
    return time.time() - self._t0 if self._t0 is not None else 0.0

  def _write(self, running_s: float) -> None:
    outputs.write_atomic(
        self.path, json.dumps({"wall_s": self.wall_s + running_s, "machines": self.machines,
                               "attempts": self.attempts}))

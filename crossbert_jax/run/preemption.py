"""Stopping on SIGTERM / SIGINT at a step every process agrees on.

A signal only sets a flag (`StopRequest`). On one process the loop stops at the next step.
On several, a preemption notice may reach one host only: each step, every process contributes
its flag to a tiny all-reduce (a max over one int32 per device) dispatched right after the
train step, and reads the result one step later, when the device has long finished it. So the
host never waits on it, and every process sees the same value at the same step: all stop
after the same step, save that step together, and exit with `EXIT_STOPPED`.
"""

import signal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


class StopRequest:
  """Turns SIGTERM/SIGINT into a flag the loop checks between steps (a second SIGINT aborts)."""
  def __init__(self):
    self.signal_name = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    if self.signal_name is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.signal_name = signal.Signals(signum).name

  def request(self, reason: str) -> None:
    """A stop for another reason than a signal (e.g. the workdir lock was lost)."""
    if self.signal_name is None:
      self.signal_name = reason

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class StopSync:
  """`agreed(local_flag)`: whether any process asked to stop, the same answer on every process."""
  def __init__(self, mesh: Mesh):
    self._multi = jax.process_count() > 1
    self._pending = None
    if not self._multi:
      return
    devices = np.asarray(mesh.devices).reshape(-1)
    flat = Mesh(devices, ("all",))
    self._sharding = NamedSharding(flat, PartitionSpec("all"))
    self._num_local = sum(d.process_index == jax.process_index() for d in devices)
    self._shape = (devices.size,)
    self._reduce = jax.jit(jnp.max, out_shardings=NamedSharding(flat, PartitionSpec()))

  def agreed(self, local_flag: bool) -> bool:
    """One process: `local_flag`. Several: the all-reduced flags of the previous call."""
    if not self._multi:
      return bool(local_flag)
    local = np.full((self._num_local,), int(bool(local_flag)), np.int32)
    handle = self._reduce(jax.make_array_from_process_local_data(self._sharding, local, self._shape))
    previous, self._pending = self._pending, handle
    return previous is not None and bool(np.asarray(previous.addressable_data(0)))

  def flush(self) -> None:
    """Waits for the last dispatched reduction (every process must reach the same count)."""
    if self._pending is not None:
      jax.block_until_ready(self._pending)
      self._pending = None

"""A step's metrics row: fetched one step late, timed, checked finite, with probes and data wait.

The loop dispatches step N, then hands its device metrics to `StepRecorder.dispatched`, which
first fetches step N-1's (the device is already busy with step N, so the host never blocks it).
A fetched row gets the step's wall time (from the previous step's fetch, less the added hooks' and
the saves' time between them, `pause`/`resume`: the step after a save holds none of it), throughput, analytic FLOPs and MFU, `tokens_seen`, and
the time the host spent blocked on the step's input (`data_wait_s`, and `data_wait_fraction` of
the step's time), and with data.mixture `tokens_seen/<source>` (data/mixture.py says what it counts,
summed over processes, and over the run: a phase with another data stream adds its sources' tokens
to those of the earlier streams); a non-finite loss raises `TrainingDiverged`. When the input takes more than
`DATA_WAIT_WARN` of the step time over a window of `DATA_WAIT_WINDOW` steps (the first step after
a start excluded: it includes compilation), one warning line names the fixes. Each row also
carries the host's 1-minute load average (`load_avg_1m`), beside which its tokens/s is read.

The progress bar's ETA is the FLOPs of the remaining steps at the rate of the latest steps, never
counting a start's or a phase's first step (it compiles; none is shown before a second step). In a
run with phases (`core/phases.py`) each row is computed with its step's phase (tokens per step,
FLOPs) and carries `phase`, its index; the ETA prices the remaining steps phase by phase (a step
count alone would price an 8,192-token step like a 1,024-token one).
"""

import dataclasses
import os
import time
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils
import numpy as np

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.run import metrics
from crossbert_jax.training import flops

DATA_WAIT_WARN = 0.10
DATA_WAIT_WINDOW = 50


class TrainingDiverged(UserError):
  """The loss became non-finite; the last good checkpoint is kept."""


@dataclasses.dataclass
class Progress:
  """What the run is doing now (named by a one-line environment error) and what it has kept."""
  doing: str
  last_good: int | None = None  # The newest saved step whose params' loss was checked finite.
  lost_lock: str | None = None  # Another trainer took the lease: stop, and save nothing over its checkpoints.
  training: bool = False  # The steps began: a failure now is not a failed start (its folders stay).

  def kept(self) -> str:
    if self.last_good is None:
      return "no checkpoint was saved"
    return f"the last good checkpoint (step {self.last_good}) is kept"


@dataclasses.dataclass
class Outcome:
  """How the run ended and its last logged scalars: `run`'s result (`as_dict`)."""
  status: str = "finished"  # "finished" | "stopped" (a signal: resumable) | "nothing_to_do".
  step: int | None = None
  first_loss: float | None = None  # The loss of this process start's first step.
  scalars: dict[str, float] = dataclasses.field(default_factory=dict)
  goodput: str | None = None  # "goodput 87%: compile 4%, ..." over the run's process starts (run/goodput.py).

  def as_dict(self) -> dict[str, Any]:
    out: dict[str, Any] = {"status": self.status}
    if self.goodput is not None:
      out["goodput_line"] = self.goodput
    if self.step is not None:
      out["step"] = self.step
    if self.first_loss is not None:
      out["first_loss"] = self.first_loss
    return {**out, **self.scalars}


@dataclasses.dataclass
class _Pending:
  step: int
  device_metrics: dict
  dispatched_at: float
  data_wait_s: float
  source_tokens: dict[str, int] | None = None  # A mixture's per-source tokens as of this step's batch.
  source_tokens_before: dict[str, float] | None = None  # Those of the run's earlier streams (all processes).


class StepRecorder:
  """Turns each dispatched step's device metrics into its logged row, one step late."""
  def __init__(self, c: plan_lib.Settings, num_devices: int, logger: metrics.MetricsLogger,
               tokens_at: Callable[[int], int], progress: Progress, outcome: Outcome, where: str,
               warn: Callable[[str], None], phases: list[phases_lib.Phase] | None = None):
    self._c = c
    self._logger = logger
    self._tokens_at = tokens_at
    self._progress = progress
    self._outcome = outcome
    self._where = where
    self._warn = warn
    self._phases = list(phases if phases is not None else c.phases)
    self._flops = [flops.train_flops_per_step(p.config) for p in self._phases]  # Per phase.
    self._seconds_per_flop: float | None = None  # Smoothed over the latest steps (the ETA's rate).
    t = c.train
    self._last_step = min(t.steps, t.stop_at_step or t.steps)  # Always logged: the end of this run (or its stop).
    self._num_devices = num_devices
    self._peak = flops.peak_tflops_per_device(jax.devices()[0], c.model.dtype, c.metrics.cpu_peak_tflops)
    self._last_time: float | None = None
    self._paused_s, self._paused_since = 0.0, None  # Time outside the steps (`pause`), and since when.
    self._paused_mark = 0.0  # `_paused_s` when the last step's time was taken.
    self._pending: _Pending | None = None
    self._window: list[tuple[float, float]] = []  # (data wait, step time) of recent steps.
    self._warned = False
    self._fetched = 0

  def dispatched(self, step_num: int, device_metrics: dict, dispatched_at: float, data_wait_s: float,
                 source_tokens: dict[str, int] | None = None,
                 source_tokens_before: dict[str, float] | None = None) -> None:
    """Records step `step_num`, just dispatched; logs the previous one.

    `source_tokens`: this process's per-source tokens of the current mixture stream (None: not a
    mixture); `source_tokens_before`: all processes' per-source tokens of the run's earlier streams.
    """
    self.flush()
    self._pending = _Pending(step_num, device_metrics, dispatched_at, data_wait_s, source_tokens, source_tokens_before)

  def new_phase(self) -> None:
    """Before a phase's program is built: logs the pending step now, so its time holds no compile of the
    next phase's, whose first step is then timed from its dispatch (as a start's)."""
    self.flush()
    self._last_time = None

  def pause(self) -> None:
    """The loop leaves the steps for a while (added hooks, a save): until `resume`, wall time is no step's
    (the first checked save compiles the loss check: seconds on CPU), except a fetch's wait for a step."""
    self._paused_since = time.perf_counter()

  def resume(self) -> None:
    if self._paused_since is not None:
      self._paused_s += time.perf_counter() - self._paused_since
      self._paused_since = None

  def flush(self, probes: Callable[[], dict[str, float]] | None = None) -> None:
    """Fetches and logs the pending step (blocking until it is done); `probes()` adds frozen probe scores."""
    p, self._pending = self._pending, None
    if p is None:
      return
    self._progress.doing = f"writing the metrics of step {p.step} in {self._where}"
    scalars = self._scalars(p)
    if probes is not None and np.isfinite(scalars["loss"]):
      scalars.update(probes())
    if not np.isfinite(scalars["loss"]):
      raise TrainingDiverged(f"loss is {scalars['loss']} at step {p.step}; stopping. In {self._where}, "
                             f"{self._progress.kept()}; lower train.learning_rate or raise train.warmup_steps")
    if p.step % self._c.metrics.log_every == 0 or p.step == self._last_step or probes is not None:
      if p.source_tokens is not None or p.source_tokens_before:
        scalars.update(_per_source(p.source_tokens, p.source_tokens_before or {}))
      self._logger.log(p.step, scalars, eta_s=self._eta(p.step, scalars))
    out = self._outcome
    out.step, out.scalars = p.step, scalars
    out.first_loss = scalars["loss"] if out.first_loss is None else out.first_loss
    self._watch_data_wait(p, scalars["step_time"])

  def _scalars(self, p: _Pending) -> dict[str, float]:
    paused = self._paused_since is not None
    self.resume()  # Waiting for the step's results is its time, also inside a pause (a hook's or a save's fetch).
    host = jax.device_get(p.device_metrics)
    now = time.perf_counter()
    first = self._last_time is None  # The first step after a (re)start includes compilation.
    dt = now - (p.dispatched_at if first else self._last_time) - (self._paused_s - self._paused_mark)
    self._last_time, self._paused_mark = now, self._paused_s
    if paused:
      self.pause()
    out = {k: float(np.asarray(v)) for k, v in host.items()}
    phase = phases_lib.phase_at(self._phases, p.step)
    per_step = self._flops[phase.index]
    out.update(
        phase=phase.index,
        step_time=dt,
        tokens_per_second=phase.tokens_per_step / dt,
        flops_per_step=per_step,
        tflops_per_device=flops.achieved_tflops_per_device(per_step, dt, self._num_devices),
        mfu=flops.mfu(per_step, dt, self._num_devices, self._peak),
        tokens_seen=float(self._tokens_at(p.step)),
        data_wait_s=p.data_wait_s,
        data_wait_fraction=min(1.0, p.data_wait_s / dt) if dt > 0 else 0.0,
        load_avg_1m=_load_avg(),
    )
    return out

  def _eta(self, step: int, scalars: dict[str, float]) -> float | None:
    """Seconds left for steps step + 1 .. train.steps at the recent FLOP rate of the steps after a start's and
    a phase's first (tqdm's own rate would count their compile); None until there is one."""
    if self._fetched == 0:  # The first step's time is mostly compilation.
      return None
    if step != phases_lib.phase_at(self._phases, step).start + 1:  # A phase's first step compiles its program.
      rate = scalars["step_time"] / scalars["flops_per_step"]
      self._seconds_per_flop = rate if self._seconds_per_flop is None else 0.9 * self._seconds_per_flop + 0.1 * rate
    if self._seconds_per_flop is None:
      return None
    left = sum(max(0, p.end - max(step, p.start)) * f for p, f in zip(self._phases, self._flops))
    return left * self._seconds_per_flop

  def _watch_data_wait(self, p: _Pending, step_time: float) -> None:
    self._fetched += 1
    if self._warned or self._fetched == 1:  # The first step's time is mostly compilation.
      return
    self._window = (self._window + [(p.data_wait_s, step_time)])[-DATA_WAIT_WINDOW:]
    waited, took = (sum(w for w, _ in self._window), sum(t for _, t in self._window))
    if len(self._window) == DATA_WAIT_WINDOW and took > 0 and waited / took > DATA_WAIT_WARN:
      self._warned = True
      self._warn(f"warning: the input took {100 * waited / took:.0f}% of the step time over steps "
                 f"{p.step - DATA_WAIT_WINDOW + 1}-{p.step} (data_wait_fraction in metrics.jsonl): use "
                 "pre-tokenized shards (`prepare --tokenizer=...`) or raise --config.data.worker_count")


def _load_avg() -> float:
  """The host's 1-minute load average; NaN (a null in the row) where the OS keeps none."""
  try:
    return os.getloadavg()[0]
  except (AttributeError, OSError):
    return float("nan")


def summed_over_processes(source_tokens: dict[str, int]) -> dict[str, float]:
  """{source: tokens of all processes}: each process counts its own documents. A collective: every
  process calls it at the same point, with the same sources."""
  n_K = np.asarray(list(source_tokens.values()), np.int64)
  if jax.process_count() > 1 and len(n_K):  # As two int32 halves: JAX moves no int64 by default.
    halves = np.stack([n_K >> 31, n_K & (2 ** 31 - 1)]).astype(np.int32)
    summed = np.asarray(multihost_utils.process_allgather(halves)).astype(np.int64).sum(0)
    n_K = (summed[0] << 31) + summed[1]
  return {name: float(n) for name, n in zip(source_tokens, n_K)}


def add_tokens(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
  """Per-source token counts a + b (a source in either)."""
  return {name: a.get(name, 0.0) + b.get(name, 0.0) for name in {**a, **b}}


def _per_source(current: dict[str, int] | None, before: dict[str, float]) -> dict[str, float]:
  """{"tokens_seen/<source>": the run's tokens from it}: the earlier streams' plus the current one's."""
  now = summed_over_processes(current) if current is not None else {}
  return {f"tokens_seen/{name}": n for name, n in add_tokens(before, now).items()}

"""A jax.profiler trace of the steps profile.start_step .. start_step + steps - 1, and its summary.

The trace starts before the window's first step reads its batch and stops once its last step's
results are ready, on the processes of profile.hosts (default: process 0); outside the window the
loop does nothing more than compare two integers. Step 1 (the compile step) is never traced
(`config.validate`), nor is the first step of a resumed process start (it compiles, or loads the
compiled step): such a step is skipped with one line. The traced steps are recorded in
WORKDIR/profile/profiled.json when the trace is written, so a resumed run traces only the steps
not yet traced (a kill inside the window loses that trace, and the resume traces the rest again).
A start that ends inside the window (train.stop_at_step, a stop signal) says so, and stops, summarises
and records the trace at its last step. Host ids beyond the run's processes are refused before any
work (`check_hosts`); a window over a checkpoint save or a hook's step is one warning line (`busy`).

The trace lands in WORKDIR/profile/plugins/profile/<time>/<host>.xplane.pb (and .trace.json.gz),
where TensorBoard's profile plugin / XProf read it. A gs:// workdir: traced to a local folder and
copied there with etils.epath. `summarize` reads the .xplane.pb back with jax.profiler.ProfileData
(the profiler's own reader) and says where the traced steps' time went.
"""

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Callable

import jax
from etils import epath

from crossbert_jax.core import sections
from crossbert_jax.core.errors import config_error
from crossbert_jax.run import checkpoint, hooks as hooks_lib, trace_summary
from crossbert_jax.training import program as program_lib

PROFILE_DIR = "profile"
RECORD_FILE = "profiled.json"
STEP_NAME = program_lib.TRACE_STEP_NAME  # The StepTraceAnnotation of a traced step.


def profiling_host(hosts: str, process_index: int) -> bool:
  """Whether process `process_index` traces under profile.hosts."""
  hosts = hosts.replace(" ", "")
  return hosts == "all" or str(process_index) in hosts.split(",")


def check_hosts(p: sections.Profile, process_count: int) -> None:
  """Refuses profile.hosts naming a process this run does not have (it would trace nothing)."""
  hosts = p.hosts
  named = [] if not p.start_step or hosts.replace(" ", "") == "all" else [
      int(h) for h in hosts.replace(" ", "").split(",")]
  beyond = sorted(h for h in named if h >= process_count)
  if beyond:
    raise config_error(
        "profile.hosts", f"{hosts!r} names process {', '.join(map(str, beyond))}, but this run has {process_count} "
        f"process(es) (0-{process_count - 1}): name those, or 'all'")


def busy(ckpt: sections.Checkpoint, hooks: list[hooks_lib.Hook], step: int) -> str | None:
  """What runs at `step` besides the step itself (a checkpoint save, added hooks), if anything."""
  what = ["a checkpoint save"] if checkpoint.is_save_step(ckpt, step) else []
  what += [f"the hook {h.name!r}" for h in hooks if h.name != "metrics" and h.due_at(step)]
  return " and ".join(what) or None


def read_record(workdir: epath.Path) -> list[int]:
  """The steps already traced in `workdir` (earlier process starts)."""
  path = workdir / PROFILE_DIR / RECORD_FILE
  return sorted(json.loads(path.read_text())["steps"]) if path.exists() else []


class Profiler:
  """Starts and stops the trace around the window's steps (`before_step`, `after_step`)."""
  def __init__(self, p: sections.Profile, workdir: epath.Path, first_step: int, log: Callable[[str], None],
               last_step: int | None = None, busy: Callable[[int], str | None] = lambda step: None,
               warn: Callable[[str], None] | None = None):
    """`first_step`: this process start's first step (it compiles: never traced); `last_step`: its last
    (train.steps or train.stop_at_step; a window past it is traced up to it); `busy(step)`: what else
    runs at `step` (a checkpoint save, a hook), if anything: a window over such a step is warned of."""
    self._workdir, self._log = workdir, log
    self._primary = jax.process_index() == 0
    done = set(read_record(workdir)) if p.start_step else set()
    window = range(p.start_step, p.start_step + p.steps) if p.start_step else range(0)
    todo = [s for s in window if s not in done and s > first_step]
    steps = [s for i, s in enumerate(todo) if s == todo[0] + i]  # Contiguous: one trace.
    last_step = window.stop - 1 if last_step is None else last_step
    self._steps = [s for s in steps if s <= last_step]
    self.summary: str | None = None  # This start's trace summary, once written.
    self._on = bool(self._steps) and profiling_host(p.hosts, jax.process_index())
    self._tracing = False
    self._local: str | None = None
    self._first, self._last = (self._steps[0], self._steps[-1]) if self._steps else (0, 0)
    if first_step in window and first_step not in done:
      log(f"profile: step {first_step} is this start's first step (it compiles): not traced")
    if len(self._steps) < len(steps):
      log(f"profile: this start ends at step {last_step} (train.steps / train.stop_at_step), inside the window "
          f"{window.start}-{window.stop - 1}: " +
          (f"traces steps {self._first}-{self._last} only" if self._steps else "nothing traced now (a resume past "
           f"step {last_step} traces it)"))
    overlaps = [(s, what) for s in self._steps if (what := busy(s))]
    if overlaps and warn is not None:
      free = next((start for start in range(p.start_step + 1, last_step - p.steps + 2)
                   if not any(busy(s) for s in range(start, start + p.steps))), None)
      warn(f"warning: the profile window {window.start}-{window.stop - 1} overlaps " +
           ", ".join(f"{what} (step {s})" for s, what in overlaps) + ": the trace counts their time as the steps'" +
           (f"; for the steps alone use --config.profile.start_step={free}" if free else ""))

  def before_step(self, step: int) -> None:
    """Starts the trace before the window's first step (its batch read included)."""
    if self._on and step == self._first:
      remote = "://" in str(self._workdir)
      self._local = tempfile.mkdtemp(prefix="crossbert-trace-") if remote else str(self._workdir / PROFILE_DIR)
      options = jax.profiler.ProfileOptions()
      options.python_tracer_level = 0  # Python's own calls: slows the host several-fold, says little here.
      jax.profiler.start_trace(self._local, profiler_options=options)
      self._tracing = True

  def annotate(self, step: int) -> Any:
    """A StepTraceAnnotation for a traced step (a no-op context outside the trace)."""
    return jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step) if self._tracing else contextlib.nullcontext()

  def traced(self, step: int) -> bool:
    """Whether this process traces `step` (goodput counts its time beyond the median as profiling)."""
    return self._on and self._first <= step <= self._last

  def after_step(self, step: int, outputs: Any, final: bool = False) -> None:
    """At the window's last step, or at this start's `final` step inside it (a stop): stops the trace (where
    it runs), summarizes it; process 0 records the steps traced."""
    if not self._steps or not (step == self._last or (final and self._first <= step < self._last)):
      return
    if step < self._last:
      self._log(f"profile: the run stops at step {step}, inside the window {self._first}-{self._last}: traced "
                f"steps {self._first}-{step} only")
      self._last = step
      self._steps = list(range(self._first, step + 1))
    where = self._workdir / PROFILE_DIR
    if self._tracing:
      jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self._tracing = False
      xplane = _newest(self._local, ".xplane.pb")
      if self._local != str(where):  # gs://: the trace folder goes up with epath.
        _copy_up(os.path.dirname(xplane), where / os.path.relpath(os.path.dirname(xplane), self._local))
      self.summary = trace_summary.format_summary(trace_summary.summarize(xplane, STEP_NAME),
                                                  f"steps {self._first}-{self._last}")
      if self._local != str(where):
        shutil.rmtree(self._local, ignore_errors=True)
      self._log(f"profile: traced steps {self._first}-{self._last} into {where}; open it with `xprof "
                f"--logdir={where}` or TensorBoard's Profile tab (pip install -r requirements-profile.txt)")
    if self._primary:  # Every host's window is the same: process 0 records it, traced there or not.
      where.mkdir(parents=True, exist_ok=True)
      (where / RECORD_FILE).write_text(json.dumps({"steps": sorted(set(read_record(self._workdir)) | set(self._steps))
                                                  }))

  def close(self) -> None:
    """Stops a trace still running (the run ended or failed inside the window): nothing is recorded."""
    if self._tracing:
      self._tracing = False
      jax.profiler.stop_trace()


def _copy_up(local: str, target: epath.Path) -> None:
  target.mkdir(parents=True, exist_ok=True)
  for name in os.listdir(local):
    with open(os.path.join(local, name), "rb") as f:
      (target / name).write_bytes(f.read())


def _newest(folder: str, suffix: str) -> str:
  """The newest file ending in `suffix` under `folder`."""
  found = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.endswith(suffix)]
  return max(found, key=os.path.getmtime)

"""The training loop's side duties as hooks (levanter-style): each has its own `every` and runs after
the steps it is due at, in the order the run lists them; the loop itself only dispatches steps.

A run's hooks (`Trainer._begin`): the metrics row of every step (`metrics`; the recorder fetches it
one step late, so the host never blocks the device), the frozen probes every eval.every_steps
steps, scored into that step's row (`probes`), and the checked save every checkpoint.every_steps
steps and at every checkpoint.keep_steps (`saves`). On the step a stop signal ends, the hooks that
the final save makes redundant (`on_stop=False`: the periodic save) do not run.
"""

import dataclasses
import time
from typing import Any, Callable

from jax.experimental import multihost_utils

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections
from crossbert_jax.run import recorder as recorder_lib


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """A dispatched step, as its hooks see it."""

  step: int
  state: Any  # The TrainState after the step (its arrays may still be computing).
  device_metrics: dict[str, Any]  # The step's metrics, on device.
  dispatched_at: float  # time.perf_counter() when the step was dispatched.
  data_wait_s: float  # Seconds the host was blocked on the input since the previous step.
  stopping: bool  # Every process agreed to stop after this step.


@dataclasses.dataclass(frozen=True)
class Hook:
  """`run(info)` after every step that is a multiple of `every` (0: none) or in `also_at`."""

  name: str
  every: int
  run: Callable[[StepInfo], None]
  also_at: frozenset[int] = frozenset()
  on_stop: bool = True  # Also on the step a stop signal ends.

  def due(self, info: StepInfo) -> bool:
    at = (self.every > 0 and info.step % self.every == 0) or info.step in self.also_at
    return at and (self.on_stop or not info.stopping)


def run_due(hooks: list[Hook], info: StepInfo) -> dict[str, float]:
  """Runs the hooks due after `info`'s step, in order (every process runs the same ones); the
  seconds each took, by name (goodput's save and eval time)."""
  took = {}
  for hook in hooks:
    if hook.due(info):
      t0 = time.perf_counter()
      hook.run(info)
      took[hook.name] = time.perf_counter() - t0
  return took


def metrics(recorder: recorder_lib.StepRecorder,
            source_tokens: Callable[[], tuple[dict[str, int] | None, dict[str, float]]]) -> Hook:
  """Every step's metrics row; `source_tokens()`: a mixture's per-source tokens of the current stream
  (None otherwise) and those of the run's earlier streams."""
  def run(info: StepInfo) -> None:
    recorder.dispatched(info.step, info.device_metrics, info.dispatched_at, info.data_wait_s, *source_tokens())
  return Hook("metrics", 1, run)


def probes(every: int, recorder: recorder_lib.StepRecorder, config: Callable[[], plan_lib.Settings],
           tok: Any, primary: bool) -> Hook:
  """Frozen probes (eval.tasks) on the encoder every `every` steps, in that step's metrics row: the
  encoder is gathered to every host and scored on process 0 under `config()` (the current phase's)."""
  def run(info: StepInfo) -> None:
    def scores() -> dict[str, float]:
      from crossbert_jax.evaluation import runner  # Local: scikit-learn and the task readers load only when used.

      encoder = multihost_utils.process_allgather(info.state.params["encoder"], tiled=True)
      return runner.probe_scores(config(), encoder, tok) if primary else {}
    recorder.flush(probes=scores)
  return Hook("probes", every, run)


def saves(checkpoint: sections.Checkpoint, recorder: recorder_lib.StepRecorder,
          save: Callable[[int, Any], None]) -> Hook:
  """The checked save (`save(step, state)`) every checkpoint.every_steps steps and at its keep_steps,
  after the metrics up to the step are logged; not on a stop's step (the final save is that step)."""
  def run(info: StepInfo) -> None:
    recorder.flush()
    save(info.step, info.state)
  return Hook("save", checkpoint.every_steps, run, frozenset(checkpoint.keep_steps), on_stop=False)

"""The training loop's side duties as hooks (levanter-style `Trainer.add_hook(fn, every=)`).

A hook is a function of the step (`StepInfo`) and its `every`: it runs after each step that is a
multiple of `every` (0: never), on every process, in the order the hooks were added. The loop's
own stages (enter the step's phase, the step, the hooks, the checked save, the stop: `Trainer.train`)
are not hooks; hooks only read the step and write into its metrics row.

The Trainer adds the metrics row of every step first (`metrics`; the recorder fetches it one step
late, so the host never blocks the device). The `train` command adds the frozen probes every
eval.every_steps steps (`crossbert_jax.train.standard_hooks`; the hook itself is
`evaluation.runner.probe_hook`): run/ knows nothing of evaluation. A hook that adds scores to its
step's row calls `info.context.log_scores(scores)`; its time counts as goodput's "eval".
"""

import dataclasses
import numbers
import time
from typing import Any, Callable

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.run import recorder as recorder_lib


@dataclasses.dataclass(frozen=True)
class RunContext:
  """What a hook may use of the run beyond its step (the same for every step of a process start)."""

  tokenizer: Any  # The run's tokenizer (data/tokenizer.py).
  primary: bool  # This is process 0, the one that writes the logs.
  # `log_scores(scores)`: logs the step's metrics row now, with `scores()` ({name: value}) added; it
  # is called on every process (so it may gather across them) and only while the loss is finite.
  log_scores: Callable[[Callable[[], dict[str, float]]], None]


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """A dispatched step, as its hooks see it."""

  step: int
  state: Any  # The TrainState after the step (its arrays may still be computing).
  device_metrics: dict[str, Any]  # The step's metrics, on device.
  dispatched_at: float  # time.perf_counter() when the step was dispatched.
  data_wait_s: float  # Seconds the host was blocked on the input since the previous step.
  stopping: bool  # Every process agreed to stop after this step.
  config: plan_lib.Settings  # The config of the step's phase.
  context: RunContext  # The run's tokenizer, process, and a way into the step's metrics row.


@dataclasses.dataclass(frozen=True)
class Hook:
  """`run(info)` after every step that is a multiple of `every` (0: none)."""

  name: str
  every: int
  run: Callable[[StepInfo], None]

  def __post_init__(self):
    """Refuses a hook that could never run as meant (`every` negative or not an int) where it is made."""
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"Hook name must be a non-empty string, got {self.name!r}")
    if isinstance(self.every, bool) or not isinstance(self.every, numbers.Integral):
      raise TypeError(f"Hook {self.name!r}: every must be an int (steps; 0: never), got {self.every!r} "
                      f"({type(self.every).__name__})")
    if self.every < 0:
      raise ValueError(f"Hook {self.name!r}: every must be >= 0 (steps; 0: never), got {self.every}")
    if not callable(self.run):
      raise TypeError(f"Hook {self.name!r}: run must be callable (a function of StepInfo), got {self.run!r}")

  def due(self, info: StepInfo) -> bool:
    return self.due_at(info.step)

  def due_at(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0


def check_hooks(hooks: Any) -> None:
  """Refuses anything but `Hook`s (each checked where it was made)."""
  for hook in hooks:
    if not isinstance(hook, Hook):
      raise TypeError(f"run's hooks must be hooks.Hook(name, every, fn), got {hook!r}")


def run_due(hooks: list[Hook], info: StepInfo) -> dict[str, float]:
  """Runs the hooks due after `info`'s step, in order (every process runs the same ones); the
  seconds each took, by name (goodput's eval time)."""
  took = {}
  for hook in hooks:
    if hook.due(info):
      t0 = time.perf_counter()
      hook.run(info)
      took[hook.name] = time.perf_counter() - t0
  return took


def metrics(recorder: recorder_lib.StepRecorder, source_tokens: Callable[[], tuple[dict[str, int] | None,
                                                                                   dict[str, float]]]) -> Hook:
  """Every step's metrics row; `source_tokens()`: a mixture's per-source tokens of the current stream
  (None otherwise) and those of the run's earlier streams."""
  def run(info: StepInfo) -> None:
    recorder.dispatched(info.step, info.device_metrics, info.dispatched_at, info.data_wait_s, *source_tokens())

  return Hook("metrics", 1, run)

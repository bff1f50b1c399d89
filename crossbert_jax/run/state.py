"""Where a process start of the training loop is (`RunState`): its step, phase, tokens and data position.

The Trainer (run/trainer.py) keeps its collaborators (the config, the checkpointer, the program,
the data feed, the logger, ...) as attributes; everything the loop moves forward lives here, in
one object, so a reader sees the loop's position in one place. The params and optimizer state
are not part of it: they are the TrainState (training/program.py) the loop passes from step to step.
"""

import dataclasses
from typing import Any

from crossbert_jax.core import phases as phases_lib


@dataclasses.dataclass
class RunState:
  """The training loop's position in this process start (mutable: the loop advances it)."""

  phase: phases_lib.Phase  # The current phase: its TrainProgram and data stream are the Trainer's now.
  step: int = 0  # The last step dispatched (before the first: the step this start resumed after).
  start: int = 0  # The step this process start resumes after (0 for a new run).
  tokens_at_start: int = 0  # Tokens trained on before this start's first step (from the checkpoint's meta).
  forked: bool = False  # This start began from train.fork_from's checkpoint.
  read_ahead: Any = None  # The global batch a checked save already read for the next step (None: none read).
  data_wait: float = 0.0  # Seconds blocked on input since the last dispatched step (a read-ahead's included).
  # Per-source tokens of the run's streams before the current one, all processes (in checkpoint meta).
  source_tokens_before: dict[str, float] = dataclasses.field(default_factory=dict)
  counted_stream: int | None = None  # The stream whose per-source tokens joined `source_tokens_before`.

  def tokens_at(self, phases: list[phases_lib.Phase], step: int) -> int:
    """Tokens trained on by the end of `step` (a step of this start, or its `start`)."""
    return self.tokens_at_start + phases_lib.tokens_between(phases, self.start, step)

"""One restore policy, for the run's own checkpoint (a resume) and another run's (a fork).

`vet` decides, before any state is read: the config and tokenizer checks (`resume.check`: refused
changes raise UserError, allowed ones become warning lines), then what becomes of the data
iterator -- its saved position restored, re-sharded onto another process count (`elastic`), or
the stream started over. `read` then restores the state and the iterator as vetted. The trainer's
resume (`Checkpointer.restore_latest`, with its damaged-step fallback) and a fork (`fork.restore`)
both go through these two functions.
"""

import dataclasses
from typing import Any, Callable

import jax
from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.run import checkpoint, elastic, resume

# A fork changes its schedule, probes and checkpointing by design: only its other changes are worth a line.
_QUIET_IN_A_FORK = ("warning: resuming with train.", "warning: resuming with eval.",
                    "warning: resuming with checkpoint.")


@dataclasses.dataclass(frozen=True)
class Plan:
  """How a vetted checkpoint step is read."""

  lines: list[str]  # Warnings to print, one line each.
  restore_data: bool  # Restore the saved iterator position.
  reshard_state: dict[str, Any] | None = None  # Else set this re-shard state (another process count).


def vet(run_dir: str | epath.Path, step: int, saved: dict[str, Any], meta: checkpoint.CheckpointMeta,
        c: plan_lib.Settings, tokenizer: dict[str, Any], *, forking: bool) -> Plan:
  """The plan for reading `step` of the run in `run_dir` into a run of `c`; UserError if refused.

  `forking`: `run_dir` is another run's (the lines then say "forking with", and leave out the
  changes a fork makes by design).
  """
  written_by = meta.process_count or checkpoint.CheckpointLayout.of(run_dir).process_count(step)
  lines, restore_data = resume.check(str(run_dir), step, saved, meta, c, tokenizer, jax.process_count(), written_by,
                                     forking=forking)
  reshard_state = None
  if restore_data and (other := elastic.reshard(run_dir, step, written_by, resume.stream_view(saved, step), c,
                                                jax.process_count())):
    lines.append(other[0])
    restore_data, reshard_state = False, other[1]
  if forking:
    lines = [
        line.replace("resuming with", "forking with")
        for line in lines
        if not line.startswith(_QUIET_IN_A_FORK) and "learning-rate schedule" not in line]
  return Plan(lines, restore_data, reshard_state)


def read(reader: checkpoint.Checkpointer, step: int, plan: Plan, abstract_state: Any, shardings: Any,
         iterator_of: Callable[[int], Any]) -> Any:
  """The state of `step`, restored into `shardings`; the iterator `iterator_of(step)` (that of the
  step's phase) gets the saved position or the re-shard state, as `plan` says."""
  state = reader.restore(step, abstract_state, shardings, iterator_of(step) if plan.restore_data else None)
  if plan.reshard_state is not None:
    iterator_of(step).set_state(plan.reshard_state)
  return state

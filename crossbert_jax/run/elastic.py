"""Restarts on another process count: the saved data-iterator states, re-sharded.

Orbax restores params and optimizer state onto any mesh. The Grain iterator is saved as one state
per process (`checkpoint.CheckpointLayout`); a run restarted on M != N processes
reads the N states here and gives every new process the same re-shard state, from which its
iterator first drains the old layout's interrupted epoch (`data/elastic.py` holds the rule).
"""

from typing import Any

from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import elastic as data_elastic
from crossbert_jax.data import pipeline
from crossbert_jax.run import checkpoint


def saved_process_count(workdir: str | epath.Path, step: int | None = None) -> tuple[int, int] | None:
  """(step, process count) of `step` (default: the newest committed checkpoint with a data iterator)."""
  layout = checkpoint.CheckpointLayout.of(workdir)
  for s in [step] if step is not None else reversed(layout.steps_on_disk()):
    if (count := layout.process_count(s)) is not None:
      return s, count
  return None


def saved_states(workdir: str | epath.Path, step: int, count: int) -> list[dict[str, Any]]:
  """The `count` per-process iterator states saved with `step`, in process order."""
  return checkpoint.CheckpointLayout.of(workdir).iterator_states(step, count)


def reshard(workdir: str | epath.Path, step: int, old: int | None, saved: dict[str, Any], now: plan_lib.RunPlan,
            process_count: int) -> tuple[str, dict[str, Any] | None] | None:
  """None if `step`'s iterator was saved by `process_count` processes (`old`: the count that saved
  it, None if unknown); else (warning line, the re-shard state for every process, or None where the
  data stream has to start over). UserError for a data.mixture stream (no exact re-shard)."""
  if old is None or old == process_count:
    return None
  where = f"checkpoint step {step} was written by {old} process(es) and this run has {process_count}"
  if now.data.mixture:  # Its sources' shares move at different rates: no epoch to drain exactly.
    raise UserError(f"{where}, but a data.mixture stream cannot be re-sharded onto another process count: "
                    f"resume on {old} process(es)")
  if now.spec.feed:  # Not packed rows: its state is one index per process, with no epoch to drain.
    return (f"warning: {where}: objective={now.objective}'s input stream is not re-sharded, so it starts over from "
            "its first batch (resume on the same process count to continue it exactly)"), None
  workers = (saved["data"]["worker_count"], now.data.worker_count)
  if any(workers):
    return (f"warning: {where}, with data.worker_count {workers[0]} -> {workers[1]}: a multiprocess iterator "
            "cannot be re-sharded exactly, so the data stream starts over from its first batch (documents read "
            "before this step are read again; use data.worker_count=0 for exact elastic resumes)"), None
  states = saved_states(workdir, step, old)
  bins = pipeline.packing_bins(saved["train"]["batch_size"] // old)
  return (f"warning: {where}: the data stream first finishes the {old} old processes' interrupted epoch "
          f"(each unread document once), then continues on {process_count}"), data_elastic.reshard_state(states, bins)

"""Process-count changes between restarts (issue #9 item 4: not supported yet, refused in one line).

Orbax restores params and optimizer state onto any mesh, but the Grain data iterator is saved as
one state file per process (`checkpoints/STEP/data/process_P-of-N.json`): a run restarted with
another process count has no exact way to continue the epoch from them, and Grain raises a raw
traceback. Until the iterator is re-sharded (keep the epoch's global position, each new process
starting at its share), a changed process count is refused before anything is loaded.
"""

import re

from etils import epath

from crossbert_jax.core.errors import UserError

_STATE_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def saved_process_count(workdir: str | epath.Path) -> tuple[int, int] | None:
  """(step, process count) of the newest committed checkpoint with a data iterator, or None."""
  root = epath.Path(workdir) / "checkpoints"
  if not root.is_dir():
    return None
  steps = sorted((int(p.name) for p in root.iterdir() if p.name.isdigit()), reverse=True)
  for step in steps:
    data = root / str(step) / "data"
    if not (root / str(step) / "_CHECKPOINT_METADATA").exists() or not data.is_dir():
      continue
    counts = {int(m.group(2)) for p in data.iterdir() if (m := _STATE_FILE.fullmatch(p.name))}
    if len(counts) == 1:
      return step, counts.pop()
  return None


def check_process_count(workdir: str | epath.Path, process_count: int) -> None:
  """UserError if `workdir`'s checkpoint was written by another number of processes."""
  saved = saved_process_count(workdir)
  if saved is not None and saved[1] != process_count:
    step, count = saved
    raise UserError(
        f"--workdir {workdir}: checkpoint step {step} was written by {count} process(es) but this run has "
        f"{process_count}; resuming on another process count is not supported yet (the data iterator is "
        f"saved per process): restart with {count} processes, or start a new --workdir")

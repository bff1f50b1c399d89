"""A full or read-only workdir while a run writes: one error line naming what it was doing, no traceback.

`reported(workdir, progress)` turns an OSError of that kind (or one Orbax re-raised from its
writer threads) into a UserError that says what the run was doing (`progress.doing`), which
checkpoints are intact, and to rerun the same command once the disk is fixed. Orbax's writer
threads log their own tracebacks for the same error: `install_log_filter` drops them, and
`without_stderr` closes the checkpointer quietly when a first error is already on its way.
"""

import contextlib
import errno
import logging
import os
import sys
import warnings
from typing import Callable, Iterator, Protocol

from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.run import checkpoint

# OSError numbers of a full or read-only workdir: reported in one line, not a traceback.
ENV_ERRNOS = {
    errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted", errno.EFBIG: "the file is too large"}


class Doing(Protocol):
  doing: str


def environment_error(e: BaseException | None) -> tuple[str, str] | None:
  """(reason, path) if `e` (or what it wraps: Orbax re-raises its writer's errors) is a full or
  read-only workdir, else None."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in ENV_ERRNOS:
      return ENV_ERRNOS[e.errno], str(e.filename or "")
    text = str(e)
    for err, reason in ENV_ERRNOS.items():
      if os.strerror(err) in text:
        return reason, ""
    e = e.__cause__ or e.__context__
  return None


class _EnvironmentLogFilter(logging.Filter):
  """Drops the tracebacks Orbax's writer threads log for a full or read-only disk."""
  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += f" {record.exc_info[1]}"
    return not any(os.strerror(err) in text for err in ENV_ERRNOS)


def install_log_filter() -> None:
  """Adds the filter to every root log handler (once)."""
  for handler in logging.getLogger().handlers:
    if not any(isinstance(f, _EnvironmentLogFilter) for f in handler.filters):
      handler.addFilter(_EnvironmentLogFilter())


@contextlib.contextmanager
def reported(workdir: epath.Path, progress: Doing) -> Iterator[None]:
  """Re-raises a full or read-only workdir as one UserError line; everything else unchanged."""
  try:
    yield
  except (UserError, KeyboardInterrupt):
    raise
  except Exception as e:
    env = environment_error(e)
    if env is None:
      raise
    reason, path = env
    # Orbax's unfinished writes would add "coroutine ... was never awaited" lines at exit.
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    layout = checkpoint.CheckpointLayout.of(workdir)
    intact = layout.steps_on_disk()  # Not the trainer's view: an async save may have failed late.
    kept = (f"the checkpoints of steps {intact} in {layout.directory} are intact"
            if intact else "no checkpoint was written")
    raise UserError(f"{reason} while {progress.doing}{' (' + path + ')' if path else ''}; {kept}: "
                    f"free space or make {workdir} writable, then rerun the same command to resume") from None


def without_stderr(fn: Callable[[], None]) -> None:
  """Calls `fn` with file descriptor 2 sent to /dev/null, ignoring its errors (the caller is
  already failing and keeps its first error; Orbax's threads would repeat a disk error raw)."""
  sys.stderr.flush()
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  try:
    fn()
  except Exception:  # noqa: BLE001 - see the docstring.
    pass
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)

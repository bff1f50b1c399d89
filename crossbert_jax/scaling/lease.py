"""One sweep driver per root: ROOT/lock.json, the workdir lease of run/lock.py, held while a driver runs.

A second driver on the same root (any executor) is refused in one line naming the first, before it
writes anything: two drivers would each mark the other's running attempts "interrupted" and add
their own wall time to the same runs. The lease is the trainers' (run/lock.py): exclusive create,
a heartbeat every 30 s, and a dead holder's lease (its pid gone on this host, or a heartbeat older
than 300 s) broken with a warning, so a driver killed with -9 never blocks the next one. The
trainers lock their own workdirs (ROOT/runs/<name>/lock.json), a different file.
"""

import contextlib
import json
import pathlib
import time
from typing import Iterator

from crossbert_jax.core.errors import UserError
from crossbert_jax.run import lock as lock_lib


@contextlib.contextmanager
def hold(root: pathlib.Path, warn=print) -> Iterator[None]:
  """Holds the root's driver lease for the block; UserError naming the live holder if another driver has it."""
  root.mkdir(parents=True, exist_ok=True)
  lease = lock_lib.WorkdirLock(root, warn=warn)
  try:
    lease.acquire()
  except UserError:
    path = root / lock_lib.LOCK_FILE
    try:
      held = json.loads(path.read_text())
    except (OSError, ValueError):
      held = {}
    age = time.time() - float(held.get("heartbeat", time.time()))
    raise UserError(f"--root={root} is in use by another sweep driver ({held.get('owner')}@{held.get('host')} "
                    f"pid {held.get('pid')}, heartbeat {age:.0f} s ago; {path}): wait for it to end or stop it "
                    "(SIGTERM saves its runs), then rerun; nothing was started") from None
  try:
    yield
  finally:
    lease.release()

"""A workdir lease: one trainer per workdir, on local disk and object stores (gs://) alike.

`workdir/lock.json` holds {owner, host, pid, token, started, heartbeat}; the holder rewrites
the heartbeat every `HEARTBEAT_S` seconds from a daemon thread and deletes the file on exit.
A second trainer finds a live lease and is refused (UserError: one line, exit 2). A lease is
broken, with a warning, when it is stale (heartbeat older than `STALE_S`), when its holder ran
on this host and its pid is gone (a `kill -9`), or when the user passes `--break_lock`.

Creation is exclusive on local disk (O_EXCL) and on gs:// (a GCS precondition through gcsfs:
`ifGenerationMatch=0`, so of two trainers starting together exactly one creates the object).
Breaking is conditional on the same two: it removes only the lease that was judged breakable
(local: moved aside atomically and compared, a newer one put back; gs://: deleted with
`ifGenerationMatch` of the generation that was read), so of two trainers breaking the same dead
lease, the slower one finds the faster one's fresh lease instead of deleting it.
Other object stores have no exclusive create through epath: there the lease is written, then
read back after `SETTLE_S` and kept only if it still holds our token, which closes the race
except for two starts within the same second or so.
Only process 0 of a multi-process run takes the lease (`held_for_run`); every process learns
whether it got it.
"""

import contextlib

import getpass
import json
import os
import socket
import threading
import time
import uuid
from typing import Callable, Iterator

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from crossbert_jax.core.errors import UserError

LOCK_FILE = "lock.json"
HEARTBEAT_S = 30.0  # How often the holder rewrites its heartbeat.
STALE_S = 300.0  # A heartbeat older than this is a dead holder (10 missed heartbeats).
SETTLE_S = 1.0  # Object stores: wait before reading the lease back.


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _is_local(path: epath.Path) -> bool:
  return "://" not in str(path)


def _is_gcs(path: epath.Path) -> bool:
  return str(path).startswith("gs://")


def _create_on_gcs(path: epath.Path, text: str) -> bool:
  """Creates the gs:// object `path` holding `text` unless it exists (False then), atomically:
  the upload carries `ifGenerationMatch=0`, which GCS refuses (412) once any generation exists."""
  fs = epath.backend.fsspec_backend.fs(str(path))  # epath's own gcsfs instance: one listings cache.
  try:
    fs.pipe_file(str(path), text.encode(), mode="create")
  except FileExistsError:  # gcsfs's name for the 412.
    return False
  return True


def _gcs_generation(path: epath.Path) -> int | None:
  """The generation of the gs:// object `path` (None when it does not exist)."""
  fs = epath.backend.fsspec_backend.fs(str(path))
  try:
    return int(fs.info(str(path), refresh=True)["generation"])
  except FileNotFoundError:
    return None


def _delete_on_gcs(path: epath.Path, generation: int) -> bool:
  """Deletes the gs:// object `path` if it is still at `generation` (False when it changed or is gone)."""
  fs = epath.backend.fsspec_backend.fs(str(path))
  bucket, key, _ = fs.split_path(str(path))
  try:
    fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(generation))
  except (FileNotFoundError, OSError):  # 404: gone; 412 (gcsfs raises it as an OSError): rewritten since.
    return False
  finally:
    fs.invalidate_cache(str(path))
  return True


class WorkdirLock:
  """Holds `workdir/lock.json` between `acquire()` and `release()` (or as a context manager)."""
  def __init__(self, workdir: str | epath.Path, *, break_lock: bool = False, warn: Callable[[str], None] = print,
               on_lost: Callable[[str], None] | None = None):
    self.path = epath.Path(workdir) / LOCK_FILE
    self._break = break_lock
    self._warn = warn
    self._on_lost = on_lost
    self._token = uuid.uuid4().hex
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._renew_failed = False
    self._info = {
        "owner": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(), "token": self._token,
        "started": time.time(), "heartbeat": time.time()}

  # ------------------------------------------------------------------ reading and judging
  def _read(self) -> dict | None:
    try:
      return json.loads(self.path.read_text())
    except FileNotFoundError:
      return None
    except (ValueError, OSError):
      return {}  # Half-written or unreadable: treated as stale below (no heartbeat).

  def _why_breakable(self, held: dict) -> str | None:
    """Why the lease `held` may be taken over, or None when its holder looks alive."""
    if self._break:
      return "--break_lock was given"
    age = time.time() - float(held.get("heartbeat", 0.0))
    if age > STALE_S:
      return f"its heartbeat is {age:.0f} s old (stale after {STALE_S:.0f} s)"
    if held.get("host") == self._info["host"] and isinstance(held.get("pid"), int) and not _pid_alive(held["pid"]):
      return f"process {held['pid']} on this host is gone"
    return None

  # ------------------------------------------------------------------ writing
  def _write(self, exclusive: bool) -> bool:
    """Writes our lease; with `exclusive`, False if a lease exists (or, on object stores other
    than gs://, another writer's lease replaced ours within `SETTLE_S`)."""
    text = json.dumps(self._info)
    if _is_local(self.path):
      if exclusive:
        try:
          fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
          return False
        with os.fdopen(fd, "w") as f:
          f.write(text)
        return True
      tmp = self.path.with_name(f"{LOCK_FILE}.{self._token}.tmp")
      tmp.write_text(text)
      os.replace(tmp, self.path)  # Atomic: readers never see half a heartbeat.
      return True
    if exclusive and _is_gcs(self.path):
      # A retried upload whose first try landed finds our own lease: ours all the same.
      return _create_on_gcs(self.path, text) or (self._read() or {}).get("token") == self._token
    self.path.write_text(text)
    if exclusive:
      time.sleep(SETTLE_S)
      return (self._read() or {}).get("token") == self._token
    return True

  def acquire(self) -> "WorkdirLock":
    """Takes the lease or raises UserError naming its holder."""
    for _ in range(3):  # A lease released or broken between our read and write: try again.
      generation = _gcs_generation(self.path) if _is_gcs(self.path) else None
      held = self._read()
      if held is not None:
        why = self._why_breakable(held)
        if why is None:
          raise UserError(
              f"workdir {self.path.parent} is in use by {held.get('owner')}@{held.get('host')} pid {held.get('pid')} "
              f"(heartbeat {time.time() - float(held.get('heartbeat', 0)):.0f} s ago, lock {self.path}); "
              f"use another --workdir, stop that run, or pass --break_lock if it is dead")
        if not self._remove_if_unchanged(held, generation):
          continue  # Broken (or renewed) by someone else since we read it: judge the lease there now.
        self._warn(f"warning: breaking the lock {self.path} of {held.get('owner')}@{held.get('host')} "
                   f"pid {held.get('pid')}: {why}")
      if self._write(exclusive=True):
        self._thread = threading.Thread(target=self._heartbeat, name="workdir-lock", daemon=True)
        self._thread.start()
        return self
    raise UserError(f"could not take the lock {self.path}: another trainer is starting in the same "
                    "workdir; use another --workdir")

  def _remove_if_unchanged(self, held: dict, generation: int | None) -> bool:
    """Removes the lease if it is still `held` (read at `generation` on gs://); False if it changed or is gone."""
    if _is_gcs(self.path):
      if generation is None:
        return False
      return _delete_on_gcs(self.path, generation)
    if not _is_local(self.path):  # Other object stores: no conditional delete through epath.
      self.path.unlink(missing_ok=True)
      return True
    aside = self.path.with_name(f"{LOCK_FILE}.{self._token}.broken")
    try:
      os.rename(self.path, aside)  # Atomic: of two breakers, one moves it.
    except FileNotFoundError:
      return False
    try:
      taken = json.loads(aside.read_text())
    except (ValueError, OSError):
      taken = {}
    if taken != held:  # A lease written since we judged it (a breaker that was faster): put it back.
      try:
        os.link(aside, self.path)
      except FileExistsError:
        pass
      aside.unlink()
      return False
    aside.unlink()
    return True

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      held = self._read()
      if held is not None and held.get("token") not in (None, self._token):
        if self._on_lost is not None:
          self._on_lost(f"the lock {self.path} was taken over by {held.get('owner')}@{held.get('host')} "
                        f"pid {held.get('pid')}")
        return
      self._info["heartbeat"] = time.time()
      try:
        self._write(exclusive=False)
      except OSError as e:  # A full or read-only disk: the loop's own writes report it.
        if not self._renew_failed:
          self._warn(f"warning: could not renew the lock {self.path}: {e}")
        self._renew_failed = True

  def release(self) -> None:
    """Stops the heartbeat and deletes the lease if it is still ours."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
      self._thread = None
      try:
        if (self._read() or {}).get("token") == self._token:
          self.path.unlink()
      except OSError:
        pass  # Read-only or gone: the next run breaks it (our pid is gone by then).

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


@contextlib.contextmanager
def held_for_run(workdir: str | epath.Path, *, break_lock: bool, warn: Callable[[str], None],
                 on_lost: Callable[[str], None]) -> Iterator[WorkdirLock]:
  """The lease of a (possibly multi-process) run: process 0 takes it, every process learns
  whether it did (refused: one line on each), and process 0 releases it at the end."""
  primary = jax.process_index() == 0
  lease = WorkdirLock(workdir, break_lock=break_lock, warn=warn, on_lost=on_lost)
  held = True
  if primary:
    try:
      lease.acquire()
    except UserError:
      if jax.process_count() == 1:
        raise
      held = False
  if jax.process_count() > 1:
    held = bool(multihost_utils.broadcast_one_to_all(np.int32(held)))
    if not held:
      raise UserError(f"process 0 could not lock --workdir {workdir} (see its error line)")
  try:
    yield lease
  finally:
    if primary:
      lease.release()

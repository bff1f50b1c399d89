"""A run's checkpoints: the one module that knows their on-disk layout and what each step records.

`CheckpointLayout` is where things lie (`workdir/checkpoints/STEP/ITEM`); `CheckpointMeta` is what
a step records besides its state, iterator position and config; `Checkpointer` saves and reads
steps through Orbax. Saves are async (the device->host copy finishes before `save` returns, so the
donated state can be reused at once); `keep` most recent are retained, and every step in
`keep_steps` (a WSD stable run's fork points). Paths go through epath, so gs:// works. A
`read_only` Checkpointer (a fork's source run) creates, renames and deletes nothing.

A step that cannot be read back (truncated or emptied files, missing items) is passed over for the
previous one (`first_readable`, the one fallback): the trainer renames it `damaged-<step>`
(`restore_latest`; in a multi-process run the processes agree on it: a step any one of them cannot
read is damaged for all), a reader (`run/load.py`) leaves it in place with a warning.
"""

import dataclasses
import json
import os
import re
import sys
from typing import Any, Callable, NamedTuple, Sequence

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections
from crossbert_jax.core.errors import one_line

DIRECTORY = "checkpoints"
_ITEMS = ("state", "data", "config", "meta")  # The items of a step (meta: absent in older runs).
_COMMITTED = "_CHECKPOINT_METADATA"  # Orbax writes it last: a step folder without it is unfinished.
_STATE_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")  # A data item's iterator state of process P of N.
_REASON_BYTES = 240  # A failure's reason, as gathered from every process (UTF-8, truncated).


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
  """Where a run's checkpoints lie: `workdir/checkpoints/STEP/{state,data,config,meta}`, a step set
  aside as `checkpoints/damaged-STEP`. The data item holds one iterator state per process that
  wrote the step: `data/process_P-of-N.json`."""

  workdir: epath.Path

  @classmethod
  def of(cls, workdir: str | os.PathLike, absolute: bool = False) -> "CheckpointLayout":
    """The layout under `workdir`; `absolute`: made absolute when local (Orbax needs absolute paths)."""
    workdir = str(workdir)
    return cls(epath.Path(workdir if "://" in workdir or not absolute else os.path.abspath(workdir)))

  @property
  def directory(self) -> epath.Path:
    return self.workdir / DIRECTORY

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def damaged_dir(self, step: int) -> epath.Path:
    return self.directory / f"damaged-{step}"

  def item(self, step: int, name: str) -> epath.Path:
    assert name in _ITEMS, name
    return self.step_dir(step) / name

  def steps_on_disk(self) -> list[int]:
    """The step folders on disk, finished or not (not Orbax's view: an async save may have failed late)."""
    try:
      return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())
    except OSError:
      return []

  def process_count(self, step: int) -> int | None:
    """The processes that wrote `step`'s iterator states; None for an unfinished step or none saved."""
    data = self.item(step, "data")
    if not (self.step_dir(step) / _COMMITTED).exists() or not data.is_dir():
      return None
    counts = {int(m.group(2)) for p in data.iterdir() if (m := _STATE_FILE.fullmatch(p.name))}
    return counts.pop() if len(counts) == 1 else None

  def iterator_states(self, step: int, count: int) -> list[dict[str, Any]]:
    """The `count` per-process iterator states saved with `step`, in process order."""
    return [json.loads((self.item(step, "data") / f"process_{p}-of-{count}.json").read_text()) for p in range(count)]


@dataclasses.dataclass(frozen=True)
class CheckpointMeta:
  """What a step records besides its state, iterator position and config (the JSON item `meta`).

  Checkpoints older than a field lack it (and the oldest the whole item): it reads as its default.
  """

  tokenizer: dict[str, Any] | None = None  # {path, sha256, vocab_size} of the run's tokenizer file.
  tokens_seen: int | None = None  # Tokens trained on up to the step, all processes together.
  process_count: int | None = None  # The processes that wrote the step.
  # Per-source tokens of the run's streams before the step's own (a data.mixture), all processes.
  source_tokens_before: dict[str, float] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_json(cls, saved: dict[str, Any] | None) -> "CheckpointMeta":
    saved = saved or {}
    tokens = saved.get("tokens_seen")
    return cls(tokenizer=saved.get("tokenizer"), tokens_seen=None if tokens is None else int(tokens),
               process_count=saved.get("process_count"),
               source_tokens_before=dict(saved.get("source_tokens_before", {})))

  def to_json(self) -> dict[str, Any]:
    out = {"tokenizer": self.tokenizer, "tokens_seen": self.tokens_seen, "process_count": self.process_count}
    if self.source_tokens_before:
      out["source_tokens_before"] = dict(self.source_tokens_before)
    return out

  def tokens_at(self, step: int, saved_config: dict[str, Any]) -> int:
    """Tokens trained on up to `step` (checkpoints before the count: step x their batch x length)."""
    if self.tokens_seen is not None:
      return self.tokens_seen
    return step * saved_config["train"]["batch_size"] * saved_config["data"]["seq_len"]


class Restored(NamedTuple):
  """A checkpoint step read back: its step, state, meta and config (as saved, a dict)."""
  step: int
  state: Any
  meta: CheckpointMeta
  config: dict[str, Any]


def _is_barrier_mismatch(error: Exception) -> bool:
  """Whether `error` is Orbax's closing barrier failing because another process joined ours instead."""
  return isinstance(error, AssertionError) and "sync_global_devices name mismatch" in str(error)


def _on_every_process(step: int, attempt: Callable[[], Any]) -> tuple[Any, str | None]:
  """(attempt(), None) where it succeeded on every process, else (None, why it failed, naming the process).

  `attempt` reads items of `step` through Orbax; every Orbax restore ends in a barrier of all
  processes. A process whose read raised left before that barrier, which the others wait in:
  it joins one of its own, so every process runs the same collectives (the mismatch fails the
  others' restore too). Then all processes gather who failed and why, so they agree on the step.
  One process: the attempt's own error, no collective.
  """
  try:
    return_value, failure = attempt(), None
  except Exception as e:  # noqa: BLE001 - any unreadable item means a damaged step.
    return_value, failure = None, e
    if jax.process_count() > 1 and not _is_barrier_mismatch(e):
      try:
        multihost_utils.sync_global_devices(f"checkpoint step {step} unreadable here")
      except AssertionError:
        pass  # Some processes read the step: they waited in Orbax's barrier, with another name.
  if jax.process_count() == 1:
    return return_value, None if failure is None else one_line(failure)
  # Per process: 0 read it, 1 could not read it, 2 stopped by another's failure; then the reason.
  code = 0 if failure is None else 2 if _is_barrier_mismatch(failure) else 1
  text = b"" if code != 1 else one_line(failure).encode()[:_REASON_BYTES - 1]
  mine = np.zeros(_REASON_BYTES, np.uint8)
  mine[0], mine[1:1 + len(text)] = code, np.frombuffer(text, np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(mine))
  failed = [p for p in range(gathered.shape[0]) if gathered[p, 0] == 1]
  if not failed and not gathered[:, 0].any():
    return return_value, None
  if not failed:  # Only barrier mismatches: should not happen; still a step not every process read.
    return None, "the processes disagreed reading it"
  p = failed[0]
  why = bytes(gathered[p, 1:]).rstrip(b"\0").decode(errors="replace")
  more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
  return None, f"process {p}{more}: {why}"


def first_readable(steps: Sequence[int], attempt: Callable[[int], tuple[Any, str | None]],
                   on_damaged: Callable[[int, str], None]) -> tuple[int, Any] | None:
  """(step, value) of the first of `steps` whose `attempt(step)` gives (value, None); None if none does.

  Every step passed over goes to `on_damaged(step, reason)` first, which may raise to stop there.
  `attempt` raises only to refuse the run (a UserError), never for an unreadable item.
  """
  _drop_abandoned_read_errors()
  for step in steps:
    value, reason = attempt(step)
    if reason is None:
      return step, value
    on_damaged(step, reason)
  return None


def _drop_abandoned_read_errors() -> None:
  """Installs (once) a `sys.unraisablehook` that drops the "Event loop is closed" errors of the
  TensorStore reads a failed Orbax restore leaves behind: their callbacks fire into the restore's
  closed event loop, and each would print a traceback after (or before) the run's own line."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_abandoned_reads", False):
    return

  def hook(unraisable: Any) -> None:
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
      previous(unraisable)

  hook.drops_abandoned_reads = True
  sys.unraisablehook = hook


def is_save_step(ckpt_cfg: sections.Checkpoint, step: int) -> bool:
  """Whether the training loop saves `step` before its end: every checkpoint.every_steps steps and at
  every checkpoint.keep_steps (the final step is saved anyway)."""
  return (ckpt_cfg.every_steps > 0 and step % ckpt_cfg.every_steps == 0) or step in ckpt_cfg.keep_steps


class Checkpointer:
  """Save/restore of {state, data iterator, config, meta} under `workdir/checkpoints`."""
  def __init__(self, workdir: str | epath.Path, ckpt_cfg: sections.Checkpoint, read_only: bool = False):
    self.layout = CheckpointLayout.of(workdir, absolute=True)
    self.directory = self.layout.directory
    self.read_only = read_only
    policy = ocp.checkpoint_managers.LatestN(ckpt_cfg.keep)
    if ckpt_cfg.keep_steps:
      policy = ocp.checkpoint_managers.AnyPreservationPolicy([
          policy, ocp.checkpoint_managers.CustomSteps(list(ckpt_cfg.keep_steps))])
    options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=not read_only, read_only=read_only,
                                           enable_async_checkpointing=ckpt_cfg.async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  @classmethod
  def reader(cls, workdir: str | epath.Path, read_only: bool = True) -> "Checkpointer":
    """A Checkpointer that only reads (keep settings matter only to a writer: a reader deletes nothing)."""
    return cls(workdir, sections.Checkpoint(every_steps=1, keep=1, keep_steps=(), async_save=False), read_only)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def reload(self) -> None:
    """Re-reads the steps on disk (another process may have added or removed some)."""
    self._manager.reload()

  def save(self, step: int, state: Any, data_iter: Any, config: plan_lib.Settings,
           meta: CheckpointMeta | None = None) -> None:
    """Saves (asynchronously) unless `step` is already saved.

    `data_iter` is the iterator, or its `get_state()` dict taken earlier (the loop reads one
    batch past a save to check the params; the saved position is the one before it).
    """
    if step in self._manager.all_steps():
      return
    args = {"state": ocp.args.StandardSave(state), "config": ocp.args.JsonSave(config.to_dict())}
    if meta is not None:
      args["meta"] = ocp.args.JsonSave(meta.to_json())
    if isinstance(data_iter, dict):
      data_iter = _IteratorState(data_iter)
    if data_iter is not None:
      args["data"] = grain.checkpoint.CheckpointSave(data_iter)
    self._manager.save(step, args=ocp.args.Composite(**args), force=True)

  def saved_meta(self, step: int) -> CheckpointMeta:
    """The run metadata stored with `step` (all defaults for checkpoints written before it existed)."""
    if not self.layout.item(step, "meta").exists():
      return CheckpointMeta()
    return CheckpointMeta.from_json(
        self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])

  def saved_config(self, step: int) -> dict:
    """The config stored with `step`."""
    out = self._manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return out["config"]

  def restore_latest(self, vet: Callable[[int, dict, CheckpointMeta], Any], read: Callable[[int, Any], Any],
                     warn: Callable[[str], None], primary: bool) -> Restored | None:
    """The newest complete checkpoint, or None if there is none.

    `vet(step, config, meta)` vets a step before its state is read (it raises UserError to refuse
    the run) and returns how to read it, which `read(step, how)` does, returning the state. A
    step whose items cannot be read, by any process, is renamed aside (by process 0) with a
    one-line warning, and every process tries the next older one.
    """
    def attempt(step: int) -> tuple[Restored | None, str | None]:
      items, reason = _on_every_process(step, lambda: (self.saved_config(step), self.saved_meta(step)))
      if reason is not None:
        return None, reason
      config, meta = items
      how = vet(step, config, meta)
      state, reason = _on_every_process(step, lambda: read(step, how))
      return Restored(step, state, meta, config), reason

    found = first_readable(sorted(self.all_steps(), reverse=True), attempt,
                           lambda step, reason: self._set_aside(step, reason, warn, primary))
    return None if found is None else found[1]

  def _set_aside(self, step: int, reason: str, warn: Callable[[str], None], primary: bool) -> None:
    path, aside = self.layout.step_dir(step), self.layout.damaged_dir(step)
    older = [s for s in self.all_steps() if s < step]
    fallback = f"falling back to step {max(older)}" if older else "no older checkpoint: starting from scratch"
    warn(f"warning: checkpoint step {step} in {self.directory} is damaged ({reason}); moved to {aside.name}, "
         f"{fallback}")
    if primary and not self.read_only:
      if aside.exists():
        aside.rmtree()
      path.rename(aside)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
    self._manager.reload()

  def restore(self, step: int, abstract_state: Any, shardings: Any, data_iter: Any) -> Any:
    """Restores the state into `shardings` and the iterator in place; returns the state."""
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)
    args = {"state": ocp.args.StandardRestore(target)}
    if data_iter is not None:
      args["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    return self._manager.restore(step, args=ocp.args.Composite(**args))["state"]

  def restore_params(self, step: int, abstract_params: Any, shardings: Any) -> Any:
    """Only the params of the state saved at `step`, into `shardings` (the optimizer state is not read)."""
    target = {
        "params": jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params,
                               shardings)}
    args = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                  partial_restore=True)
    return self._manager.restore(step, args=ocp.args.Composite(state=args))["state"]["params"]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


class _IteratorState:
  """A data iterator's state taken earlier, saved by Grain's handler like the iterator itself."""
  def __init__(self, state: dict):
    self._state = state

  def get_state(self) -> bytes:
    return json.dumps(self._state, indent=4).encode()

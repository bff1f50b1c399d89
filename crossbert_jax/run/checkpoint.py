"""Orbax checkpoints holding the train state, the Grain iterator, the config and run metadata.

Saves are async (the device->host copy finishes before `save` returns, so the donated state can
be reused at once); `keep` most recent are retained, and every step in `keep_steps` (a WSD stable
run's fork points). Paths go through epath, so gs:// works. A `read_only` Checkpointer (a fork's
source run) creates, renames and deletes nothing.
Items of a step: state (TrainState), data (per-process iterator JSON), config (JSON), meta
(JSON: the tokenizer's identity and the running tokens_seen count; absent in older runs).
A step that cannot be read back (truncated or emptied files, missing items) is renamed
`damaged-<step>` and the previous complete step is used (`restore_latest`); in a multi-process
run the processes agree on it: a step any one of them cannot read is damaged for all.
"""

import json
import os
import sys
from typing import Any, Callable

import grain
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError

# Keys whose change makes an old checkpoint unusable for a run (shapes or semantics differ).
_MODEL_KEYS = ("objective", "model", "reconstructor")


_REASON_BYTES = 240  # A failure's reason, as gathered from every process (UTF-8, truncated).


def _reason(error: Exception) -> str:
  return " ".join(f"{type(error).__name__}: {error}".split())[:200]


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
    return return_value, None if failure is None else _reason(failure)
  # Per process: 0 read it, 1 could not read it, 2 stopped by another's failure; then the reason.
  code = 0 if failure is None else 2 if _is_barrier_mismatch(failure) else 1
  text = b"" if code != 1 else _reason(failure).encode()[:_REASON_BYTES - 1]
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


class Checkpointer:
  """Save/restore of {state, data iterator, config} under `workdir/checkpoints`."""

  def __init__(self, workdir: str | epath.Path, ckpt_cfg: ml_collections.ConfigDict, read_only: bool = False):
    workdir = str(workdir)
    # Orbax needs absolute paths; URLs such as gs://... are absolute already.
    self.directory = epath.Path(workdir if "://" in workdir else os.path.abspath(workdir)) / "checkpoints"
    self.read_only = read_only
    policy = ocp.checkpoint_managers.LatestN(ckpt_cfg.keep)
    if ckpt_cfg.keep_steps:
      policy = ocp.checkpoint_managers.AnyPreservationPolicy(
          [policy, ocp.checkpoint_managers.CustomSteps(list(ckpt_cfg.keep_steps))])
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policy, create=not read_only, read_only=read_only,
        enable_async_checkpointing=ckpt_cfg.async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, data_iter: Any, config: ml_collections.ConfigDict,
           meta: dict | None = None) -> None:
    """Saves (asynchronously) unless `step` is already saved.

    `data_iter` is the iterator, or its `get_state()` dict taken earlier (the loop reads one
    batch past a save to check the params; the saved position is the one before it).
    """
    if step in self._manager.all_steps():
      return
    args = {"state": ocp.args.StandardSave(state), "config": ocp.args.JsonSave(config.to_dict())}
    if meta is not None:
      args["meta"] = ocp.args.JsonSave(meta)
    if isinstance(data_iter, dict):
      data_iter = _IteratorState(data_iter)
    if data_iter is not None:
      args["data"] = grain.checkpoint.CheckpointSave(data_iter)
    self._manager.save(step, args=ocp.args.Composite(**args), force=True)

  def saved_meta(self, step: int) -> dict | None:
    """The run metadata stored with `step` (None for checkpoints written before it existed)."""
    if not (self.directory / str(step) / "meta").exists():
      return None
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore_latest(self, accept: Callable[[int, dict, dict | None], bool], abstract_state: Any, shardings: Any,
                     data_for: Callable[[int], Any], warn: Callable[[str], None],
                     primary: bool) -> tuple[int, Any, dict | None] | None:
    """(step, state, meta) of the newest complete checkpoint, or None if there is none.

    `accept(step, config, meta)` vets a step before its state is read (it raises UserError to
    refuse the run) and says whether the data iterator is restored too: `data_for(step)`, the
    iterator of that step's phase (a run with phases reads one stream per phase). A step whose items
    cannot be read, by any process, is renamed aside (by process 0) with a one-line warning, and
    every process tries the next older one.
    """
    for step in sorted(self.all_steps(), reverse=True):
      read, reason = _on_every_process(step, lambda: (self.saved_config(step), self.saved_meta(step)))
      if reason is not None:
        self._set_aside(step, reason, warn, primary)
        continue
      config, meta = read
      restore_data = accept(step, config, meta)
      state, reason = _on_every_process(
          step, lambda: self.restore(step, abstract_state, shardings, data_for(step) if restore_data else None))
      if reason is not None:
        self._set_aside(step, reason, warn, primary)
        continue
      return step, state, meta
    return None

  def _set_aside(self, step: int, reason: str, warn: Callable[[str], None], primary: bool) -> None:
    path, aside = self.directory / str(step), self.directory / f"damaged-{step}"
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

  def saved_config(self, step: int) -> dict:
    """The config stored with `step`."""
    out = self._manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return out["config"]

  def check_compatible(self, step: int, config: ml_collections.ConfigDict) -> None:
    """UserError if the checkpoint at `step` was made for another model than `config`'s."""
    saved, now = self.saved_config(step), config.to_dict()
    for top in _MODEL_KEYS:
      a, b = saved.get(top), now[top]
      if isinstance(b, dict):
        for k in sorted(b):
          if a is None or a.get(k) != b[k]:
            raise UserError(
                f"--workdir {self.directory.parent} holds a checkpoint (step {step}) with {top}.{k}="
                f"{None if a is None else a.get(k)!r}, but the config says {b[k]!r}; use a new --workdir "
                f"or the checkpoint's config")
      elif a != b:
        raise UserError(f"--workdir {self.directory.parent} holds a checkpoint (step {step}) with "
                        f"{top}={a!r}, but the config says {b!r}; use a new --workdir")

  def restore(self, step: int, abstract_state: Any, shardings: Any, data_iter: Any) -> Any:
    """Restores the state into `shardings` and the iterator in place; returns the state."""
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract_state, shardings)
    args = {"state": ocp.args.StandardRestore(target)}
    if data_iter is not None:
      args["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    return self._manager.restore(step, args=ocp.args.Composite(**args))["state"]

  def restore_params(self, step: int, abstract_params: Any, shardings: Any) -> Any:
    """Only the params of the state saved at `step`, into `shardings` (the optimizer state is not read)."""
    target = {"params": jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                     abstract_params, shardings)}
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


def _params_placement(c: ml_collections.ConfigDict, abstract: Any) -> Any:
  """Shardings for the params: one local device when they fit in a fraction of its memory, else
  FSDP over a mesh of all local devices (the model's own logical axes)."""
  from crossbert_jax.training import program, sharding  # Local: program imports the model stack.

  devices = jax.local_devices()
  nbytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(abstract))
  limit = (devices[0].memory_stats() or {}).get("bytes_limit") if hasattr(devices[0], "memory_stats") else None
  if len(devices) == 1 or limit is None or nbytes <= _ONE_DEVICE_FRACTION * limit:
    one = jax.sharding.SingleDeviceSharding(devices[0])
    return jax.tree.map(lambda _: one, abstract)
  mesh_cfg = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1, "rules": ()})
  mesh = sharding.make_mesh(mesh_cfg, devices=devices)
  return program.param_shardings(c, mesh, sharding.logical_rules(mesh_cfg))


# Params up to this fraction of one device's memory are restored onto it; larger ones are sharded.
_ONE_DEVICE_FRACTION = 0.5


def load_run(workdir: str | epath.Path, step: int | None = None) -> tuple[ml_collections.ConfigDict, Any, int]:
  """(config, params, step) of a training run's checkpoint (latest if `step` is None).

  The config is that of the step's phase (`core/phases.py`): in a run with phases, the sequence
  length, RoPE thetas and data the checkpoint was last trained with, which evaluation uses and
  export writes into the Hugging Face config; a run without phases, its own config.

  For evaluation and export: restores only the params item of the state (Orbax partial restore:
  no optimizer is built and its state is never read), onto the first local device, or sharded
  over all local devices when they would not fit on one (`_params_placement`). The params are
  the model's full tree: "encoder" plus "reconstructor" or "head".
  """
  from crossbert_jax.training import program  # Local: program imports the model stack.

  directory = epath.Path(str(workdir))
  if not (directory / "checkpoints").exists():
    raise UserError(f"--workdir {directory} holds no checkpoints/: point it at a training run's workdir")
  ckpt = Checkpointer(directory, ml_collections.ConfigDict({"keep": 1, "keep_steps": (), "async_save": False}))
  try:
    steps = ckpt.all_steps()
    if not steps:
      raise UserError(f"--workdir {directory} holds no finished checkpoint yet")
    if step is not None and step not in steps:
      raise UserError(f"--step={step}: {directory} has checkpoints at steps {sorted(steps)}")
    # The newest readable step; a damaged one is skipped with a warning (and left in place: the
    # trainer, not a reader, sets it aside). An explicit --step must be readable.
    for candidate in [step] if step is not None else sorted(steps, reverse=True):
      try:
        # A run with phases: the config its step was trained under (seq_len, RoPE thetas, batch, data).
        saved = config_lib.from_dict(ckpt.saved_config(candidate))
        config = phases_lib.phase_at(phases_lib.expand(saved), candidate).config
        abstract = program.abstract_params(config)
        params = ckpt.restore_params(candidate, abstract, _params_placement(config, abstract))
      except UserError:
        raise
      except Exception as e:  # noqa: BLE001 - any unreadable item means a damaged step.
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        if step is not None or candidate == min(steps):
          fix = "pick another --step" if step is not None else "no readable checkpoint is left"
          raise UserError(f"checkpoint step {candidate} in {directory} is unreadable ({reason}); {fix}") from None
        print(f"warning: checkpoint step {candidate} in {directory} is unreadable ({reason}); trying the previous one",
              file=sys.stderr, flush=True)
        continue
      step = candidate
      break
  finally:
    ckpt.close()
  return config, params, step

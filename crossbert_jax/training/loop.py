"""The pretraining loop: CrossBERT or flat BERT on a device mesh (`run(config, workdir)`).

A workdir that already holds a checkpoint resumes from it exactly (state, data iterator,
masks), after `resume.check` vetted the config and tokenizer; a damaged newest checkpoint
falls back to the previous one. One trainer per workdir (`lock`). SIGTERM / SIGINT stop every
process at the same step, which is saved (`preemption`); the result's status is then
"stopped" (exit code EXIT_STOPPED). Only params whose next loss was checked finite are saved
(`guard`). A full or read-only workdir is one error line. Metrics go to workdir/metrics.jsonl
and TensorBoard, fetched one step late so the host never blocks the device. This is the top
of the library: it uses the frozen probes (`evaluation`) and HF import (`hf`) below it. The
CLI is `crossbert_jax.train`.
"""

import errno
import logging
import os
import sys
import time
import warnings
from typing import Any

import jax
import ml_collections
from jax.experimental import multihost_utils
import numpy as np
from etils import epath

from crossbert_jax.core import config as config_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import pipeline as data
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.training import (checkpoint, elastic, flops, fork, guard, lock as lock_lib, metrics, optimizer,
                                    preemption, resume, sharding, step)


class TrainingDiverged(UserError):
  """The loss became non-finite; the last good checkpoint is kept."""


def load_tokenizer(c: ml_collections.ConfigDict) -> tokenizer_lib.Tokenizer:
  """The run's tokenizer, checked against the model's vocabulary."""
  if not c.data.tokenizer:
    raise UserError("config data.tokenizer is empty: train one with `python -m crossbert_jax.tokenizer "
                    "--input=builtin --vocab_size=N --output=FILE.model` and pass --config.data.tokenizer=FILE.model")
  tok = tokenizer_lib.Tokenizer.load(c.data.tokenizer)
  if tok.vocab_size > c.model.vocab_size:
    raise UserError(f"config model.vocab_size={c.model.vocab_size} is smaller than the tokenizer's "
                    f"{tok.vocab_size} pieces ({c.data.tokenizer}); set --config.model.vocab_size>={tok.vocab_size}")
  return tok


class _StepMetrics:
  """Fetches a step's device metrics one step late and turns them into the logged scalars."""

  def __init__(self, c: ml_collections.ConfigDict, num_devices: int):
    self.tokens_per_step = c.train.batch_size * c.data.seq_len
    self.flops_per_step = flops.train_flops_per_step(c)
    self.num_devices = num_devices
    self.peak = flops.peak_tflops_per_device(jax.devices()[0], c.model.dtype, c.metrics.cpu_peak_tflops)
    self.last_time = None

  def scalars(self, step_num: int, device_metrics: dict, dispatched_at: float, tokens_seen: int) -> dict[str, float]:
    """Blocks until the step is done; its time is measured from the previous step's end."""
    host = jax.device_get(device_metrics)
    now = time.perf_counter()
    # The first step after a (re)start includes compilation: timed from its dispatch.
    dt = now - (self.last_time if self.last_time is not None else dispatched_at)
    self.last_time = now
    out = {k: float(np.asarray(v)) for k, v in host.items()}
    out.update(
        step_time=dt,
        tokens_per_second=self.tokens_per_step / dt,
        flops_per_step=self.flops_per_step,
        tflops_per_device=flops.achieved_tflops_per_device(self.flops_per_step, dt, self.num_devices),
        mfu=flops.mfu(self.flops_per_step, dt, self.num_devices, self.peak),
        tokens_seen=float(tokens_seen),
    )
    return out


def _probe_scores(c: ml_collections.ConfigDict, state: step.TrainState, tok, primary: bool) -> dict[str, float]:
  """Frozen probes (eval.tasks) on the encoder: gathered to every host, scored on process 0."""
  from crossbert_jax.evaluation import runner as evaluate  # Local: scikit-learn and the task readers load only when used.

  encoder = multihost_utils.process_allgather(state.params["encoder"], tiled=True)
  return evaluate.probe_scores(c, encoder, tok) if primary else {}


# Model keys an imported encoder must share with the run's config.
_IMPORT_KEYS = ("vocab_size", "embed_dim", "num_heads", "num_layers", "mlp_dim", "global_every",
                "local_window", "rope_theta", "local_rope_theta", "norm_eps", "scan_layers")


def _init_from_imported(c: ml_collections.ConfigDict, state: step.TrainState,
                        shardings: step.TrainState) -> step.TrainState:
  """The fresh state with its encoder (and MLM head) replaced by `train.init_from`'s params."""
  from crossbert_jax.hf import convert as export  # Local: pulls in the Hugging Face conversion code.

  imported_cfg, imported = export.load_imported(c.train.init_from)
  for k in _IMPORT_KEYS:
    if imported_cfg.model[k] != c.model[k]:
      raise UserError(f"config train.init_from={c.train.init_from} has model.{k}={imported_cfg.model[k]!r} but "
                      f"the config says {c.model[k]!r}; set --config.model.{k}={imported_cfg.model[k]!r}")
  params = dict(state.params)
  for part in ("encoder", "head"):
    if part in imported and part in params:
      params[part] = jax.tree.map(lambda new, old: jax.device_put(np.asarray(new, old.dtype), old.sharding),
                                  imported[part], params[part])
  return state.replace(params=params)


# OSError numbers of a full or read-only workdir: reported in one line, not a traceback.
_ENV_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
               errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
               errno.EPERM: "operation not permitted", errno.EFBIG: "the file is too large"}


def _environment_error(e: BaseException) -> tuple[str, str] | None:
  """(reason, path) if `e` (or what it wraps: Orbax re-raises its writer's errors) is a full or
  read-only workdir, else None."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _ENV_ERRNOS:
      return _ENV_ERRNOS[e.errno], str(e.filename or "")
    text = str(e)
    for err, reason in _ENV_ERRNOS.items():
      if os.strerror(err) in text:
        return reason, ""
    e = e.__cause__ or e.__context__
  return None


class _EnvironmentLogFilter(logging.Filter):
  """Drops the tracebacks Orbax's writer threads log for a full or read-only disk: `run` reports it in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += f" {record.exc_info[1]}"
    return not any(os.strerror(err) in text for err in _ENV_ERRNOS)


def _intact_steps(workdir: epath.Path) -> list[int]:
  try:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  except OSError:
    return []


def run(c: ml_collections.ConfigDict, workdir: str, *, break_lock: bool = False) -> dict[str, Any]:
  """Trains `c` in `workdir` (resuming if it holds a checkpoint); returns the last logged scalars.

  The result's "status" is "finished", "stopped" (a signal: resumable) or "nothing_to_do".
  """
  config_lib.validate(c)
  workdir = epath.Path(workdir)
  primary = jax.process_index() == 0
  mesh = sharding.make_mesh(c.mesh)
  rules = sharding.logical_rules(c.mesh)
  sharding.check_batch_divisible(c.train.batch_size, c.train.grad_accum, mesh)
  tok = load_tokenizer(c)
  tok_id = resume.tokenizer_identity(c.data.tokenizer, tok.vocab_size)
  warn = (lambda msg: print(msg, file=sys.stderr, flush=True)) if primary else (lambda msg: None)
  state_of_run = {"last_good": None, "doing": f"creating {workdir}"}
  for handler in logging.getLogger().handlers:
    if not any(isinstance(f, _EnvironmentLogFilter) for f in handler.filters):
      handler.addFilter(_EnvironmentLogFilter())
  try:
    with preemption.StopRequest() as stop:
      workdir.mkdir(parents=True, exist_ok=True)
      state_of_run["doing"] = f"taking the lock in {workdir}"
      lost: list[str] = []  # Another trainer broke our lease: stop, and save nothing over its checkpoints.
      lease = lock_lib.WorkdirLock(workdir, break_lock=break_lock, warn=warn,
                                   on_lost=lambda msg: (lost.append(msg), stop.request("lock lost")))
      held = True
      if primary:
        try:
          lease.acquire()
        except UserError:
          if jax.process_count() == 1:
            raise
          held = False
      if jax.process_count() > 1:  # Every process learns whether process 0 got the lease.
        held = bool(multihost_utils.broadcast_one_to_all(np.int32(held)))
        if not held:
          raise UserError(f"process 0 could not lock --workdir {workdir} (see its error line)")
      try:
        return _train(c, workdir, mesh, rules, tok, tok_id, stop, warn, primary, state_of_run, lost)
      finally:
        if primary:
          lease.release()
  except (UserError, KeyboardInterrupt):
    raise
  except Exception as e:
    env = _environment_error(e)
    if env is None:
      raise
    reason, path = env
    # Orbax's unfinished writes would add "coroutine ... was never awaited" lines at exit.
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    intact = _intact_steps(workdir)  # Not last_good: an async save may have failed after `save` returned.
    kept = (f"the checkpoints of steps {intact} in {workdir / 'checkpoints'} are intact" if intact
            else "no checkpoint was written")
    raise UserError(f"{reason} while {state_of_run['doing']}{' (' + path + ')' if path else ''}; {kept}: "
                    f"free space or make {workdir} writable, then rerun the same command to resume") from None


def _train(c, workdir, mesh, rules, tok, tok_id, stop, warn, primary, state_of_run, lost) -> dict[str, Any]:
  tx = optimizer.make_optimizer(c.train)
  abstract, shardings = step.state_shardings(c, tx, mesh, rules)
  data_iter = data.make_iterator(c.data, tok, batch_size=c.train.batch_size // jax.process_count(),
                                 seed=c.train.seed, process_index=jax.process_index(),
                                 process_count=jax.process_count())
  state_of_run["doing"] = f"reading the checkpoints in {workdir}"
  ckpt = checkpoint.Checkpointer(workdir, c.checkpoint)

  resharded = {}  # The data state of a checkpoint saved on another process count.

  def accept(saved_step, saved_config, saved_meta):
    written_by = elastic.saved_process_count(workdir, saved_step)
    old_count = written_by[1] if written_by else None
    lines, restore_data = resume.check(str(workdir), saved_step, saved_config, saved_meta, c, tok_id,
                                       jax.process_count(), old_count)
    if restore_data and (other := elastic.reshard(workdir, saved_step, old_count, saved_config, c,
                                                  jax.process_count())):
      lines.append(other[0])
      resharded["state"], restore_data = other[1], False
    for line in lines:
      warn(line)
    return restore_data

  found = ckpt.restore_latest(accept, abstract, shardings, data_iter, warn, primary)
  forked = found is None and bool(c.train.fork_from)  # A fork's first start: its source's checkpoint, read only.
  if forked:
    found = fork.restore(c, workdir, tok_id, abstract, shardings, data_iter, warn)
  if found is not None:
    start, state, meta = found
    if resharded.get("state") is not None:
      data_iter.set_state(resharded["state"])
    tokens_at_start = meta["tokens_seen"] if forked else resume.saved_tokens_seen(start, ckpt.saved_config(start), meta)
  else:
    start, tokens_at_start = 0, 0
    state = step.init_state(c, tx, mesh, rules, shardings)
    if c.train.init_from:
      state = _init_from_imported(c, state, shardings)
  end = min(c.train.steps, c.train.stop_at_step or c.train.steps)
  if found is not None and start >= end:
    key = "train.stop_at_step" if c.train.stop_at_step and c.train.stop_at_step < c.train.steps else "train.steps"
    warn(f"nothing to train: {workdir} already holds step {start} and {key}={c.train[key.split('.')[1]]}; "
         f"raise --config.{key} to continue")
    ckpt.close()
    return {"status": "nothing_to_do", "step": start}
  state_of_run["last_good"] = start if found is not None else None
  state_of_run["doing"] = f"writing {workdir / 'config.json'}"
  if primary:
    (workdir / "config.json").write_text(c.to_json_best_effort(indent=2))
  train_step = step.make_train_step(c, tx, mesh, rules, shardings)
  loss_check = guard.make_loss_check(c, mesh, rules, shardings)
  sync = preemption.StopSync(mesh)
  tracker = _StepMetrics(c, mesh.size)
  tokens_per_step = c.train.batch_size * c.data.seq_len
  tokens_at = lambda s: tokens_at_start + (s - start) * tokens_per_step
  logger = metrics.MetricsLogger(str(workdir), total_steps=c.train.steps, start_step=start, enabled=primary,
                                 tensorboard=c.metrics.tensorboard, progress_bar=c.metrics.progress_bar)
  logger.log_text(f"{c.objective}: {'resuming from step ' + str(start) if found is not None else 'starting'} "
                  f"in {workdir} on {mesh.size} device(s), mesh {dict(mesh.shape)}")

  last: dict[str, Any] = {"status": "finished"}
  pending = None  # (step number after the update, device metrics, dispatch time) not yet fetched.

  def kept() -> str:
    good = state_of_run["last_good"]
    return f"the last good checkpoint (step {good}) is kept" if good is not None else "no checkpoint was saved"

  def drain(p, probes_of=None):
    nonlocal last
    step_num, device_metrics, dispatched_at = p
    state_of_run["doing"] = f"writing the metrics of step {step_num} in {workdir}"
    scalars = tracker.scalars(step_num, device_metrics, dispatched_at, tokens_at(step_num))
    if probes_of is not None and np.isfinite(scalars["loss"]):
      scalars.update(_probe_scores(c, probes_of, tok, primary))
    if not np.isfinite(scalars["loss"]):
      raise TrainingDiverged(f"loss is {scalars['loss']} at step {step_num}; stopping. In {workdir}, {kept()}; "
                             "lower train.learning_rate or raise train.warmup_steps")
    if step_num % c.metrics.log_every == 0 or step_num == c.train.steps or probes_of is not None:
      logger.log(step_num, scalars)
    last = {**last, "step": step_num, "first_loss": last.get("first_loss", scalars["loss"]), **scalars}

  def checked_save(step_num, state):
    """Saves `state` once the loss of its params on the next batch is finite; returns that batch."""
    position = data_iter.get_state()
    batch = sharding.global_batch(next(data_iter), mesh)
    loss = float(np.asarray(loss_check(state, batch).addressable_data(0)))
    if not np.isfinite(loss):
      raise TrainingDiverged(f"loss is {loss} at step {step_num + 1} (checked before saving step {step_num}, which "
                             f"is not saved); stopping. In {workdir}, {kept()}; lower train.learning_rate or raise "
                             "train.warmup_steps")
    state_of_run["doing"] = f"saving the checkpoint of step {step_num} in {workdir}"
    ckpt.save(step_num, state, position, c,
              {"tokenizer": tok_id, "tokens_seen": tokens_at(step_num), "process_count": jax.process_count()})
    state_of_run["last_good"] = step_num
    return batch

  finished = False
  try:
    next_batch = None  # The batch a checked save already read.
    for step_num in range(start + 1, end + 1):
      batch = next_batch if next_batch is not None else sharding.global_batch(next(data_iter), mesh)
      next_batch = None
      dispatched_at = time.perf_counter()
      state, device_metrics = train_step(state, batch)
      stopping = sync.agreed(stop.signal_name is not None)
      if pending is not None:
        drain(pending)  # The previous step: the device is already busy with this one.
      pending = (step_num, device_metrics, dispatched_at)
      if c.eval.every_steps and step_num % c.eval.every_steps == 0:
        drain(pending, probes_of=state)  # Frozen probes on this step's params, in its metrics row.
        pending = None
      if stopping:
        logger.log_text(f"{stop.signal_name or 'a stop signal on another process'} received: saving step "
                        f"{step_num} and stopping")
        last["status"] = "stopped"
        break
      if step_num % c.checkpoint.every_steps == 0 or step_num in c.checkpoint.keep_steps:
        if pending is not None:
          drain(pending)
          pending = None
        next_batch = checked_save(step_num, state)
    if pending is not None:
      drain(pending)
    sync.flush()
    if lost:
      raise UserError(f"{lost[0]}; stopped at step {last.get('step')} without saving over its checkpoints")
    final = int(jax.device_get(state.step))
    if final > start or found is None:
      checked_save(final, state)
    state_of_run["doing"] = f"finishing the checkpoint writes in {workdir}"
    ckpt.wait()
    finished = True
  finally:
    logger.close()
    if hasattr(data_iter, "close"):
      data_iter.close()  # Stops Grain's worker processes now rather than at interpreter exit.
    if finished:
      ckpt.close()
    else:  # Already failing: keep the first error; Orbax's writer threads would repeat a disk error raw.
      _without_stderr(ckpt.close)
  return last


def _without_stderr(fn) -> None:
  """Calls `fn` with file descriptor 2 sent to /dev/null, ignoring its errors."""
  sys.stderr.flush()
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  try:
    fn()
  except Exception:  # noqa: BLE001 - see the caller.
    pass
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)

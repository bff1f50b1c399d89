"""The pretraining loop: CrossBERT or flat BERT on a device mesh (`run(config, workdir)`).

A workdir that already holds a checkpoint resumes from it exactly (state, data iterator,
masks). SIGTERM / SIGINT save a checkpoint and stop. Metrics go to workdir/metrics.jsonl and
TensorBoard, fetched one step late so the host never blocks the device. This is the top of the
library: it uses the frozen probes (`evaluation`) and HF import (`hf`) below it. The CLI is
`crossbert_jax.train`.
"""

import signal
import time
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
from crossbert_jax.training import checkpoint, flops, metrics, optimizer, sharding, step


class TrainingDiverged(UserError):
  """The loss became non-finite; the last good checkpoint is kept."""


class _StopRequest:
  """Turns SIGTERM/SIGINT into a flag the loop checks between steps (a second SIGINT aborts)."""

  def __init__(self):
    self.signal_name = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    if self.signal_name is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.signal_name = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


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

  def scalars(self, step_num: int, device_metrics: dict, dispatched_at: float) -> dict[str, float]:
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
        tokens_seen=float(step_num) * self.tokens_per_step,
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


def run(c: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `c` in `workdir` (resuming if it holds a checkpoint); returns the last logged scalars."""
  config_lib.validate(c)
  workdir = epath.Path(workdir)
  primary = jax.process_index() == 0
  mesh = sharding.make_mesh(c.mesh)
  rules = sharding.logical_rules(c.mesh)
  sharding.check_batch_divisible(c.train.batch_size, c.train.grad_accum, mesh)
  tok = load_tokenizer(c)
  workdir.mkdir(parents=True, exist_ok=True)

  tx = optimizer.make_optimizer(c.train)
  abstract, shardings = step.state_shardings(c, tx, mesh, rules)
  data_iter = data.make_iterator(c.data, tok, batch_size=c.train.batch_size // jax.process_count(),
                                 seed=c.train.seed, process_index=jax.process_index(),
                                 process_count=jax.process_count())
  ckpt = checkpoint.Checkpointer(workdir, c.checkpoint)
  latest = ckpt.latest_step()
  if latest is not None:
    ckpt.check_compatible(latest, c)
    state = ckpt.restore(latest, abstract, shardings, data_iter)
  else:
    state = step.init_state(c, tx, mesh, rules, shardings)
    if c.train.init_from:
      state = _init_from_imported(c, state, shardings)
  start = int(jax.device_get(state.step))
  if primary:
    (workdir / "config.json").write_text(c.to_json_best_effort(indent=2))
  train_step = step.make_train_step(c, tx, mesh, rules, shardings)
  tracker = _StepMetrics(c, mesh.size)
  logger = metrics.MetricsLogger(str(workdir), total_steps=c.train.steps, start_step=start, enabled=primary,
                                 tensorboard=c.metrics.tensorboard, progress_bar=c.metrics.progress_bar)
  logger.log_text(f"{c.objective}: {'resuming from step ' + str(start) if latest is not None else 'starting'} "
                  f"in {workdir} on {mesh.size} device(s), mesh {dict(mesh.shape)}")

  last: dict[str, Any] = {}
  pending = None  # (step number after the update, device metrics, dispatch time) not yet fetched.
  last_good = latest

  def drain(p, probes_of=None):
    nonlocal last
    step_num, device_metrics, dispatched_at = p
    scalars = tracker.scalars(step_num, device_metrics, dispatched_at)
    if probes_of is not None and np.isfinite(scalars["loss"]):
      scalars.update(_probe_scores(c, probes_of, tok, primary))
    if not np.isfinite(scalars["loss"]):
      kept = f"the last good checkpoint (step {last_good}) is kept" if last_good is not None else "no checkpoint was saved"
      raise TrainingDiverged(f"loss is {scalars['loss']} at step {step_num}; stopping. In {workdir}, {kept}; "
                             "lower train.learning_rate or raise train.warmup_steps")
    if step_num % c.metrics.log_every == 0 or step_num == c.train.steps or probes_of is not None:
      logger.log(step_num, scalars)
    last = {"step": step_num, "first_loss": last.get("first_loss", scalars["loss"]), **scalars}

  try:
    with _StopRequest() as stop:
      end = min(c.train.steps, c.train.stop_at_step or c.train.steps)
      for step_num in range(start + 1, end + 1):
        if stop.signal_name:
          logger.log_text(f"{stop.signal_name} received: saving step {step_num - 1} and stopping")
          break
        batch = sharding.global_batch(next(data_iter), mesh)
        dispatched_at = time.perf_counter()
        state, device_metrics = train_step(state, batch)
        if pending is not None:
          drain(pending)  # The previous step: the device is already busy with this one.
        pending = (step_num, device_metrics, dispatched_at)
        if c.eval.every_steps and step_num % c.eval.every_steps == 0:
          drain(pending, probes_of=state)  # Frozen probes on this step's params, in its metrics row.
          pending = None
        if step_num % c.checkpoint.every_steps == 0:
          if pending is not None:
            drain(pending)  # Never checkpoint a state whose loss was not checked.
            pending = None
          ckpt.save(step_num, state, data_iter, c)
          last_good = step_num
      if pending is not None:
        drain(pending)
      final = int(jax.device_get(state.step))
      if final > start or latest is None:
        ckpt.save(final, state, data_iter, c)
    ckpt.wait()
  finally:
    logger.close()
    ckpt.close()
  return last

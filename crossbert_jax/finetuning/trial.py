"""One trial, resumable: restore or start, train epoch by epoch, score dev, write the result once.

A trial's folder holds trial.json (what it is: task, grid point, seed, its start, the encoder's spec), its
Orbax checkpoints (checkpoints/STEP/{params,opt}: the params item alone is what export and an MNLI start
read), metrics.jsonl (the train loss per step, the dev scores per epoch; the same curves in tensorboard/ and,
with `Wandb`, in a W&B run whose id wandb_run.json keeps, so a resumed trial continues it) and, when finished,
result.json:
a trial with a result is never trained again. A checkpoint is saved at every epoch's end and on SIGTERM /
SIGINT (then `Stopped`: the command exits 75, rerun to resume). The batches are a function of the step
(finetuning/batches.py), so a resumed trial trains exactly as an uninterrupted one, bit for bit.
"""

import dataclasses
import json
import time
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from crossbert_jax.evaluation import glue, probes
from crossbert_jax.finetuning import batches as batches_lib
from crossbert_jax.finetuning import program as program_lib
from crossbert_jax.finetuning import recipe
from crossbert_jax.finetuning.classifier import HeadSpec
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.run import metrics as metrics_lib
from crossbert_jax.run import preemption
from crossbert_jax.run import wandb_logger
from crossbert_jax.training.program import TrainState

RESULT_FILE = "result.json"
TRIAL_FILE = "trial.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"


class Stopped(Exception):
  """A trial stopped by SIGTERM / SIGINT after saving its checkpoint."""


@dataclasses.dataclass(frozen=True)
class Wandb:
  """Where a trial's curves also go: a W&B run named <task>/<trial> in `group` (the command's --wandb flags)."""
  project: str
  entity: str
  group: str


@dataclasses.dataclass(frozen=True)
class TaskData:
  """A task's splits tokenized: train, and the dev split of each reported row."""
  name: str
  train: batches_lib.Encoded
  dev: dict[str, batches_lib.Encoded]  # {row: its dev split}


def num_labels(task: str) -> int:
  return glue.TASKS[task].num_classes or 1


def scores(task: str, logits_NxC: np.ndarray, labels: np.ndarray) -> dict[str, float]:
  """GLUE's metrics of one row's predictions (evaluation/probes.py's: MCC, F1, accuracy, Pearson, Spearman)."""
  pred = logits_NxC[:, 0] if logits_NxC.shape[1] == 1 else np.argmax(logits_NxC, axis=1)
  return {m: float(probes.METRICS[m](labels, pred)) for m in glue.TASKS[task].metrics}


def evaluate(program: program_lib.Program, params: Any, data: TaskData, lengths: tuple[int, ...],
             batch_size: int) -> dict[str, dict[str, float]]:
  """{row: {metric: score}} on the dev split(s)."""
  out = {}
  for row, split in data.dev.items():
    logits = np.zeros((len(split), num_labels(data.name)), np.float32)
    for b in batches_lib.eval_batches(split, batch_size, lengths):
      logits[b["rows"]] = program.logits(params, b)[:len(b["rows"])]
    out[row] = scores(data.name, logits, split.labels)
  return out


class Checkpoints:
  """checkpoints/STEP/{params, opt} through Orbax (kept: the last one)."""
  def __init__(self, folder: epath.Path):
    options = ocp.CheckpointManagerOptions(max_to_keep=1, create=True, enable_async_checkpointing=False)
    self.manager = ocp.CheckpointManager(str(folder.absolute() / CHECKPOINTS), options=options,
                                         item_names=("params", "opt"))

  def latest(self) -> int | None:
    return self.manager.latest_step()

  def save(self, state: TrainState) -> None:
    step = int(state.step)
    if self.manager.latest_step() != step:
      self.manager.save(
          step, args=ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                                        opt=ocp.args.StandardSave({"step": state.step, "opt_state": state.opt_state})))
      self.manager.wait_until_finished()

  def restore(self, step: int, program: program_lib.Program) -> TrainState:
    target = lambda tree, shardings: jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree,
                                                  shardings)
    abstract = jax.eval_shape(lambda: program.tx.init(program.abstract_params))
    s = program.shardings
    got = self.manager.restore(
        step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target(program.abstract_params, s.params)), opt=ocp.args.StandardRestore(
                target({"step": jax.ShapeDtypeStruct((), np.int32), "opt_state": abstract},
                       {"step": s.step, "opt_state": s.opt_state}))))
    return TrainState(step=got.opt["step"], params=got.params, opt_state=got.opt["opt_state"])

  def close(self) -> None:
    self.manager.close()


def read_params(folder: epath.Path, abstract: Any) -> Any:
  """The final params of a finished trial (host numpy)."""
  manager = ocp.CheckpointManager(str(folder.absolute() / CHECKPOINTS), item_names=("params", "opt"),
                                  options=ocp.CheckpointManagerOptions(create=False))
  try:
    step = manager.latest_step()
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_one_device()), abstract)
    got = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
  finally:
    manager.close()
  return jax.tree.map(np.asarray, got.params)


def _one_device():
  return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _metrics_rows(folder: epath.Path, upto: int) -> list[str]:
  """metrics.jsonl's lines up to step `upto` (a resumed trial rewrites what came after its checkpoint)."""
  path = folder / METRICS_FILE
  if not path.exists():
    return []
  return [l for l in path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= upto]


def run(folder: epath.Path, info: dict[str, Any], data: TaskData, start: dict[str, Any],
        log: Callable[[str], None] = print, wandb: Wandb | None = None) -> dict[str, Any]:
  """Trains the trial described by `info` (trial.json) in `folder` from `start` ({"encoder"[, "head"...]}),
  or resumes it; returns its result (also written to result.json)."""
  if (folder / RESULT_FILE).exists():
    return json.loads((folder / RESULT_FILE).read_text())
  folder.mkdir(parents=True, exist_ok=True)
  (folder / TRIAL_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
  t = info["trial"]
  batch_size = info["batch_size"]
  per_epoch = batches_lib.steps_per_epoch(len(data.train), batch_size)
  total = total_steps(info, len(data.train))
  spec = EncoderSpec(**info["encoder"])
  program = program_lib.Program(spec, HeadSpec(**info["head"]),
                                program_lib.make_optimizer(t["learning_rate"], t["weight_decay"], total))
  ckpt, sink = Checkpoints(folder), None
  try:
    step = ckpt.latest()
    state = ckpt.restore(step, program) if step is not None else program.init_state(t["seed"], start)
    step = int(state.step)
    lines = _metrics_rows(folder, step)
    (folder / METRICS_FILE).write_text("".join(l + "\n" for l in lines))
    log(f"{folder.name}: {'resuming at step ' + str(step) if step else 'starting'} ({total} steps, "
        f"{per_epoch} per epoch)")
    sink = None if wandb is None else wandb_logger.open_run(
        folder, project=wandb.project, entity=wandb.entity, name=f"{data.name}/{folder.name}", group=wandb.group,
        tags=("finetune", data.name), config=info, warn=log, flag="--wandb")
    dev = _train(folder, program, ckpt, state, data, info, total, per_epoch, sink)
  finally:
    ckpt.close()
    if sink is not None:
      sink.close()
  result = {"trial": t, "task": data.name, "steps": total, "dev": dev}
  (folder / RESULT_FILE).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
  return result


def _train(folder: epath.Path, program: program_lib.Program, ckpt: Checkpoints, state: TrainState, data: TaskData,
           info: dict[str, Any], total: int, per_epoch: int,
           sink: wandb_logger.WandbSink | None = None) -> dict[str, dict[str, float]]:
  """The steps left; a checkpoint and the dev scores at each epoch's end (and the last step); Stopped on a
  signal. Returns the last dev scores (of the final params)."""
  t, batch_size, lengths = info["trial"], info["batch_size"], batches_lib.buckets(info["max_length"])
  with preemption.StopRequest() as stop, _Curves(folder, sink) as out:
    pending, start, dev = None, time.perf_counter(), None
    for step in range(int(state.step), total):
      batch = batches_lib.train_batch(data.train, step, batch_size, t["seed"], lengths)
      state, metrics = program.step(state, batch)
      out.write(pending)  # One step late: the host does not wait for the device.
      pending = {"step": step + 1, **metrics}
      if (step + 1) % per_epoch == 0 or step + 1 == total:
        out.write(pending)
        pending = None
        dev = evaluate(program, state.params, data, lengths, batch_size)
        row = {"step": step + 1, "epoch": (step + 1) // per_epoch, "seconds": round(time.perf_counter() - start, 3)}
        out.write({**row, **{f"dev/{r}/{m}": v for r, ms in dev.items() for m, v in ms.items()}})
        out.flush()
        ckpt.save(state)
      if stop.signal_name:
        out.write(pending)
        out.flush()
        ckpt.save(state)
        raise Stopped(f"{folder.name}: stopped by {stop.signal_name} at step {step + 1}; checkpoint saved")
  if int(state.step) == total and dev is None:  # Restored at the very end (killed after the last save).
    dev = evaluate(program, state.params, data, lengths, batch_size)
  return dev


class _Curves:
  """A trial's rows, appended to metrics.jsonl and written to TensorBoard (tensorboard/ in its folder) and W&B (with
  a sink); a resumed trial's repeated steps are written again, and TensorBoard shows the latest."""
  def __init__(self, folder: epath.Path, sink: wandb_logger.WandbSink | None = None):
    self._file = (folder / METRICS_FILE).open("a")
    self._writer = metrics_lib.tensorboard_writer(str(folder / metrics_lib.TENSORBOARD_DIR))
    self._sink = sink

  def write(self, row: dict[str, Any] | None) -> None:
    if row is None:
      return
    row = {k: (v if isinstance(v, (int, float)) else float(v)) for k, v in row.items()}  # Device scalars: float.
    self._file.write(json.dumps(row) + "\n")
    scalars = {k: v for k, v in row.items() if k not in ("step", "epoch", "seconds")}
    for key, value in scalars.items():
      self._writer.add_scalar(key, value, global_step=row["step"])
    if self._sink is not None:
      self._sink.log(row["step"], scalars)

  def flush(self) -> None:
    self._file.flush()
    self._writer.flush()

  def __enter__(self) -> "_Curves":
    return self

  def __exit__(self, *exc_info) -> None:
    self._file.close()
    self._writer.close()


def total_steps(info: dict[str, Any], num_rows: int) -> int:
  """The trial's steps: its epochs over the train split, or `max_steps` when that is fewer (a smoke run)."""
  total = batches_lib.steps_per_epoch(num_rows, info["batch_size"]) * info["trial"]["epochs"]
  return min(total, info["max_steps"]) if info["max_steps"] else total


def trial_info(trial: recipe.Trial, spec: EncoderSpec, head: HeadSpec, *, start: str, source: str,
               batch_size: int = recipe.BATCH_SIZE, max_length: int = recipe.MAX_LENGTH,
               max_steps: int = 0) -> dict[str, Any]:
  """What trial.json records: enough to run, resume, read back and export the trial."""
  return {
      "trial": dataclasses.asdict(trial), "encoder": dataclasses.asdict(spec), "head": dataclasses.asdict(head),
      "start": start, "source": source, "batch_size": batch_size, "max_length": max_length, "max_steps": max_steps}

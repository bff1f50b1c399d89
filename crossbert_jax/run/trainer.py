"""The pretraining run: CrossBERT or flat BERT on a device mesh (`run(config, workdir)`).

`run` validates the config, reads every phase's data once (`feed.check_streams`), takes the
workdir's lease (`lock`) and turns a full or read-only disk into one error line (`environment`);
`Trainer.train` is the run itself, top to bottom: restore the newest checkpoint (the restore
policy, `restore`, vets its config and tokenizer; a damaged step falls back to the previous one),
or a fork's source checkpoint (`fork`), or initialise; then the steps, each followed by the hooks
due at it (`hooks`: metrics, probes, periodic saves); then the final save. Only params whose next
loss was checked finite are saved (`TrainProgram.check_loss`; where the next step starts another
data stream, on one more batch of the current one, so a save never reads the next phase's data).
SIGTERM / SIGINT stop every process at the same step, which is saved (`preemption`); the status
is then "stopped" (exit code EXIT_STOPPED). The CLI is `crossbert_jax.train`. Around the steps:
the profile.* trace window (`profile`), each step's wall time by cause (`goodput`, logged after
the final save) and W&B beside metrics.jsonl (`wandb_logger`).

A run with phases (`core/phases.py`) trains each phase under its own config: at its first step
the loop makes it current (`_enter`), rebuilding the TrainProgram for its config and, when it
reads another data stream, the iterator (`feed`). A checkpoint's data state is that of its
step's phase, so a restore first enters that phase. The state, its shardings and the optimizer
state are the same in every phase.
"""

import os
import sys
import time
from typing import Any, Callable

import jax
import numpy as np
from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import outputs
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import mixture, pipeline, tokenizer as tokenizer_lib
from crossbert_jax.run import (checkpoint, environment, feed as feed_lib, fork, goodput,
                               hooks as hooks_lib, lock, metrics, preemption, profile, recorder, restore, resume,
                               wandb_logger, warm_start)
from crossbert_jax.run.recorder import Outcome, Progress, TrainingDiverged  # noqa: F401 - re-exported.
from crossbert_jax.training import objectives, program as program_lib, sharding


def load_tokenizer(c: plan_lib.Settings) -> tokenizer_lib.Tokenizer:
  """The run's tokenizer, checked against the model's vocabulary."""
  if not c.data.tokenizer:
    raise UserError("config data.tokenizer is empty: train one with `python -m crossbert_jax.tokenizer "
                    "--input=builtin --vocab_size=N --output=FILE.model` and pass --config.data.tokenizer=FILE.model")
  tok = tokenizer_lib.Tokenizer.load(c.data.tokenizer)
  if tok.vocab_size > c.model.vocab_size:
    raise UserError(f"config model.vocab_size={c.model.vocab_size} is smaller than the tokenizer's vocabulary (ids "
                    f"0-{tok.vocab_size - 1}, {c.data.tokenizer}): set --config.model.vocab_size>={tok.vocab_size}")
  return tok


def run(c: plan_lib.Settings, workdir: str, *, break_lock: bool = False,
        started: float | None = None) -> dict[str, Any]:
  """Trains `c` in `workdir` (resuming if it holds a checkpoint); returns the last logged scalars.

  The result's "status" is "finished", "stopped" (a signal: resumable) or "nothing_to_do";
  `started`: time.time() when the command started (goodput's start-up; default: now).
  """
  started = time.time() if started is None else started
  # A file (or one on the way), or a read-only disk, is one line before any work, not a traceback.
  outputs.check_folder_path(workdir, "--workdir", writes_inside=True)
  fork.check_workdir(c, workdir)
  workdir = epath.Path(workdir)
  mesh = sharding.make_mesh(c.mesh)
  phases = list(c.phases)
  phases_lib.check_each(phases, lambda phase: _check_phase(c, phases, phase, mesh))
  tok = load_tokenizer(c)
  feed_lib.check_streams(phases, tok, seed=c.train.seed, process_index=jax.process_index(),
                         process_count=jax.process_count())
  progress = Progress(doing=f"creating {workdir}")
  environment.install_log_filter()
  created = not workdir.exists()
  before = set() if created else {p.name for p in workdir.iterdir()}
  try:
    with environment.reported(workdir, progress), preemption.StopRequest() as stop:
      workdir.mkdir(parents=True, exist_ok=True)
      progress.doing = f"taking the lock in {workdir}"
      warn = _warn if jax.process_index() == 0 else (lambda msg: None)

      def lost(msg: str) -> None:  # Another trainer broke our lease (the lock's heartbeat thread).
        progress.lost_lock = msg
        stop.request("lock lost")

      with lock.held_for_run(workdir, break_lock=break_lock, warn=warn, on_lost=lost):
        return Trainer(c, workdir, mesh, tok, stop, progress, warn, started).train()
  except BaseException:
    if jax.process_index() == 0 and "://" not in str(workdir) and not progress.training:
      _drop_empty_new_folders(workdir, before, created)
    raise


def _drop_empty_new_folders(workdir: epath.Path, before: set[str], created: bool) -> None:
  """After a failed start: removes the folders this start made that hold no file (checkpoints/,
  compilation_cache/, the workdir itself when it made it). Anything holding a file stays."""
  if not workdir.is_dir():
    return
  for entry in workdir.iterdir():
    if entry.name not in before and entry.is_dir() and not any(files for _, _, files in os.walk(entry)):
      entry.rmtree()
  if created and not any(workdir.iterdir()):
    workdir.rmdir()


def _check_phase(c: plan_lib.Settings, phases: list[phases_lib.Phase], phase: phases_lib.Phase,
                 mesh: jax.sharding.Mesh) -> None:
  """UserError for a phase the run cannot train: its data path, its batch on this mesh and processes."""
  if phase.index > 0 and phase.stream != phases[phase.index - 1].stream:
    pipeline.check_paths(phase.config.data)  # Before the tokenizer loads; `feed.check_streams` reads it then.
  sharding.check_batch_divisible(phase.config.train.batch_size, c.train.grad_accum, mesh)
  if phase.read_batch % jax.process_count():
    raise UserError(f"config train.batch_size: the phases' data stream is read {phase.read_batch} rows at a "
                    f"time, which {jax.process_count()} processes cannot split; make the batch sizes of "
                    "consecutive phases multiples of the process count")


def _warn(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


class Trainer:
  """One process start of a run: restore or init, the steps, the saves, the stop."""

  def __init__(self, c: plan_lib.Settings, workdir: epath.Path, mesh: jax.sharding.Mesh,
               tok: tokenizer_lib.Tokenizer, stop: preemption.StopRequest, progress: Progress,
               warn: Callable[[str], None], started: float):
    self.c, self.workdir, self.tok, self.stop, self.progress, self.warn = c, workdir, tok, stop, progress, warn
    self.started = started  # time.time() at the command's start.
    self.primary = jax.process_index() == 0
    self.tok_id = resume.tokenizer_identity(c.data.tokenizer, tok)
    self.mesh, self.phases = mesh, list(c.phases)
    self._replacement_vocab = objectives.replacement_vocab_size(c, tok.vocab_size)
    self.phase = self.phases[0]
    self.program = program_lib.TrainProgram(self.phase.config, mesh, replacement_vocab=self._replacement_vocab,
                                            specials=tok.special_ids)
    self.data = feed_lib.PhaseFeed(tok, seed=c.train.seed, process_index=jax.process_index(),
                                   process_count=jax.process_count())
    self.data.enter(self.phase)  # A restore into a later phase's stream replaces it (`_enter_phase_of`).
    progress.doing = f"reading the checkpoints in {workdir}"
    self.ckpt = checkpoint.Checkpointer(workdir, c.checkpoint)
    self.outcome = Outcome()
    self._next_batch = None  # The batch a checked save already read for the next step.
    self._data_wait = 0.0  # Seconds blocked on input since the last dispatched step.
    self._forked = False  # Started from train.fork_from's checkpoint (this process start).
    self._counted_stream: int | None = None  # The stream whose per-source tokens `_end_stream` counted.
    # Per-source tokens of the run's streams before the current one, all processes (in checkpoint meta).
    self._source_tokens_before: dict[str, float] = {}
    self.tokens_at_start = 0  # Tokens trained on before this process start's first step (`_restore_or_init`).
    self.start = 0  # The step this process start resumes after (`_begin`).
    self.sync = preemption.StopSync(mesh)
    # Made by `_begin` once the run is known to train (a run with nothing to do writes no log).
    self.logger: metrics.MetricsLogger | None = None
    self.recorder: recorder.StepRecorder | None = None
    self.hooks: list[hooks_lib.Hook] = []  # The loop's side duties, in order (`hooks`).
    self.goodput: goodput.Ledger | None = None  # This start's wall time by cause (`_begin`).
    self.profiler: profile.Profiler | None = None

  def train(self) -> dict[str, Any]:
    """The run, top to bottom; its outcome (`Outcome.as_dict`)."""
    c = self.c
    t0 = time.perf_counter()
    state, start, restored = self._restore_or_init()
    restore_s = time.perf_counter() - t0 if restored else 0.0
    end = min(c.train.steps, c.train.stop_at_step or c.train.steps)
    if restored and start >= end:
      return self._nothing_to_do(start)
    self._begin(start, restored, restore_s)
    finished, self.progress.training = False, True
    try:
      for step_num in range(start + 1, end + 1):
        began = time.perf_counter()
        self.profiler.before_step(step_num)
        with self.profiler.annotate(step_num):
          self._enter(phases_lib.phase_at(self.phases, step_num))
          info = self._step(state, step_num)
          state = info.state
          took = hooks_lib.run_due(self.hooks, info)  # Metrics, probes, saves: each at its own steps.
        self.profiler.after_step(step_num, info.device_metrics)
        self._account(step_num, began, info, took)
        if info.stopping:
          self._log_stop(step_num)
          break
      self._finish(state, start, restored)
      finished = True
    finally:
      self._close(finished)
    return self.outcome.as_dict()

  # -- Phases -----------------------------------------------------------------------------------

  def _enter(self, phase: phases_lib.Phase) -> None:
    """Makes `phase` current: its TrainProgram (same state shardings, its own jit) and its data stream."""
    if phase.index != self.phase.index:
      if self.logger is not None:  # Not while restoring: the log starts with `_begin`.
        self.recorder.new_phase()
        changed = phases_lib.changes(self.phase, phase)
        self.logger.log_text(f"{phase.describe()}: {', '.join(f'{k}={v!r}' for k, v in changed.items())}")
      self.program = program_lib.TrainProgram(phase.config, self.mesh, replacement_vocab=self._replacement_vocab,
                                              specials=self.tok.special_ids)
      if self.logger is not None and phase.stream != self.phase.stream:
        self._end_stream()
    self.phase = phase
    try:
      self.data.enter(phase)
    except UserError as e:  # Data that went bad since `feed.check_streams` read it.
      raise self._in_phase(e) from None

  def _in_phase(self, error: UserError) -> UserError:
    """`error`, naming the current phase (in a run with phases)."""
    return UserError(f"{error} (in {self.phase.describe()})" if len(self.phases) > 1 else str(error))

  def _end_stream(self) -> None:
    """The current stream ends here: a mixture's per-source tokens join the run's count (once; a
    restore reads the count from the checkpoint's meta)."""
    if self.phase.config.data.mixture and self._counted_stream != self.phase.stream:
      self._source_tokens_before = recorder.add_tokens(
          self._source_tokens_before, recorder.summed_over_processes(mixture.source_tokens(self.data.iterator)))
    self._counted_stream = self.phase.stream

  def _enter_phase_of(self, step: int) -> Any:
    """Makes `step`'s phase current; its iterator, the one a checkpoint of `step` restores."""
    self._enter(phases_lib.phase_at(self.phases, step))
    return self.data.iterator

  # -- Restore or init --------------------------------------------------------------------------

  def _restore_or_init(self) -> tuple[program_lib.TrainState, int, bool]:
    """(state, its step, whether it came from a checkpoint); sets `tokens_at_start`."""
    p = self.program
    read = lambda step, plan: restore.read(self.ckpt, step, plan, p.abstract, p.shardings, self._enter_phase_of)
    found = self.ckpt.restore_latest(self._vet_own, read, self.warn, self.primary)
    if found is not None:
      self.progress.last_good = found.step
    elif self.c.train.fork_from:  # A fork's first start: its source's checkpoint, read only.
      found, self.c = fork.restore(self.c, self.workdir, self.tok_id, p.abstract, p.shardings, self._enter_phase_of,
                           self.warn)
      self._forked = True
    if found is not None:
      self.tokens_at_start = found.meta.tokens_at(found.step, found.config)
      self._source_tokens_before = dict(found.meta.source_tokens_before)
      return found.state, found.step, True
    state = p.init_state()
    if self.c.train.init_from:
      state = warm_start.from_imported(self.phases[0].config, state, self.tok)
    return state, 0, False

  def _vet_own(self, step: int, saved_config: dict, meta: checkpoint.CheckpointMeta) -> restore.Plan:
    """Vets this run's checkpoint `step` before its state is read (UserError refuses the run); how to read it."""
    self.c = fork.check_resumed(self.c, self.workdir, step, saved_config)
    plan = restore.vet(self.workdir, step, saved_config, meta, self.c, self.tok_id, forking=False)
    for line in plan.lines:
      self.warn(line)
    return plan

  def _nothing_to_do(self, start: int) -> dict[str, Any]:
    t = self.c.train
    key = "train.stop_at_step" if t.stop_at_step and t.stop_at_step < t.steps else "train.steps"
    where = (f"the fork starts at its source's step {start} ({t.fork_from}), nothing written to {self.workdir}"
             if self._forked else f"{self.workdir} already holds step {start}")
    self.warn(f"nothing to train: {where}, and {key}={t[key.split('.')[1]]}; raise --config.{key} to continue")
    self.ckpt.close()
    return Outcome(status="nothing_to_do", step=start).as_dict()

  def _begin(self, start: int, restored: bool, restore_s: float) -> None:
    """config.json, the metrics logger (and W&B) and recorder, the profiler, goodput, the first log line."""
    c, mesh = self.c, self.program.mesh
    self.start = start
    self.progress.doing = f"writing {self.workdir / 'config.json'}"
    if self.primary:
      (self.workdir / "config.json").write_text(c.to_json())
    logged = ([r["step"] for r in metrics.read_metrics(self.workdir)]
              if self.primary and metrics.metrics_files(self.workdir) else [])
    sink = wandb_logger.start(c, self.workdir, self.warn) if self.primary else None
    self.logger = metrics.MetricsLogger(str(self.workdir), total_steps=c.train.steps, start_step=start,
                                        enabled=self.primary, tensorboard=c.metrics.tensorboard,
                                        progress_bar=c.metrics.progress_bar, eta_by_work=len(self.phases) > 1,
                                        sink=sink)
    self.profiler = profile.Profiler(c.profile, self.workdir, start + 1, self.logger.log_text)
    self.recorder = recorder.StepRecorder(c, mesh.size, self.logger, self._tokens_at, self.progress,
                                          self.outcome, str(self.workdir), self.warn, phases=self.phases)
    phase_config = lambda: self.phase.config
    self.hooks = [hooks_lib.metrics(self.recorder, self._source_tokens),
                  hooks_lib.probes(c.eval.every_steps, self.recorder, phase_config, self.tok, self.primary),
                  hooks_lib.saves(c.checkpoint, self.recorder, self._checked_save)]
    how = (f"forked from {c.train.fork_from}" if self._forked else f"resuming from step {start}" if restored
           else "starting")
    self.logger.log_text(f"{c.objective}: {how} in {self.workdir} on {mesh.size} device(s), mesh {dict(mesh.shape)}")
    self.goodput = goodput.Ledger(self.workdir, self.started, self.primary, max(logged, default=0))
    self.goodput.add("restore", restore_s)
    self.goodput.add("startup", time.time() - self.started - restore_s)

  def _account(self, step_num: int, began: float, info: hooks_lib.StepInfo, took: dict[str, float]) -> None:
    """Goodput: the step's wall time, less its input wait, save and probes (a save's read-ahead is input)."""
    extra = ("compile" if step_num in (self.start + 1, self.phase.start + 1) else
             "profile" if self.profiler.traced(step_num) else None)
    self.goodput.step(step_num, time.perf_counter() - began, extra, data_wait=info.data_wait_s,
                      save=took.get("save", 0.0) - self._data_wait, eval=took.get("probes", 0.0))
    if "save" in took:  # A kill after this checkpoint loses at most the steps since: so does the ledger.
      self.goodput.write("running")

  def _tokens_at(self, step_num: int) -> int:
    return self.tokens_at_start + phases_lib.tokens_between(self.phases, self.start, step_num)

  # -- The steps --------------------------------------------------------------------------------

  def _next_global_batch(self) -> dict[str, jax.Array]:
    """The current phase's next global batch, timing how long the host was blocked on the input."""
    t0 = time.perf_counter()
    try:
      batch = self.program.global_batch(next(self.data))
    except UserError as e:  # Data that went bad since `feed.check_streams` read it.
      raise self._in_phase(e) from None
    self._data_wait += time.perf_counter() - t0
    return batch

  def _step(self, state: program_lib.TrainState, step_num: int) -> hooks_lib.StepInfo:
    """Dispatches step `step_num` (its batch: the one a checked save read ahead, or the next) and asks
    every process whether to stop."""
    batch = self._next_batch if self._next_batch is not None else self._next_global_batch()
    self._next_batch = None
    dispatched_at = time.perf_counter()
    state, device_metrics = self.program.step(state, batch)
    stopping = self.sync.agreed(self.stop.signal_name is not None)
    info = hooks_lib.StepInfo(step_num, state, device_metrics, dispatched_at, self._data_wait, stopping)
    self._data_wait = 0.0
    return info

  def _source_tokens(self) -> tuple[dict[str, int] | None, dict[str, float]]:
    """A mixture's per-source tokens of the current stream (None for one source), and the earlier streams'."""
    current = mixture.source_tokens(self.data.iterator) if self.phase.config.data.mixture else None
    return current, self._source_tokens_before

  def _log_stop(self, step_num: int) -> None:
    self.logger.log_text(f"{self.stop.signal_name or 'a stop signal on another process'} received: saving step "
                         f"{step_num} and stopping")
    self.outcome.status = "stopped"

  # -- Saves and the end ------------------------------------------------------------------------

  def _checked_save(self, step_num: int, state: program_lib.TrainState) -> None:
    """Saves `state` once the loss of its params on the next batch is finite; keeps that batch for the next step."""
    position = self.data.get_state()  # The stream of step_num's phase.
    source_tokens_before = dict(self._source_tokens_before)  # As of step_num's phase, like the position.
    following = phases_lib.phase_at(self.phases, step_num + 1)
    if following.stream == self.phase.stream:  # Step N + 1 reads on: its batch is checked and kept for it.
      self._enter(following)
      self._next_batch = check_batch = self._next_global_batch()
    else:  # Step N + 1 starts another stream: check on one more batch of this one, never on the next phase's data.
      self._end_stream()
      check_batch = self._next_global_batch()
    loss = float(np.asarray(self.program.check_loss(state, check_batch).addressable_data(0)))
    if not np.isfinite(loss):
      raise TrainingDiverged(f"loss is {loss} at step {step_num + 1} (checked before saving step {step_num}, which "
                             f"is not saved); stopping. In {self.workdir}, {self.progress.kept()}; lower "
                             "train.learning_rate or raise train.warmup_steps")
    self.progress.doing = f"saving the checkpoint of step {step_num} in {self.workdir}"
    meta = checkpoint.CheckpointMeta(tokenizer=self.tok_id, tokens_seen=self._tokens_at(step_num),
                                     process_count=jax.process_count(), source_tokens_before=source_tokens_before)
    self.ckpt.save(step_num, state, position, self.c, meta)
    self.progress.last_good = step_num

  def _finish(self, state: program_lib.TrainState, start: int, restored: bool) -> None:
    """Logs the last step, saves the final state (unless the lease was lost), waits for the writes."""
    self.recorder.flush()
    self.sync.flush()
    if self.progress.lost_lock:
      raise UserError(f"{self.progress.lost_lock}; stopped at step {self.outcome.step} without saving over its "
                      "checkpoints")
    final = int(jax.device_get(state.step))
    t0 = time.perf_counter()
    if final > start or not restored:
      self._checked_save(final, state)
    self.progress.doing = f"finishing the checkpoint writes in {self.workdir}"
    self.ckpt.wait()
    self.goodput.add("save", time.perf_counter() - t0)
    seconds = self.goodput.totals(self.outcome.status)
    self.logger.log(self.outcome.step, goodput.scalars(seconds))
    self.goodput.write(self.outcome.status)
    self.outcome.goodput = goodput.line(seconds)
    if self.profiler.summary:
      self.logger.log_text(self.profiler.summary)

  def _close(self, finished: bool) -> None:
    self.profiler.close()
    if not finished and not self.progress.lost_lock:  # A lost lease: the workdir is another trainer's now.
      self.goodput.write_failed()
    self.logger.close()
    self.data.close()
    if finished:
      self.ckpt.close()
    else:  # Already failing: keep the first error; Orbax's writer threads would repeat a disk error raw.
      environment.without_stderr(self.ckpt.close)

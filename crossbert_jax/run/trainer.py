"""The pretraining run: CrossBERT or flat BERT on a device mesh (`run(config, workdir, hooks=...)`).

`run` takes the validated plan (`core/plan.build`), reads every phase's data once (`feed.check_streams`; the other
checks before any work: `preflight`), takes the workdir's lease (`lock`) and turns a full or
read-only disk into one error line (`environment`). `Trainer.train` is the run itself, top to
bottom: restore the newest checkpoint (the restore policy, `restore`, vets its config and
tokenizer; a damaged step falls back to the previous one), or a fork's source checkpoint (`fork`),
or initialise; then the steps; then the final save. Each step's stages, in order:
  1. enter the step's phase (`_enter`);
  2. the step, on the batch a save read ahead or the next; the processes agree whether to stop (`_step`);
  3. the hooks due at it (`hooks`): the metrics row, then those added (`add_hook`, run's `hooks`);
  4. at a save step (checkpoint.every_steps, keep_steps; not a stop's), the save stage: the metrics
     up to it logged, then the checked save: only params whose loss on the next batch is finite are
     saved (`TrainProgram.check_loss`); that batch is kept for the next step or, where the next step
     starts another data stream, is one more of the current one (a save never reads the next phase's);
  5. the stop: SIGTERM / SIGINT stop every process at the same step, which the final save saves
     (`preemption`); the status is then "stopped" (exit code EXIT_STOPPED).
Where the loop is (step, phase, tokens, the batch read ahead) is `Trainer.run_state` (`state`).
The CLI is `crossbert_jax.train`. Around the steps: the profile.* trace window (`profile`), each
step's wall time by cause (`goodput`, logged after the final save) and W&B beside metrics.jsonl
(`wandb_logger`).

A run with phases (`core/phases.py`) trains each phase under its own config: at its first step
the loop makes it current (`_enter`), rebuilding the TrainProgram for its config and, when it
reads another data stream, the iterator (`feed`). A checkpoint's data state is that of its
step's phase, so a restore first enters that phase. The state, its shardings and the optimizer
state are the same in every phase.
"""

import sys
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import outputs
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import mixture, tokenizer as tokenizer_lib
from crossbert_jax.run import (checkpoint, environment, feed as feed_lib, fork, goodput, hooks as hooks_lib, lock,
                               metrics, preemption, preflight, profile, recorder, restore, resume, state as state_lib,
                               wandb_logger, warm_start)
from crossbert_jax.run.recorder import Outcome, Progress, TrainingDiverged  # noqa: F401 - re-exported.
from crossbert_jax.training import objectives, program as program_lib, sharding


def run(c: plan_lib.RunPlan, workdir: str, *, break_lock: bool = False, started: float | None = None,
        hooks: Sequence[hooks_lib.Hook] = ()) -> dict[str, Any]:
  """Trains `c` in `workdir` (resuming if it holds a checkpoint); returns the last logged scalars.

  The result's "status" is "finished", "stopped" (a signal: resumable) or "nothing_to_do";
  `started`: time.time() when the command started (goodput's start-up; default: now); `hooks`: run
  after each step's metrics, in order (`Trainer.add_hook`; the train command's: `train.standard_hooks`).
  """
  started = time.time() if started is None else started
  hooks_lib.check_hooks(hooks)
  # A file (or one on the way), or a read-only disk, is one line before any work, not a traceback.
  outputs.check_folder_path(workdir, "--workdir", writes_inside=True)
  fork.check_workdir(c, workdir)
  workdir = epath.Path(workdir)
  profile.check_hosts(c.profile, jax.process_count())
  mesh = sharding.make_mesh(c.mesh)
  phases = list(c.phases)
  phases_lib.check_each(phases, lambda phase: preflight.check_phase(c, phases, phase, mesh))
  tok = preflight.load_tokenizer(c)
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
        trainer = Trainer(c, workdir, mesh, tok, stop, progress, warn, started)
        for hook in hooks:
          trainer.add_hook(hook.run, every=hook.every, name=hook.name)
        return trainer.train()
  except BaseException:
    if jax.process_index() == 0 and "://" not in str(workdir) and not progress.training:
      preflight.drop_empty_new_folders(workdir, before, created)
    raise


def _warn(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


class Trainer:
  """One process start of a run: restore or init, the steps, the saves, the stop. Its attributes are
  its collaborators; where the loop is (step, phase, tokens, the data read ahead), `run_state`."""
  def __init__(self, c: plan_lib.Settings, workdir: epath.Path, mesh: jax.sharding.Mesh, tok: tokenizer_lib.Tokenizer,
               stop: preemption.StopRequest, progress: Progress, warn: Callable[[str], None], started: float):
    self.c, self.workdir, self.tok, self.stop, self.progress, self.warn = c, workdir, tok, stop, progress, warn
    self.started = started  # time.time() at the command's start.
    self.primary = jax.process_index() == 0
    self.tok_id = resume.tokenizer_identity(c.data.tokenizer, tok)
    self.mesh, self.phases = mesh, list(c.phases)
    self._replacement_vocab = objectives.replacement_vocab_size(c, tok.vocab_size)
    self.run_state = state_lib.RunState(phase=self.phases[0])  # The loop's position.
    self.program = program_lib.TrainProgram(self.phases[0].config, mesh, replacement_vocab=self._replacement_vocab,
                                            specials=tok.special_ids)
    self.data = feed_lib.PhaseFeed(tok, seed=c.train.seed, process_index=jax.process_index(),
                                   process_count=jax.process_count())
    self.data.enter(self.phases[0])  # A restore into a later phase's stream replaces it (`_enter_phase_of`).
    progress.doing = f"reading the checkpoints in {workdir}"
    self.ckpt = checkpoint.Checkpointer(workdir, c.checkpoint)
    self.outcome = Outcome()
    self.sync = preemption.StopSync(mesh)
    self.hooks: list[hooks_lib.Hook] = []  # The steps' side duties, in order: metrics (`_begin`), then `add_hook`'s.
    self.context = hooks_lib.RunContext(tok, self.primary, self._log_scores)  # What hooks may use of the run.
    # Made by `_begin` once the run is known to train (a run with nothing to do writes no log).
    self.logger: metrics.MetricsLogger | None = None
    self.recorder: recorder.StepRecorder | None = None
    self.goodput: goodput.Ledger | None = None  # This start's wall time by cause.
    self.profiler: profile.Profiler | None = None

  def add_hook(self, fn: Callable[[hooks_lib.StepInfo], None], every: int = 1,
               name: str | None = None) -> hooks_lib.Hook:
    """Runs `fn(info)` after every step that is a multiple of `every` (0: never), after the hooks added
    before it (the metrics row first). Its time is goodput's "eval"; `name` (default: fn's) is unique."""
    hook = hooks_lib.Hook(name or getattr(fn, "__name__", "hook"), every, fn)
    if hook.name in [h.name for h in self.hooks] + ["metrics"]:
      raise ValueError(f"a hook named {hook.name!r} is already added")
    self.hooks.append(hook)
    return hook

  def train(self) -> dict[str, Any]:
    """The run, top to bottom; its outcome (`Outcome.as_dict`). Each step's stages: enter its phase,
    the step, its hooks (the metrics row, then the added ones), the checked save (at a save step), the stop."""
    c, rs = self.c, self.run_state
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
          state, rs.step = info.state, step_num
          took = hooks_lib.run_due(self.hooks[:1], info)  # The metrics row.
          self.recorder.pause()  # The added hooks and the save are no step's step_time.
          took.update(hooks_lib.run_due(self.hooks[1:], info))
          save_s = self._save_stage(info)
          self.recorder.resume()
        self.profiler.after_step(step_num, info.device_metrics, final=info.stopping or step_num == end)
        self._account(step_num, began, info, took, save_s)
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
    rs = self.run_state
    if phase.index != rs.phase.index:
      if self.logger is not None:  # Not while restoring: the log starts with `_begin`.
        self.recorder.new_phase()
        changed = phases_lib.changes(rs.phase, phase)
        self.logger.log_text(f"{phase.describe()}: {', '.join(f'{k}={v!r}' for k, v in changed.items())}")
      self.program = program_lib.TrainProgram(phase.config, self.mesh, replacement_vocab=self._replacement_vocab,
                                              specials=self.tok.special_ids)
      if self.logger is not None and phase.stream != rs.phase.stream:
        self._end_stream()
    rs.phase = phase
    try:
      self.data.enter(phase)
    except UserError as e:  # Data that went bad since `feed.check_streams` read it.
      raise self._in_phase(e) from None

  def _in_phase(self, error: UserError) -> UserError:
    """`error`, naming the current phase (in a run with phases)."""
    return UserError(f"{error} (in {self.run_state.phase.describe()})" if len(self.phases) > 1 else str(error))

  def _end_stream(self) -> None:
    """The current stream ends here: a mixture's per-source tokens join the run's count (once; a
    restore reads the count from the checkpoint's meta)."""
    rs = self.run_state
    if rs.phase.config.data.mixture and rs.counted_stream != rs.phase.stream:
      rs.source_tokens_before = recorder.add_tokens(
          rs.source_tokens_before, recorder.summed_over_processes(mixture.source_tokens(self.data.iterator)))
    rs.counted_stream = rs.phase.stream

  def _enter_phase_of(self, step: int) -> Any:
    """Makes `step`'s phase current; its iterator, the one a checkpoint of `step` restores."""
    self._enter(phases_lib.phase_at(self.phases, step))
    return self.data.iterator

  # -- Restore or init --------------------------------------------------------------------------

  def _restore_or_init(self) -> tuple[program_lib.TrainState, int, bool]:
    """(state, its step, whether it came from a checkpoint); sets the run state's tokens and `forked`."""
    p, rs = self.program, self.run_state
    read = lambda step, plan: restore.read(self.ckpt, step, plan, p.abstract, p.shardings, self._enter_phase_of)
    found = self.ckpt.restore_latest(self._vet_own, read, self.warn, self.primary)
    if found is not None:
      self.progress.last_good = found.step
    elif self.c.train.fork_from:  # A fork's first start: its source's checkpoint, read only.
      found, self.c = fork.restore(self.c, self.workdir, self.tok_id, p.abstract, p.shardings, self._enter_phase_of,
                                   self.warn)
      rs.forked = True
    if found is not None:
      rs.tokens_at_start = found.meta.tokens_at(found.step, found.config)
      rs.source_tokens_before = dict(found.meta.source_tokens_before)
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
             if self.run_state.forked else f"{self.workdir} already holds step {start}")
    self.warn(f"nothing to train: {where}, and {key}={t[key.split('.')[1]]}; raise --config.{key} to continue")
    self.ckpt.close()
    return Outcome(status="nothing_to_do", step=start).as_dict()

  def _begin(self, start: int, restored: bool, restore_s: float) -> None:
    """config.json, the metrics logger (and W&B) and recorder, the metrics hook, the profiler, goodput, the
    first log line."""
    c, mesh = self.c, self.program.mesh
    self.run_state.start = self.run_state.step = start
    self.progress.doing = f"writing {self.workdir / 'config.json'}"
    if self.primary:
      (self.workdir / "config.json").write_text(c.to_json())
    logged = ([r["step"] for r in metrics.read_metrics(self.workdir)]
              if self.primary and metrics.metrics_files(self.workdir) else [])
    sink = wandb_logger.start(c, self.workdir, self.warn) if self.primary else None
    self.logger = metrics.MetricsLogger(str(self.workdir), total_steps=c.train.steps, start_step=start,
                                        enabled=self.primary, tensorboard=c.metrics.tensorboard,
                                        progress_bar=c.metrics.progress_bar, eta_by_work=True, sink=sink)
    end = min(c.train.steps, c.train.stop_at_step or c.train.steps)
    self.profiler = profile.Profiler(c.profile, self.workdir, start + 1, self.logger.log_text, last_step=end,
                                     busy=lambda step: profile.busy(c.checkpoint, self.hooks, step), warn=self.warn)
    self.recorder = recorder.StepRecorder(c, mesh.size, self.logger, self._tokens_at, self.progress, self.outcome,
                                          str(self.workdir), self.warn, phases=self.phases)
    self.hooks.insert(0, hooks_lib.metrics(self.recorder, self._source_tokens))
    how = (f"forked from {c.train.fork_from}"
           if self.run_state.forked else f"resuming from step {start}" if restored else "starting")
    self.logger.log_text(f"{c.objective}: {how} in {self.workdir} on {mesh.size} device(s), mesh {dict(mesh.shape)}")
    self.goodput = goodput.Ledger(self.workdir, self.started, self.primary, max(logged, default=0), self.warn)
    self.goodput.add("restore", restore_s)
    self.goodput.add("startup", time.time() - self.started - restore_s)

  def _account(self, step_num: int, began: float, info: hooks_lib.StepInfo, took: dict[str, float],
               save_s: float | None) -> None:
    """Goodput: the step's wall time, less its input wait, save and added hooks (a save's read-ahead is input)."""
    rs = self.run_state
    extra = ("compile" if step_num in (rs.start + 1,
                                       rs.phase.start + 1) else "profile" if self.profiler.traced(step_num) else None)
    self.goodput.step(step_num,
                      time.perf_counter() - began, extra, data_wait=info.data_wait_s,
                      save=(save_s or 0.0) - rs.data_wait, eval=sum(s for n, s in took.items() if n != "metrics"))
    if save_s is not None:  # A kill after this checkpoint loses at most the steps since: so does the ledger.
      self.goodput.write("running")

  def _tokens_at(self, step_num: int) -> int:
    return self.run_state.tokens_at(self.phases, step_num)

  # -- The steps --------------------------------------------------------------------------------

  def _next_global_batch(self) -> dict[str, jax.Array]:
    """The current phase's next global batch, timing how long the host was blocked on the input."""
    t0 = time.perf_counter()
    try:
      batch = self.program.global_batch(next(self.data))
    except UserError as e:  # Data that went bad since `feed.check_streams` read it.
      raise self._in_phase(e) from None
    self.run_state.data_wait += time.perf_counter() - t0
    return batch

  def _step(self, state: program_lib.TrainState, step_num: int) -> hooks_lib.StepInfo:
    """Dispatches step `step_num` (its batch: the one a checked save read ahead, or the next) and asks
    every process whether to stop."""
    rs = self.run_state
    batch = rs.read_ahead if rs.read_ahead is not None else self._next_global_batch()
    rs.read_ahead = None
    dispatched_at = time.perf_counter()
    state, device_metrics = self.program.step(state, batch)
    stopping = self.sync.agreed(self.stop.signal_name is not None)
    info = hooks_lib.StepInfo(step_num, state, device_metrics, dispatched_at, rs.data_wait, stopping, rs.phase.config,
                              self.context)
    rs.data_wait = 0.0
    return info

  def _log_scores(self, scores: Callable[[], dict[str, float]]) -> None:
    """Logs the pending step's metrics row now, with `scores()` added (a hook's `context.log_scores`)."""
    self.recorder.flush(probes=scores)

  def _source_tokens(self) -> tuple[dict[str, int] | None, dict[str, float]]:
    """A mixture's per-source tokens of the current stream (None for one source), and the earlier streams'."""
    rs = self.run_state
    current = mixture.source_tokens(self.data.iterator) if rs.phase.config.data.mixture else None
    return current, rs.source_tokens_before

  def _log_stop(self, step_num: int) -> None:
    self.logger.log_text(f"{self.stop.signal_name or 'a stop signal on another process'} received: saving step "
                         f"{step_num} and stopping")
    self.outcome.status = "stopped"

  # -- Saves and the end ------------------------------------------------------------------------

  def _save_stage(self, info: hooks_lib.StepInfo) -> float | None:
    """At a save step (checkpoint.every_steps, checkpoint.keep_steps; not a stop's step, which the final
    save saves): logs the metrics up to it, then the checked save. Its seconds; None at other steps."""
    if info.stopping or not checkpoint.is_save_step(self.c.checkpoint, info.step):
      return None
    t0 = time.perf_counter()
    self.recorder.flush()
    self._checked_save(info.step, info.state)
    return time.perf_counter() - t0

  def _checked_save(self, step_num: int, state: program_lib.TrainState) -> None:
    """Saves `state` once the loss of its params on the next batch is finite; keeps that batch for the next step."""
    rs = self.run_state
    position = self.data.get_state()  # The stream of step_num's phase.
    source_tokens_before = dict(rs.source_tokens_before)  # As of step_num's phase, like the position.
    following = phases_lib.phase_at(self.phases, step_num + 1)
    if following.stream == rs.phase.stream:  # Step N + 1 reads on: its batch is checked and kept for it.
      self._enter(following)
      rs.read_ahead = check_batch = self._next_global_batch()
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

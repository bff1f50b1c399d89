"""A forked run (`train.fork_from=WORKDIR[:STEP]`): a new workdir starts from another run's checkpoint.

The fork takes the source's params, optimizer state (its step counter included), data-iterator
position and tokens_seen, and trains on under its own config's schedule: this is how a WSD decay
branch leaves its stable run (scaling/plan.py). The source's config is vetted as a resume would
vet it (`resume.check`: the keys that cannot change on a resume cannot change on a fork; the
schedule keys may). The source is only read: no lock, no lease, no renamed damaged step, nothing
created (a read-only Orbax manager), so it can be a finished run, a running one or on gs://.
Once the fork holds a checkpoint of its own, the loop resumes from that and never reads the source.
"""

import contextlib
import logging
import re
from typing import Any, Callable, Iterator

import jax
import ml_collections
from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.run import checkpoint, elastic, resume

_WITH_STEP = re.compile(r"^(?P<source>.+):(?P<step>\d+)$")


def parse(fork_from: str) -> tuple[str, int | None]:
  """(source workdir, step or None for its newest) of a `train.fork_from` value."""
  m = _WITH_STEP.match(fork_from)
  if m and not m.group("source").endswith(":/"):  # "gs://b/run:80" has a step; "gs://b/run" has none.
    return m.group("source"), int(m.group("step"))
  return fork_from, None


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
  """Hides the two warnings Orbax logs for every read-only manager (it is read-only on purpose)."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _same_place(a: str, b: str) -> bool:
  if "://" in a or "://" in b:
    return a.rstrip("/") == b.rstrip("/")
  return epath.Path(a).resolve() == epath.Path(b).resolve()


def check_workdir(fork_from: str, workdir: epath.Path) -> None:
  """Refuses a fork whose --workdir is its source or inside it, before anything there is opened."""
  source, _ = parse(fork_from)
  where = outputs.relation(outputs.absolute(workdir), outputs.absolute(source))
  if where in ("is", "is inside"):
    raise UserError(f"config train.fork_from={fork_from}: --workdir={workdir} is "
                    f"{'the source itself' if where == 'is' else 'inside the source'}; "
                    "a fork writes its own checkpoints: give it a new --workdir outside the source")


def check_recorded(fork_from: str, workdir: epath.Path, step: int, saved_config: dict) -> None:
  """Refuses to resume a workdir whose checkpoint `step` records another fork source (or none).

  A rerun with the fork_from its checkpoints record (with or without the step) resumes as usual.
  """
  recorded = str((saved_config.get("train") or {}).get("fork_from") or "")
  source, want = parse(fork_from)
  if recorded:
    had_source, had_step = parse(recorded)
    if _same_place(source, had_source) and want in (None, had_step):
      return
    what = f"a fork of {recorded}"
  else:
    what = "a run that was not forked"
  raise UserError(f"config train.fork_from={fork_from}: --workdir={workdir} already holds checkpoints (step "
                  f"{step}) of {what}; give the fork a new --workdir, or rerun with the fork_from it records "
                  "(or none) to resume it")


# resume.check's refusals speak of resuming a --workdir; a fork reads another run.
_FORK_WORDING = (
    ("these cannot change on resume: use the checkpoint's values or a new --workdir",
     "these cannot change on a fork: use the source's values or fork from a compatible run"),
    ("resume with the run's tokenizer or use a new --workdir", "fork with the source's tokenizer"),
)


def _as_fork_refusal(message: str, source: str) -> str:
  """A resume refusal reworded for a fork (the source, not --workdir, holds the checkpoint)."""
  message = message.replace(f"--workdir {source} holds", f"the source {source} holds", 1)
  for resume_words, fork_words in _FORK_WORDING:
    message = message.replace(resume_words, fork_words)
  return message


def restore(c: ml_collections.ConfigDict, workdir: epath.Path, tokenizer: dict[str, Any], abstract_state: Any,
            shardings: Any, data_for: Callable[[int], Any],
            warn: Callable[[str], None]) -> tuple[int, Any, dict[str, Any]]:
  """(step, state, meta) of the fork's source checkpoint, restored into `shardings` and `data_for(step)`
  (the data iterator of the step's phase).

  `meta["tokens_seen"]` is always set. `c.train.fork_from` is rewritten to the resolved
  "SOURCE:STEP", so the fork's config.json and checkpoints record exactly where it came from.
  UserError (naming train.fork_from) for a missing source or step, a refused config change, or a
  step that is not before train.steps.
  """
  key = f"config train.fork_from={c.train.fork_from}"
  source, step = parse(c.train.fork_from)
  if _same_place(source, str(workdir)):
    raise UserError(f"{key} is this run's own --workdir: fork from another run's workdir")
  ckpt_dir = epath.Path(source) / "checkpoints"
  if not ckpt_dir.is_dir():
    raise UserError(f"{key}: {source} holds no checkpoints/; point it at a training run's workdir")
  # keep/keep_steps only matter to a writer; a read-only manager deletes nothing.
  with _quiet_absl():
    reader = checkpoint.Checkpointer(
        source, ml_collections.ConfigDict({"keep": 1, "keep_steps": (), "async_save": False}), read_only=True)
  try:
    steps = sorted(reader.all_steps())
    if not steps:
      raise UserError(f"{key}: {source} holds no finished checkpoint yet")
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise UserError(f"{key}: {source} has checkpoints at steps {steps}, not {step}; fork from one of them "
                      "(a WSD stable run keeps its fork points through checkpoint.keep_steps)")
    if step >= c.train.steps:
      raise UserError(f"{key}: step {step} is not before train.steps={c.train.steps}; raise train.steps or "
                      "fork from an earlier step")
    try:
      saved_config, meta = reader.saved_config(step), reader.saved_meta(step)
    except Exception as e:  # noqa: BLE001 - an unreadable item: the source's damaged step, left as it is.
      raise UserError(f"{key}: checkpoint step {step} in {source} is unreadable "
                      f"({' '.join(f'{type(e).__name__}: {e}'.split())[:200]}); fork from another step") from None
    written_by = elastic.saved_process_count(source, step)
    old_count = written_by[1] if written_by else None
    try:
      lines, restore_data = resume.check(source, step, saved_config, meta, c, tokenizer, jax.process_count(),
                                         old_count)
    except UserError as e:
      raise UserError(f"{key}: {_as_fork_refusal(str(e), source)}") from None
    resharded = (elastic.reshard(source, step, old_count, resume.stream_view(saved_config, step), c,
                                 jax.process_count()) if restore_data else None)
    if resharded is not None:
      lines.append(resharded[0])
      restore_data = False
    # A fork changes its schedule, probes and checkpointing by design: only the other changes are worth a line.
    for line in lines:
      if not line.startswith(("warning: resuming with train.", "warning: resuming with eval.",
                              "warning: resuming with checkpoint.")) and "learning-rate schedule" not in line:
        warn(line.replace("resuming with", "forking with"))
    try:
      state = reader.restore(step, abstract_state, shardings, data_for(step) if restore_data else None)
    except Exception as e:  # noqa: BLE001
      raise UserError(f"{key}: checkpoint step {step} in {source} is unreadable "
                      f"({' '.join(f'{type(e).__name__}: {e}'.split())[:200]}); fork from another step") from None
    if resharded is not None and resharded[1] is not None:
      data_for(step).set_state(resharded[1])
  finally:
    reader.close()
  meta = dict(meta or {})
  meta["tokens_seen"] = resume.saved_tokens_seen(step, saved_config, meta or None)
  c.train.fork_from = f"{source}:{step}"
  warn(f"forked from {source} at step {step}")
  return step, state, meta

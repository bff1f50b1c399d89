"""A forked run (`train.fork_from=WORKDIR[:STEP]`): a new workdir starts from another run's checkpoint.

The fork takes the source's params, optimizer state (its step counter included), data-iterator
position and tokens_seen, and trains on under its own config's schedule: this is how a WSD decay
branch leaves its stable run (scaling/plan.py). The source's checkpoint goes through the
resume's restore policy (`run/restore.py`: the keys that cannot change on a resume cannot change on
a fork; the schedule keys may). The source is only read: no lock, no lease, no renamed damaged
step, nothing created (a read-only Orbax manager), so it can be a finished run, a running one or on
gs://. A fork of a from_hf run takes its source's `train.init_from`, hence its shape (`with_source_init`).
The fork's workdir may not be the source or inside it (`check_workdir`). Once the fork holds
a checkpoint of its own, the loop resumes from that and never reads the source; such a workdir
resumes only with the `train.fork_from` its checkpoints record (`check_resumed`).
"""

import contextlib
import dataclasses
import json
import logging
import re
from typing import Any, Callable, Iterator

from etils import epath

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, one_line
from crossbert_jax.run import checkpoint, restore as restore_policy

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


def with_source_init(c: config_lib.ConfigDict) -> config_lib.ConfigDict:
  """`c` with its source's `train.init_from` when it forks and leaves its own empty; else `c`.

  A fork's params always come from its source's checkpoint, never from `train.init_from`: for a
  fork the value only gives a from_hf run (`train.shape_from_init`) its shape and tokenizer
  (hf/import_config.py), which are the source's. So a fork of a from_hf run is the source's
  command plus `train.fork_from`, with `train.init_from` as the source had it or left out (read
  here from the source's config.json); another value is refused (`restore`).
  """
  if not c.train.fork_from or c.train.init_from:
    return c
  source, _ = parse(c.train.fork_from)
  path = epath.Path(source) / "config.json"
  try:
    init_from = json.loads(path.read_text())["train"]["init_from"]
  except (OSError, ValueError, KeyError, TypeError):
    if not c.train.shape_from_init:
      return c  # Nothing to take; `restore` names what is wrong with the source.
    raise UserError(f"config train.fork_from={c.train.fork_from}: {path} is missing or unreadable, so the fork "
                    "cannot take its source's train.init_from (its shape); pass the source's "
                    "--config.train.init_from=IMP") from None
  out = c.copy_and_resolve_references()
  with out.unlocked():
    out.train.init_from = init_from
  out.lock()
  return out


def check_workdir(c: plan_lib.Settings, workdir: str | epath.Path) -> None:
  """UserError when a fork's --workdir is its source or inside it (its saves would delete the
  source's fork points). Checked before the workdir is touched, and before any resume."""
  if not c.train.fork_from:
    return
  key = f"config train.fork_from={c.train.fork_from}"
  source, _ = parse(c.train.fork_from)
  where = outputs.relation(outputs.absolute(workdir), outputs.absolute(source))
  if where in ("is", "is inside"):
    raise UserError(f"{key}: --workdir {workdir} is {'the source itself' if where == 'is' else 'inside the source'}"
                    "; a fork writes its own checkpoints: give it a new --workdir outside the source")


def check_resumed(c: plan_lib.Settings, workdir: str | epath.Path, step: int, saved: dict[str,
                                                                                          Any]) -> plan_lib.Settings:
  """A workdir holding checkpoints resumes as the run they record: UserError when `c`'s
  `train.fork_from` names another source or step than its checkpoint `step` records (or it records
  none). A rerun with the same value resumes, recording the resolved "SOURCE:STEP" again: the
  returned `c` carries it."""
  given = c.train.fork_from
  if not given:
    return c
  recorded = saved.get("train", {}).get("fork_from") or ""
  where = f"config train.fork_from={given}: --workdir {workdir} holds checkpoints (step {step})"
  if not recorded:
    raise UserError(f"{where} of a run that was not forked; drop train.fork_from to resume it, or fork into a "
                    "new --workdir")
  (source, fork_step), (given_source, given_step) = parse(recorded), parse(given)
  if not _same_place(source, given_source) or None not in (fork_step, given_step) and fork_step != given_step:
    raise UserError(f"{where} of a fork from {recorded}; give train.fork_from={recorded} to resume it, or fork "
                    "into a new --workdir")
  return plan_lib.with_keys(c, {"train.fork_from": recorded}) if fork_step is not None else c


class _Removed(Exception):
  """The source's step folder went away while it was read (the source's own cleanup)."""


def restore(c: plan_lib.Settings, workdir: epath.Path, tokenizer: dict[str, Any], abstract_state: Any, shardings: Any,
            iterator_of: Callable[[int], Any], warn: Callable[[str],
                                                              None]) -> tuple[checkpoint.Restored, plan_lib.Settings]:
  """The fork's source checkpoint, restored into `shardings` and `iterator_of(step)` (the data
  iterator of the step's phase), through the resume's restore policy (`restore_policy.vet`, `read`).

  Its meta's `tokens_seen` is always set. Returns it with `c` whose `train.fork_from` is the resolved
  "SOURCE:STEP", so the fork's config.json and checkpoints record exactly where it came from.
  UserError (naming train.fork_from) for a missing source or step, a refused config change, a
  step that is not before train.steps (or train.stop_at_step), or an unreadable step. A step the
  running source removes while it is read is retried once when the newest was asked for.
  """
  key = f"config train.fork_from={c.train.fork_from}"
  source, step = parse(c.train.fork_from)
  check_workdir(c, workdir)
  if not checkpoint.CheckpointLayout.of(source).directory.is_dir():
    raise UserError(f"{key}: {source} holds no {checkpoint.DIRECTORY}/; point it at a training run's workdir")
  with _quiet_absl():
    reader = checkpoint.Checkpointer.reader(source)
  try:
    for retry in (False, True):
      chosen = _chosen_step(key, source, reader, step, c)
      try:
        found = _read_step(key, source, reader, chosen, c, tokenizer, abstract_state, shardings, iterator_of, warn)
        break
      except _Removed:
        if step is not None or retry:
          raise UserError(f"{key}: checkpoint step {chosen} was removed from {source} while it was read (the "
                          "source run is running and its checkpoint.keep deletes older steps); fork from a step "
                          "it keeps (checkpoint.keep_steps)") from None
        reader.reload()
  finally:
    reader.close()
  warn(f"forked from {source} at step {found.step}")
  return found, plan_lib.with_keys(c, {"train.fork_from": f"{source}:{found.step}"})


def _chosen_step(key: str, source: str, reader: checkpoint.Checkpointer, step: int | None, c: plan_lib.Settings) -> int:
  """The source step to fork from (`step`, or the newest), checked against the fork's schedule."""
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
  if c.train.stop_at_step and step >= c.train.stop_at_step:
    raise UserError(f"{key}: step {step} is not before train.stop_at_step={c.train.stop_at_step}, so the fork "
                    f"would train nothing; raise train.stop_at_step above {step} or fork from an earlier step")
  return step


def _check_init_from(key: str, source: str, saved: dict[str, Any], c: plan_lib.Settings) -> None:
  """UserError when the fork's train.init_from is not the one its source's checkpoint records: it
  would read as the fork's params, which come from the source (`with_source_init`)."""
  recorded = saved.get("train", {}).get("init_from") or ""
  given = c.train.init_from
  if given and not (recorded and _same_place(given, recorded)):
    started = f"started from train.init_from={recorded}" if recorded else "set no train.init_from"
    raise UserError(f"{key}: the fork gives train.init_from={given}, but the source {started}; a fork's params "
                    "come from its source's checkpoint: leave train.init_from out (the fork takes its source's) "
                    "or give the source's")


def _read_step(key: str, source: str, reader: checkpoint.Checkpointer, step: int, c: plan_lib.Settings,
               tokenizer: dict[str, Any], abstract_state: Any, shardings: Any, iterator_of: Callable[[int], Any],
               warn: Callable[[str], None]) -> tuple[checkpoint.Restored, plan_lib.Settings]:
  """`step` of the source, vetted and read; _Removed if its folder went away meanwhile."""
  def attempt(_: int) -> tuple[checkpoint.Restored | None, str | None]:
    try:
      saved, meta = reader.saved_config(step), reader.saved_meta(step)
    except Exception as e:  # noqa: BLE001 - an unreadable item: the source's damaged step, left as it is.
      return None, one_line(e)
    _check_init_from(key, source, saved, c)
    try:
      plan = restore_policy.vet(source, step, saved, meta, c, tokenizer, forking=True)
    except UserError as e:
      raise UserError(f"{key}: {e}") from None
    for line in plan.lines:
      warn(line)
    try:
      state = restore_policy.read(reader, step, plan, abstract_state, shardings, iterator_of)
    except Exception as e:  # noqa: BLE001
      return None, one_line(e)
    meta = dataclasses.replace(meta, tokens_seen=meta.tokens_at(step, saved))
    return checkpoint.Restored(step, state, meta, saved), None

  def unreadable(_: int, reason: str) -> None:
    if not checkpoint.CheckpointLayout.of(source).step_dir(step).exists():
      raise _Removed()
    raise UserError(f"{key}: checkpoint step {step} in {source} is unreadable ({reason}); fork from another step")

  return checkpoint.first_readable([step], attempt, unreadable)[1]

"""Training phases: `train.phases` and `train.batch_ramp` expanded into the run's segments (`expand`).

A phase is a run of consecutive steps with its own values of a declared set of keys
(`OVERRIDABLE`): its sequence length, batch size, RoPE thetas, data source or mixture, and the
learning-rate peak and schedule. `expand(c)` returns the phases in order, each with the full
config of its steps (the run's config with the phase's keys applied), the step range it covers
and the data stream it reads. A config without phases is one phase whose config is `c` itself.

`train.batch_ramp` turns the first phase's first steps into a staircase of smaller batches
(multiples of `batch_ramp.start`), ModernBERT's batch-size warmup. Consecutive phases that read
the same data (`STREAM_KEYS` equal) share one data stream: it is read in batches of the gcd of
their batch sizes (`Phase.read_batch`), a phase's batch is `batch_size / read_batch` reads, so a
ramp continues the stream where the previous stair left it. A phase with other data keys starts
its own stream, from the start of its source (in the order of its `data.shuffle_seed`).

Users: config.validate (every phase's config is validated), the trainer (a TrainProgram and a
data stream per phase), the recorder (tokens, FLOPs, ETA per phase), resume (the trained
phases may not change), aot (a compile per phase shape) and optimizer.run_schedule (the lr).
"""

import dataclasses
import math
from typing import Any, Callable

import ml_collections

from crossbert_jax.core.errors import UserError

# The keys a phase may set (dotted), each replaced whole. Everything else is the run's.
OVERRIDABLE = ("data.seq_len", "data.path", "data.mixture", "data.shuffle_seed", "train.batch_size",
               "train.learning_rate", "train.warmup_steps", "train.decay", "train.decay_fraction", "train.decay_shape",
               "train.final_lr_ratio", "model.rope_theta", "model.local_rope_theta")
# Keys of the data a phase reads: a change starts a new data stream at the phase's first step.
STREAM_KEYS = ("data.seq_len", "data.path", "data.mixture", "data.shuffle_seed")
# Keys that fix what a phase's steps computed on: a checkpoint's trained phases must keep them.
TRAINED_KEYS = ("data.seq_len", "data.path", "data.mixture", "data.shuffle_seed", "train.batch_size",
                "model.rope_theta", "model.local_rope_theta")


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps `start + 1 .. end` (1-based) of the run, trained under `config`."""
  index: int
  start: int  # Steps trained before its first step.
  end: int  # Its last step.
  config: ml_collections.ConfigDict  # The run's config with the phase's keys applied (no phases of its own).
  stream: int  # Its data stream's index: consecutive phases reading the same data share one.
  read_batch: int  # Global rows per read of that stream (the gcd of its phases' batch sizes).

  @property
  def tokens_per_step(self) -> int:
    return self.config.train.batch_size * self.config.data.seq_len

  @property
  def reads_per_step(self) -> int:
    return self.config.train.batch_size // self.read_batch

  def describe(self) -> str:
    return (f"phase {self.index} (steps {self.start + 1}-{self.end}, batch {self.config.train.batch_size} x "
            f"L={self.config.data.seq_len})")


def _err(msg: str) -> UserError:
  return UserError(f"config {msg}")


def has_phases(c: ml_collections.ConfigDict) -> bool:
  """Whether `c` declares phases or a batch ramp (else it is one phase: today's single-phase run)."""
  return bool(c.train.phases) or c.train.batch_ramp.start > 0


def _values(c: ml_collections.ConfigDict, keys: tuple[str, ...]) -> dict[str, Any]:
  """{dotted key: value} of those of `keys` this config declares (data.mixture may not exist yet)."""
  pairs = [k.split(".") for k in keys]
  return {f"{section}.{key}": c[section][key] for section, key in pairs if key in c[section]}


def _declared_phases(c: ml_collections.ConfigDict) -> list[tuple[int, dict[str, Any]]]:
  """(steps, keys set) of each `train.phases` entry, checked; the last may leave out "steps"."""
  t = c.train
  if not t.phases:
    return [(t.steps, {})]
  out, total = [], 0
  for i, phase in enumerate(t.phases):
    where = f"train.phases[{i}]"
    if not isinstance(phase, dict):
      raise _err(f"{where}: {phase!r} is not a dict; write {{'steps': N, 'data.seq_len': L, ...}}" +
                 (" (one phase needs a trailing comma: ({...},), or a dict is read as its keys)" if isinstance(
                     phase, str) else ""))
    for key in phase:
      if key != "steps" and key not in OVERRIDABLE:
        raise _err(f"{where} sets {key!r}, which a phase cannot change; a phase may set 'steps' and "
                   f"{', '.join(OVERRIDABLE)}")
      if key != "steps" and key.split(".")[1] not in c[key.split(".")[0]]:
        raise _err(f"{where} sets {key!r}, which this version's config does not declare")
    last = i == len(t.phases) - 1
    steps = phase.get("steps", t.steps - total if last else None)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
      raise _err(f"{where}: 'steps' must be an integer >= 1{'' if last else ' (only the last phase may omit it)'}"
                 f", got {phase.get('steps')!r}")
    total += steps
    out.append((steps, {k: v for k, v in phase.items() if k != "steps"}))
  if total != t.steps:
    raise _err(f"train.phases: the phases' steps sum to {total} but train.steps={t.steps}; make them equal "
               "(or leave 'steps' out of the last phase: it runs to train.steps)")
  return out


def check_ramp_signs(r: ml_collections.ConfigDict) -> None:
  """A negative start would silently turn the ramp off; a negative length is no length."""
  for key in ("start", "steps", "tokens"):
    if r[key] < 0:
      raise _err(f"train.batch_ramp.{key}={r[key]} is negative: give a count >= 0 "
                 f"({'0 turns the ramp off' if key == 'start' else 'set steps or tokens, the other 0'})")


def _ramp(c: ml_collections.ConfigDict, steps: int, sets: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
  """The first phase as a staircase: `batch_ramp.stages` stairs of growing batches, then the rest."""
  r = c.train.batch_ramp
  full = sets.get("train.batch_size", c.train.batch_size)
  seq_len = sets.get("data.seq_len", c.data.seq_len)
  if r.stages < 1:
    raise _err(f"train.batch_ramp.stages must be >= 1 when train.batch_ramp.start is set, got {r.stages}")
  if r.start >= full or full % r.start:
    raise _err(f"train.batch_ramp.start={r.start} must be below the first phase's batch size {full} and divide "
               "it (every stair is a multiple of the start)")
  multiple = full // r.start
  if r.stages > multiple - 1:
    raise _err(f"train.batch_ramp.stages={r.stages}: from {r.start} to {full} in multiples of {r.start} there are "
               f"at most {multiple - 1} stairs; lower it or train.batch_ramp.start")
  if (r.steps > 0) == (r.tokens > 0):
    raise _err("train.batch_ramp: set exactly one of train.batch_ramp.steps and train.batch_ramp.tokens, "
               f"got steps={r.steps}, tokens={r.tokens}")
  batches = [r.start * (1 + j * (multiple - 1) // r.stages) for j in range(r.stages)]
  if r.steps:
    counts = [r.steps // r.stages + (j < r.steps % r.stages) for j in range(r.stages)]
  else:
    counts = [math.ceil(r.tokens / r.stages / (b * seq_len)) for b in batches]
  if min(counts) < 1 or sum(counts) >= steps:
    raise _err(f"train.batch_ramp takes {sum(counts)} steps in {r.stages} stairs ({counts}), but the first phase "
               f"has {steps}; it must leave the phase at least one step at its batch size {full}, and every "
               "stair at least one step")
  stairs = [(n, {**sets, "train.batch_size": b}) for n, b in zip(counts, batches)]
  return stairs + [(steps - sum(counts), sets)]


def _phase_config(c: ml_collections.ConfigDict, sets: dict[str, Any]) -> ml_collections.ConfigDict:
  p = ml_collections.ConfigDict(c.to_dict())
  p.train.phases = ()
  p.train.batch_ramp.start = 0
  for key, value in sets.items():
    section, name = key.split(".")
    try:
      p[section][name] = value
    except TypeError:
      expected = type(c[section][name]).__name__
      raise _err(f"train.phases: {key}={value!r} is a {type(value).__name__}, but {key} takes a {expected} "
                 f"(e.g. {c[section][name]!r})") from None
  p.lock()
  return p


def expand(c: ml_collections.ConfigDict) -> list[Phase]:
  """The run's phases in order (one, with config `c`, when it declares none); UserError for bad ones."""
  check_ramp_signs(c.train.batch_ramp)
  if not has_phases(c):
    return [Phase(0, 0, c.train.steps, c, 0, c.train.batch_size)]
  declared = _declared_phases(c)
  if c.train.batch_ramp.start > 0:
    declared = _ramp(c, *declared[0]) + declared[1:]
  configs = [_phase_config(c, sets) for _, sets in declared]
  streams = [0]  # Consecutive phases with the same data keys share one stream.
  for before, p in zip(configs, configs[1:]):
    streams.append(streams[-1] + (_values(p, STREAM_KEYS) != _values(before, STREAM_KEYS)))
  read = {s: math.gcd(*(p.train.batch_size for p, ps in zip(configs, streams) if ps == s)) for s in set(streams)}
  out, start = [], 0
  for i, ((steps, _), p) in enumerate(zip(declared, configs)):
    out.append(Phase(i, start, start + steps, p, streams[i], read[streams[i]]))
    start += steps
  return out


def check_each(phases: list[Phase], check: Callable[[Phase], None]) -> None:
  """Calls `check(phase)` on every phase before any runs; its UserError comes back naming the phase
  (as is for a run of one phase)."""
  for phase in phases:
    try:
      check(phase)
    except UserError as e:
      raise UserError(f"{e} (in {phase.describe()})" if len(phases) > 1 else str(e)) from None


def phase_at(phases: list[Phase], step: int) -> Phase:
  """The phase of step `step` (1-based; 0 and steps past the end: the first / last phase)."""
  for p in phases:
    if step <= p.end:
      return p
  return phases[-1]


def changes(before: Phase, after: Phase) -> dict[str, Any]:
  """The OVERRIDABLE keys whose values differ from phase `before` to phase `after` (`after`'s values)."""
  a, b = _values(before.config, OVERRIDABLE), _values(after.config, OVERRIDABLE)
  return {k: v for k, v in b.items() if a[k] != v}


def tokens_between(phases: list[Phase], a: int, b: int) -> int:
  """Tokens trained in steps a + 1 .. b (each step at its phase's batch x length)."""
  return sum(max(0, min(b, p.end) - max(a, p.start)) * p.tokens_per_step for p in phases)


def trained(phases: list[Phase], step: int) -> list[tuple[int, int, dict[str, Any]]]:
  """(first step, last step, TRAINED_KEYS values) of the phases' parts in steps 1 .. `step`."""
  return [(p.start + 1, min(p.end, step), _values(p.config, TRAINED_KEYS)) for p in phases if p.start < step]

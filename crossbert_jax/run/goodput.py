"""Goodput: a run's wall time split into productive step time and badput by cause, over restarts.

Each process start (an attempt) times disjoint intervals of its own wall time, from the `train`
command's first line (`started`) to its last write:
  startup      imports, config and data checks, the mesh, init, the lock (minus the restore);
  restore      reading the checkpoint (or a fork's source) back;
  compile      an attempt's (or a phase's) first step beyond the attempt's median step time;
  data_wait    the loop blocked on the input;
  eval         the hooks added to the loop (the train command's frozen probes, eval.every_steps);
  save         the checked saves and the final wait for the writes;
  profile      traced steps (profile.*) beyond the median step time, writing the trace included;
  recomputed   the step time of steps an earlier attempt had already logged (lost with a kill);
  preemption   the wall time between an attempt that did not finish (killed, or stopped by a
               signal) and the next one's start: for a kill, from its last write of the ledger;
  other        the attempt's remaining time (logging, shutdown).
The productive time is the step time of the other steps. An attempt's numbers are written to
WORKDIR/goodput.json (process 0) after every save, every WRITE_SECONDS in between, and at its end, so a
killed attempt counts up to its last write; the run's goodput sums every attempt's. We compute it
ourselves rather than with Google's ml-goodput-measurement, which records and reads its events
through Google Cloud Logging (a project and credentials, no offline mode) and has no notion of our
workdir, where a run's restarts meet.
"""

import collections
import json
import statistics
import time
from typing import Any, Callable

from etils import epath

GOODPUT_FILE = "goodput.json"
CAUSES = ("startup", "restore", "compile", "data_wait", "eval", "save", "profile", "recomputed", "preemption", "other")
WRITE_SECONDS = 30.0
_STEADY_KEPT = 200  # Step times kept for the median (the latest).


def read(workdir: epath.Path) -> list[dict[str, Any]]:
  """The attempts recorded in `workdir` (oldest first); [] for none or a damaged file (`read_checked`)."""
  return read_checked(workdir)[0]


def read_checked(workdir: epath.Path) -> tuple[list[dict[str, Any]], str | None]:
  """(the well-formed attempts recorded in `workdir`, oldest first; what is wrong with the file, or None).

  A damaged file (not JSON, not {"attempts": [...]}, an attempt without its numbers) never stops a
  run: its well-formed attempts are kept, the rest is named in the problem."""
  path = workdir / GOODPUT_FILE
  if not path.exists():
    return [], None
  try:
    record = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    return [], f"is not readable JSON ({type(e).__name__})"
  attempts = record.get("attempts") if isinstance(record, dict) else None
  if not isinstance(attempts, list):
    return [], f'is not {{"attempts": [...]}} (holds {json.dumps(record)[:40]})'
  good = [a for a in attempts if _well_formed(a)]
  if len(good) < len(attempts):
    return good, f"has {len(attempts) - len(good)} of {len(attempts)} attempt(s) without their numbers"
  return good, None


def _well_formed(attempt: Any) -> bool:
  """An attempt as `Ledger.write` records it: start, end (times), status, seconds by cause."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  return (isinstance(attempt, dict) and number(attempt.get("start")) and number(attempt.get("end")) and
          isinstance(attempt.get("status"), str) and isinstance(attempt.get("seconds"), dict) and
          all(isinstance(k, str) and number(v) for k, v in attempt["seconds"].items()))


class Ledger:
  """This attempt's timed intervals, beside the earlier attempts read from the workdir."""
  def __init__(self, workdir: epath.Path, started: float, enabled: bool, logged_until: int = 0,
               warn: Callable[[str], None] | None = None):
    """`started`: time.time() at the command's start; `logged_until`: the last step already logged;
    `warn`: where a damaged goodput file is reported (one line; the count goes on without what is damaged)."""
    self._workdir, self._enabled, self._logged_until = workdir, enabled, logged_until
    self._earlier, problem = read_checked(workdir) if enabled else ([], None)
    if problem is not None:
      path, aside = workdir / GOODPUT_FILE, workdir / f"{GOODPUT_FILE}.damaged"
      try:
        aside.write_bytes(path.read_bytes())
        kept = f"; the file is kept as {aside.name}"
      except OSError:
        kept = ""
      good = f"from its {len(self._earlier)} good attempt(s) on" if self._earlier else "afresh"
      (warn or (lambda msg: None))(f"warning: {path} {problem}: goodput is recounted {good}{kept}")
    self._attempt: dict[str, Any] = {"start": started, "end": started, "status": "running"}
    self._seconds: dict[str, float] = collections.Counter()
    self._extra: list[tuple[float, bool, str]] = []  # (step time, recomputed, cause) of compiling / traced steps.
    self._steady: collections.deque[float] = collections.deque(maxlen=_STEADY_KEPT)
    self._written = time.monotonic()

  def add(self, cause: str, seconds: float) -> None:
    self._seconds[cause] += max(0.0, seconds)

  def step(self, step: int, seconds: float, extra: str | None, **causes: float) -> None:
    """Step `step` took `seconds` of wall time, `causes` of it (data_wait, save, eval) not the step's own;
    `extra`: the cause of the step's own time beyond the median ("compile", "profile"), if any."""
    for cause, s in causes.items():
      self.add(cause, s)
    own = max(0.0, seconds - sum(causes.values()))
    recomputed = step <= self._logged_until
    if extra:
      self._extra.append((own, recomputed, extra))
    else:
      self.add("recomputed" if recomputed else "productive", own)
      self._steady.append(own)
    if self._enabled and time.monotonic() - self._written > WRITE_SECONDS:
      self.write("running")

  def _closed(self, status: str) -> dict[str, Any]:
    """This attempt as recorded: its seconds with the compile steps split."""
    seconds = collections.Counter(self._seconds)
    median = statistics.median(self._steady) if self._steady else 0.0
    for own, recomputed, cause in self._extra:
      seconds[cause] += max(0.0, own - median)
      seconds["recomputed" if recomputed else "productive"] += min(own, median)
    end = time.time()
    seconds["other"] = max(0.0, end - self._attempt["start"] - sum(seconds.values()))
    return {**self._attempt, "end": end, "status": status, "seconds": dict(seconds)}

  def write(self, status: str) -> None:
    """Records this attempt ("running", "finished", "stopped", "failed") beside the earlier ones."""
    if not self._enabled:
      return
    path, text = self._workdir / GOODPUT_FILE, json.dumps({"attempts": self._earlier + [self._closed(status)]},
                                                          indent=1)
    if "://" in str(path):  # An object store writes an object whole.
      path.write_text(text)
    else:  # A kill mid-write leaves the previous file.
      tmp = self._workdir / f"{GOODPUT_FILE}.tmp"
      tmp.write_text(text)
      tmp.replace(path)
    self._written = time.monotonic()

  def write_failed(self) -> None:
    """Records this attempt as failed, if it can: the run's own error is the one to report."""
    try:
      self.write("failed")
    except Exception:  # pylint: disable=broad-except - e.g. the full disk that failed the run.
      pass

  def totals(self, status: str) -> dict[str, float]:
    """{"productive": s, cause: s, ...} over every attempt, this one as of now."""
    return totals(self._earlier + [self._closed(status)])


def totals(attempts: list[dict[str, Any]]) -> dict[str, float]:
  """Seconds by cause over `attempts`, with the preemption gaps between them."""
  out = collections.Counter({cause: 0.0 for cause in ("productive",) + CAUSES})
  for before, attempt in zip([None] + attempts[:-1], attempts):
    out.update(attempt["seconds"])
    if before is not None and before["status"] != "finished":
      out["preemption"] += max(0.0, attempt["start"] - before["end"])
  return dict(out)


def fractions(seconds: dict[str, float]) -> dict[str, float]:
  """Each cause's share of the total (they sum to 1)."""
  total = sum(seconds.values())
  return {k: v / total if total else 0.0 for k, v in seconds.items()}


def scalars(seconds: dict[str, float]) -> dict[str, float]:
  """The metrics row: goodput (the productive share), goodput/<cause> shares, goodput/wall_s."""
  shares = fractions(seconds)
  return {
      "goodput": shares["productive"],
      **{f"goodput/{k}": shares[k] for k in CAUSES}, "goodput/wall_s": sum(seconds.values())}


def line(seconds: dict[str, float]) -> str:
  """'goodput 87%: compile 4%, save 3%, ...' (causes of 0.5% or more, largest first)."""
  shares = fractions(seconds)
  rest = sorted(((k, v) for k, v in shares.items() if k != "productive" and v >= 0.005), key=lambda kv: -kv[1])
  return f"goodput {100 * shares['productive']:.0f}%" + (": " if rest else "") + ", ".join(
      f"{k} {100 * v:.0f}%" for k, v in rest)

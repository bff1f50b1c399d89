"""The data stream after a change of process count: drain the old layout's epoch, then go on.

A run saved by N processes and resumed by M != N cannot use the N saved iterator states as they
are: each describes one old process's share. The rule (docs/pod.md, "Elastic resume"):

  1. Each old process p's saved packer state says where its current packing round started,
     how many of the round's rows it had emitted, and (by re-packing the round) which rows it
     had not; after the round, the unread documents of its current epoch follow, the first one
     possibly from a later chunk on.
  2. The unread work of all old processes forms two lists in old-process order: the unemitted
     rows and the unread documents. New process q takes the q-th of M contiguous parts of each
     (sizes differ by at most one): first its rows as they are, then its documents, packed
     afresh by its own packer (the last, partial round included).
  3. Then process q continues in the new layout (its 1/M share) from epoch E, the first epoch
     that no old process had started.

So within the interrupted epochs every document chunk is trained on exactly once: none
skipped, none repeated. The plan is a function of the saved states, the config and the
tokenizer only, so the M processes agree on it without talking, and it is part of the saved
state until the drain ends: a run stopped during the drain resumes it exactly. A change during a
drain nests: a draining process's unread work is the rest of its drain (its rows, its packer's
unemitted round, its remaining documents), and a process that had not begun its new epoch adds
nothing of it.

The re-shard costs one re-pack of every old process's current round, on every new host, and
builds every old share (sources read per host, e.g. text files split by byte range, are read
once more by each new host).
"""

import bisect
from typing import Any, Callable, NamedTuple

import grain
import numpy as np

Row = dict[str, np.ndarray]
_DRAIN_SALT = 1 << 20  # Seeds the drain packers apart from the normal ones.


class ElasticRows(grain.IterDataset):
  """The packed rows of `layout` (a `pipeline.Layout`); `set_state` also takes a re-shard state."""
  def __init__(self, layout: Any):
    super().__init__(layout.rows())
    self._layout = layout

  def __iter__(self) -> "_ElasticRowsIterator":
    return _ElasticRowsIterator(self._parent.__iter__(), self._layout)

  def __str__(self) -> str:
    return "ElasticRows"


def reshard_state(states: list[dict[str, Any]], bins: int) -> dict[str, Any]:
  """The iterator state that resumes, on any process count, from the old processes' `states`.

  `states[p]` is old process p's saved iterator state (the packer's) and `bins` the old packing
  bins per process (`pipeline.packing_bins` of the old per-process batch).
  """
  return {
      "reshard": {"process_count": len(states), "bins": bins, "states": states}, "phase": "rows",
      "state": {"next_index": 0}}


def is_draining(state: dict[str, Any]) -> bool:
  """Whether a saved iterator state is still draining an earlier layout."""
  return "reshard" in state


class _Segment(NamedTuple):
  """Unread documents [start, end) of a layout's repeated document list, the first from chunk `chunk` on."""
  layout: Any
  start: int
  end: int
  chunk: int


class _SegmentDocument:
  """Drain document k -> (token ids, first chunk to emit), through this process's segments."""
  def __init__(self, segments: list[_Segment]):
    self._segments = segments
    self._offsets = np.cumsum([0] + [s.end - s.start for s in segments]).tolist()

  def __call__(self, k: int) -> tuple[np.ndarray, int]:
    j = bisect.bisect_right(self._offsets, k) - 1
    seg = self._segments[j]
    i = seg.start + k - self._offsets[j]
    return seg.layout.documents()[i], seg.chunk if i == seg.start else 0


class _Work:
  """What one old process had not read of its current epoch: rows, documents, and its next epoch."""
  def __init__(self, rows_count: int, rows: Callable[[int, int], list[Row]], segments: list[_Segment], epoch: int):
    self.rows_count, self.rows, self.segments, self.epoch = rows_count, rows, segments, epoch


def _unread(layout: Any, state: dict[str, Any]) -> _Work:
  """The unread work of the process with `layout` whose iterator saved `state`."""
  if not is_draining(state):
    count, (i, chunk) = _replay(lambda: layout.rows().__iter__(), state, None)
    n = layout.epoch_length()
    if count == 0 and chunk == 0 and i % n == 0:  # Nothing of epoch i // n read yet.
      return _Work(0, lambda a, b: [], [], i // n)
    return _Work(count, lambda a, b: _replay(lambda: layout.rows().__iter__(), state, (a, b))[0],
                 [_Segment(layout, i, (i // n + 1) * n, chunk)], i // n + 1)
  # Still draining an earlier layout: the rest of its drain (a change during a change).
  plan = _Plan(layout, state["reshard"])
  if state["phase"] == "rows":
    k = state["state"]["next_index"]
    return _Work(len(plan.rows) - k, lambda a, b: plan.rows[k + a:k + b], plan.segments, plan.epoch)
  count, (k, chunk) = _replay(plan.packer, state["state"], None)
  return _Work(count, lambda a, b: _replay(plan.packer, state["state"], (a, b))[0], _cut(plan.segments, k, None, chunk),
               plan.epoch)


def _cut(segments: list[_Segment], lo: int, hi: int | None, chunk: int = 0) -> list[_Segment]:
  """Documents [lo, hi) of the concatenated segments (the first from `chunk` on if it starts at lo)."""
  out, offset = [], 0
  for seg in segments:
    size = seg.end - seg.start
    a, b = max(lo - offset, 0), size if hi is None else min(hi - offset, size)
    if a < b:
      first = chunk if offset + a == lo else 0
      out.append(_Segment(seg.layout, seg.start + a, seg.start + b, seg.chunk if a == 0 and not first else first))
    offset += size
  return out


class _Plan:
  """What new process q drains: its part of the old processes' rows and documents, and the epoch
  it then continues from in its own layout."""
  def __init__(self, layout: Any, reshard: dict[str, Any]):
    n_old, q, m = reshard["process_count"], layout.process_index, layout.process_count
    olds = [layout.under(bins=reshard["bins"], process_index=p, process_count=n_old) for p in range(n_old)]
    works = [_unread(old, state) for old, state in zip(olds, reshard["states"])]
    part = lambda total: (q * total // m, (q + 1) * total // m)
    lo, hi = part(sum(w.rows_count for w in works))
    self.rows: list[Row] = []
    offset = 0
    for w in works:  # Re-packs only the old rounds that hold rows of this process's part.
      a, b = max(lo - offset, 0), min(hi - offset, w.rows_count)
      if a < b:
        self.rows += w.rows(a, b)
      offset += w.rows_count
    segments = [s for w in works for s in w.segments]
    self.segments = _cut(segments, *part(sum(s.end - s.start for s in segments)))
    self.epoch = max(w.epoch for w in works)
    self._layout = layout

  def packer(self) -> grain.DatasetIterator:
    """This process's drain documents, packed."""
    size = sum(s.end - s.start for s in self.segments)
    document = _SegmentDocument(self.segments)
    return self._layout.pack(lambda ks: [document(k) for k in ks], size, _DRAIN_SALT).__iter__()


def _replay(make: Callable[[], grain.DatasetIterator], state: dict[str, Any], keep: tuple[int, int] | None):
  """Re-packs a packer's current round from its saved `state`: (rows [a, b) of the unemitted ones, or
  their count if `keep` is None; (document index, chunk) its input continues from after the round)."""
  start = state["parent"]
  if state["next_row"] == 0:  # The round had not begun: its documents are all unread.
    return ([] if keep else 0), (start["parent"]["next_index"], start["chunk"])
  it = make()
  it.set_state(state)
  rows, count = [], 0
  while it.get_state()["parent"] == start:  # The packer moves on after the round's last row.
    try:
      row = next(it)
    except StopIteration:  # A drain packer's last, partial round.
      break
    if keep and keep[0] <= count < keep[1]:
      rows.append(row)
    count += 1
    if keep and count >= keep[1]:
      break
  after = it.get_state()["parent"]
  return (rows if keep else count), (after["parent"]["next_index"], after["chunk"])


class _ElasticRowsIterator(grain.DatasetIterator):
  """Normal rows, or (after a re-shard state) the drain: rows, then documents, then normal rows."""
  def __init__(self, rows: grain.DatasetIterator, layout: Any):
    super().__init__(rows)
    self._layout = layout
    self._reshard: dict[str, Any] | None = None  # Set while draining.
    self._plan: _Plan | None = None
    self._phase = ""
    self._drain: grain.DatasetIterator | None = None

  def __next__(self) -> Row:
    while self._reshard is not None:
      try:
        return next(self._drain)
      except StopIteration:
        self._enter("documents" if self._phase == "rows" else "normal", None)
    return next(self._parent)

  def next_rows(self, count: int) -> Row:
    """The next `count` rows stacked: the packer's whole-batch path unless draining."""
    if self._reshard is None:
      return self._parent.next_rows(count)
    rows = [next(self) for _ in range(count)]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

  def get_state(self) -> dict[str, Any]:
    if self._reshard is None:
      return self._parent.get_state()
    return {"reshard": self._reshard, "phase": self._phase, "state": self._drain.get_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    if not is_draining(state):
      self._reshard = self._plan = self._drain = None
      self._parent.set_state(state)
      return
    self._reshard = state["reshard"]
    self._plan = _Plan(self._layout, self._reshard)
    self._enter(state["phase"], state["state"])

  def _enter(self, phase: str, state: dict[str, Any] | None) -> None:
    plan = self._plan
    self._phase = phase
    if phase == "rows":
      self._drain = grain.MapDataset.source(plan.rows).to_iter_dataset().__iter__()
    elif phase == "documents":
      self._drain = plan.packer()
    else:  # The drain is over: the new layout from the first epoch no old process had started.
      first = plan.epoch * self._layout.epoch_length()
      self._parent.set_state({"parent": {"parent": {"next_index": first}, "chunk": 0}, "next_row": 0, "counter": 0})
      self._reshard = self._plan = self._drain = None
      return
    if state is not None:
      self._drain.set_state(state)

"""The run's input across its phases: one Grain iterator per data stream, a phase's batch from its reads.

`PhaseFeed.enter(phase)` makes `phase` current: a phase reading the same stream as the current
one keeps its iterator (a batch ramp continues the stream); another stream's iterator is built
fresh, from the start of its source, packed at its phase's length (`core/phases.py`). `next`
returns this process's rows of the current phase's batch: `reads_per_step` reads of
`read_batch / process_count` rows, concatenated. `get_state` / `set_state` are the current
stream's iterator position: what a checkpoint of a step in this phase saves and restores.
`check_streams` opens every stream of a run with phases and reads its first batch before step 1. A stream
padded per batch (its iterator's `pad_values`: the contrastive stage's contrast.padding=batch) has its reads,
and on several processes every process's rows, padded to one length (`same_length`).
An objective with an input stream of its own (`ObjectiveSpec.feed`, the contrastive stage's) gets it
from `make_iterator` instead of the packed rows.
"""

import importlib
from typing import Any

import numpy as np

from crossbert_jax.core import phases as phases_lib
from crossbert_jax.data import pipeline, tokenizer as tokenizer_lib


class PhaseFeed:
  """This process's batches of the current phase."""
  def __init__(self, tok: tokenizer_lib.Tokenizer, *, seed: int, process_index: int, process_count: int):
    self._tok, self._seed = tok, seed
    self._process_index, self._process_count = process_index, process_count
    self.phase: phases_lib.Phase | None = None
    self.iterator: Any = None

  def enter(self, phase: phases_lib.Phase) -> Any:
    """Makes `phase` current (building its stream's iterator unless already reading it); the iterator."""
    if self.phase is None or self.phase.stream != phase.stream:
      self.close()
      self.iterator = make_iterator(phase.config, self._tok, batch_size=phase.read_batch // self._process_count,
                                    seed=self._seed, process_index=self._process_index,
                                    process_count=self._process_count)
    self.phase = phase
    return self.iterator

  def __next__(self) -> dict[str, Any]:
    parts = [next(self.iterator) for _ in range(self.phase.reads_per_step)]
    if pad_values := getattr(self.iterator, "pad_values", None):
      parts = same_length(parts, pad_values, self._process_count)
    if len(parts) == 1:
      return parts[0]
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}

  def get_state(self) -> dict[str, Any]:
    return self.iterator.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self.iterator.set_state(state)

  def close(self) -> None:
    if hasattr(self.iterator, "close"):
      self.iterator.close()  # Stops Grain's worker processes now rather than at interpreter exit.
    self.iterator = None


def same_length(parts: list[dict[str, np.ndarray]], pad_values: dict[str, int],
                process_count: int) -> list[dict[str, np.ndarray]]:
  """Reads of a stream padded per batch (an iterator with `pad_values`: the arrays whose last axis varies, and
  their pad values), each padded to the longest last axis among them and, on several processes, among every
  process's reads (one all-gather of a length per step, which every process makes in step order)."""
  length = max(part[k].shape[-1] for part in parts for k in pad_values)
  if process_count > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    length = int(np.max(multihost_utils.process_allgather(np.int32(length))))

  def pad(k: str, a: np.ndarray) -> np.ndarray:
    if k not in pad_values or a.shape[-1] == length:
      return a
    return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, length - a.shape[-1])], constant_values=pad_values[k])

  return [{k: pad(k, a) for k, a in part.items()} for part in parts]


def make_iterator(c: Any, tok: tokenizer_lib.Tokenizer, *, batch_size: int, seed: int, process_index: int,
                  process_count: int) -> Any:
  """The checkpointable iterator of this process's batches for config `c` (a phase's): packed rows
  (data/pipeline.py), or the objective's own stream (its spec's `feed`, "module:function")."""
  kwargs = dict(batch_size=batch_size, seed=seed, process_index=process_index, process_count=process_count)
  if not c.spec.feed:
    return pipeline.make_iterator(c.data, tok, **kwargs)
  module, function = c.spec.feed.split(":")
  return getattr(importlib.import_module(module), function)(c, tok, **kwargs)


def check_streams(phases: list[phases_lib.Phase], tok: tokenizer_lib.Tokenizer, *, seed: int, process_index: int,
                  process_count: int) -> None:
  """Opens the data stream of every phase that starts one and reads its first batch: unusable data
  (an empty or non-UTF-8 file, shards of another tokenizer) is refused now, naming its phase, not
  when the phase starts. A run of one phase reads its stream at its first step, unless its objective
  has a stream of its own (a pair file missing a column is then refused before the workdir is made)."""
  if len(phases) < 2 and not phases[0].config.spec.feed:
    return

  def check(phase: phases_lib.Phase) -> None:
    if phase.index > 0 and phase.stream == phases[phase.index - 1].stream:
      return
    feed = PhaseFeed(tok, seed=seed, process_index=process_index, process_count=process_count)
    try:
      next(feed.enter(phase))
    finally:
      feed.close()

  if len(phases) < 2:
    check(phases[0])
  else:
    phases_lib.check_each(phases, check)

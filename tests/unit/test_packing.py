"""The fused packer (data/packing.py) equals Grain's chunk + FirstFitPackIterDataset bit for bit: rows and states."""

from typing import Any

import grain
import numpy as np
import pytest

from crossbert_jax.data import packing
from crossbert_jax.data.tokenizer import CLS_ID, SEP_ID


class _RefChunks(grain.DatasetIterator):
  """The pipeline's former chunker (the reference): ids -> [CLS] ids [SEP] in chunks of <= L."""
  def __init__(self, parent, seq_len):
    super().__init__(parent)
    self._seq_len, self._doc_state, self._chunks, self._next = seq_len, parent.get_state(), [], 0

  def _load(self, element):
    ids, first = element if isinstance(element, tuple) else (element, 0)
    doc = np.concatenate([[CLS_ID], ids, [SEP_ID]]).astype(np.int32) if len(ids) else []
    self._chunks = [doc[i:i + self._seq_len] for i in range(0, len(doc), self._seq_len)]
    self._next = first

  def __next__(self):
    while self._next >= len(self._chunks):
      self._doc_state = self._parent.get_state()
      self._load(next(self._parent))
    self._next += 1
    return {"tokens": self._chunks[self._next - 1]}

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._doc_state, "chunk": self._next}

  def set_state(self, state):
    self._parent.set_state(state["parent"])
    self._doc_state, self._chunks, self._next = state["parent"], [], 0
    if state["chunk"]:
      self._load(next(self._parent))
      self._next = state["chunk"]


class _RefChunkDataset(grain.IterDataset):
  def __init__(self, parent, seq_len):
    super().__init__(parent)
    self._seq_len = seq_len

  def __iter__(self):
    return _RefChunks(self._parent.__iter__(), self._seq_len)


def _docs(n, seed=0, first_chunks=False):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    size = int(rng.choice([0, rng.integers(1, 20), rng.integers(20, 90)], p=[0.05, 0.6, 0.35]))
    ids = rng.integers(5, 300, size).astype(np.int32)
    out.append((ids, int(rng.integers(0, 2)) if first_chunks and size > 40 else 0) if first_chunks else ids)
  return out


def _pair(docs, seq_len, bins, seed, finite):
  ds = grain.MapDataset.source(docs)
  ds = ds if finite else ds.repeat(None)
  ref = grain.experimental.FirstFitPackIterDataset(_RefChunkDataset(ds.to_iter_dataset(),
                                                                    seq_len), length_struct={"tokens": seq_len},
                                                   num_packing_bins=bins, shuffle_bins=True, seed=seed)
  fetch = lambda indices: [ds[i] for i in indices]
  ours = packing.PackDataset(fetch, len(docs) if finite else None, seq_len=seq_len, bins=bins, seed=seed)
  return iter(ref), iter(ours)


def _same(a, b):
  np.testing.assert_array_equal(a["tokens"], b["tokens"])
  np.testing.assert_array_equal(a["tokens_segment_ids"], b["segment_ids"])
  np.testing.assert_array_equal(a["tokens_positions"], b["positions"])


@pytest.mark.parametrize("seq_len,bins,finite,first_chunks", [(32, 4, False, False), (16, 7, True, True),
                                                              (64, 64, False, False)])
def test_rows_and_states_equal_grains(seq_len, bins, finite, first_chunks):
  docs = _docs(300, first_chunks=first_chunks)
  ref, ours = _pair(docs, seq_len, bins, 1234, finite)
  states = []
  for _ in range(400):
    try:
      a = next(ref)
    except StopIteration:
      with pytest.raises(StopIteration):
        next(ours)
      break
    _same(a, next(ours))
    assert ref.get_state() == ours.get_state()
    states.append(ours.get_state())
  # A saved state resumes bitwise, on either packer (so older checkpoints read on).
  for k in (0, 5, len(states) // 2, len(states) - 3):
    ref2, ours2 = _pair(docs, seq_len, bins, 1234, finite)
    ref2.set_state(states[k])
    ours2.set_state(states[k])
    for _ in range(10):
      try:
        a = next(ref2)
      except StopIteration:
        break
      _same(a, next(ours2))


def test_two_grain_workers_split_the_documents_and_resume(tmp_path):
  """mp_prefetch slices the packer's documents (worker w: w, w + 2, ...); a saved state resumes bitwise."""
  from crossbert_jax.core import config as config_lib  # pylint: disable=g-import-not-at-top
  from crossbert_jax.data import pipeline, tokenizer  # pylint: disable=g-import-not-at-top

  docs = [f"line {i} " + "word " * (i % 37) for i in range(600)]
  (tmp_path / "d.txt").write_text("\n".join(docs) + "\n")
  tokenizer.train_tokenizer(docs, 300, tmp_path / "t.model", num_threads=1)
  tok = tokenizer.Tokenizer.load(tmp_path / "t.model")
  cfg = config_lib.get_config("mlm", "tiny").data
  cfg.path, cfg.text_unit, cfg.seq_len, cfg.worker_count = str(tmp_path / "d.txt"), "line", 32, 2
  it = pipeline.make_iterator(cfg, tok, batch_size=4, seed=0)
  first = [next(it) for _ in range(40)]
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  assert all(b["tokens"].shape == (4, 32) for b in first)  # Before the fix: "Cannot slice `IterDataset` source".
  resumed = pipeline.make_iterator(cfg, tok, batch_size=4, seed=0)
  resumed.set_state(state)
  for e in expected:
    np.testing.assert_array_equal(next(resumed)["tokens"], e["tokens"])
  for i in (it, resumed):
    i.close()


def test_rounds_that_span_many_fetches_pack_the_same_rows(monkeypatch):
  """Fetches of one or two documents (every round spans many, and the buffer is cut mid-round)
  give Grain's rows and states; so do restores that start a fresh buffer."""
  monkeypatch.setattr(packing, "FETCH_FIRST", 1)
  monkeypatch.setattr(packing, "FETCH_MIN", 1)
  monkeypatch.setattr(packing, "FETCH_MAX", 2)
  test_rows_and_states_equal_grains(32, 5, False, False)
  test_rows_and_states_equal_grains(16, 3, True, True)

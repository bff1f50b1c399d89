"""Elastic resume: a data stream saved by N processes continues on M, no chunk skipped or repeated."""

import collections

import numpy as np
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.data import elastic as data_elastic, pipeline, tokenizer
from crossbert_jax.run import elastic, metrics
from tests.helpers import run_module

_WORDS = "packed rows hold chunks of documents and every chunk must be read once per epoch".split()


def _documents(n: int) -> list[str]:
  rng = np.random.default_rng(0)
  return [f"Doc {i}: " + " ".join(rng.choice(_WORDS, size=int(rng.integers(1, 45)))) for i in range(n)]


@pytest.fixture(scope="module")
def corpus_cfg(tmp_path_factory):
  root = tmp_path_factory.mktemp("elastic")
  docs = _documents(600)
  (root / "docs.txt").write_text("\n".join(docs) + "\n")
  tokenizer.train_tokenizer(docs, 320, root / "spm.model", num_threads=1)
  cfg = config_lib.get_config("mlm", "tiny").data
  cfg.path, cfg.text_unit, cfg.seq_len = str(root / "docs.txt"), "line", 24
  return cfg, tokenizer.Tokenizer.load(root / "spm.model"), docs


def _chunks(row: dict) -> list[tuple]:
  """The document chunks packed in a row, as token tuples."""
  tokens, segments = row["tokens"][0], row["segment_ids"][0]
  return [tuple(tokens[segments == s]) for s in np.unique(segments) if s > 0]


def _iterator(cfg, tok, p, n):
  return pipeline.make_iterator(cfg, tok, batch_size=1, seed=0, process_index=p, process_count=n)


def _drain(cfg, tok, state, count, seen, *, stop_after=(), resume_at=None):
  """Runs `count` new processes from `state` until their drains end (or `stop_after[q]` rows);
  counts the drained chunks in `seen`; returns their states at the stop."""
  states = []
  for q in range(count):
    it = _iterator(cfg, tok, q, count)
    it.set_state(state)
    drained = 0
    while data_elastic.is_draining(it.get_state()) and drained != (stop_after[q] if stop_after else None):
      if q == 0 and drained == resume_at:  # Stopped and resumed mid-drain: the stream goes on exactly.
        saved, it = it.get_state(), _iterator(cfg, tok, q, count)
        it.set_state(saved)
      row = next(it)
      if data_elastic.is_draining(it.get_state()):  # Otherwise the row is the new layout's first.
        seen.update(_chunks(row))
        drained += 1
    assert drained > 0
    states.append(it.get_state())
  return states


def _expected(cfg, tok, docs):
  expected = collections.Counter()
  for doc in docs:
    ids = [tokenizer.CLS_ID, *tok.encode(doc), tokenizer.SEP_ID]
    expected.update(tuple(ids[i:i + cfg.seq_len]) for i in range(0, len(ids), cfg.seq_len))
  return expected


def _old_run(cfg, tok, count, rows, seen):
  """`count` processes read `rows` rows each in lockstep (mid-round: 64 rows are packed at once)."""
  olds = [_iterator(cfg, tok, p, count) for p in range(count)]
  for _ in range(rows):
    for it in olds:
      seen.update(_chunks(next(it)))
  return data_elastic.reshard_state([it.get_state() for it in olds], bins=pipeline.packing_bins(1))


@pytest.mark.parametrize("old,new", [(1, 2), (2, 1), (2, 4), (4, 2)])
def test_epoch_is_read_once_across_a_process_count_change(corpus_cfg, old, new):
  cfg, tok, docs = corpus_cfg
  expected, seen = _expected(cfg, tok, docs), collections.Counter()
  state = _old_run(cfg, tok, old, 70, seen)
  assert not any(seen[c] > expected[c] for c in seen), "the old run itself read a chunk twice in its epoch"
  _drain(cfg, tok, state, new, seen, resume_at=5)
  assert seen == expected  # Every chunk of the epoch exactly once: none skipped, none repeated.
  assert sum(seen.values()) > 70 * old  # Part of the epoch was left for the new processes.


def test_a_change_during_a_drain_nests(corpus_cfg):
  """2 -> 4 processes, stopped mid-drain (some in their rows, some in their documents), -> 3."""
  cfg, tok, docs = corpus_cfg
  expected, seen = _expected(cfg, tok, docs), collections.Counter()
  state = _old_run(cfg, tok, 2, 40, seen)
  states = _drain(cfg, tok, state, 4, seen, stop_after=(5, 30, 8, 40))
  assert {s["phase"] for s in states} == {"rows", "documents"}
  _drain(cfg, tok, data_elastic.reshard_state(states, bins=pipeline.packing_bins(1)), 3, seen, resume_at=7)
  assert seen == expected


@pytest.mark.slow  # Over 75 s on 2 idle cores: `make test-slow` and CI run it.
def test_training_resumes_on_one_process_then_on_two_again(tmp_path, two_processes):
  """2 processes -> 1 -> 2 (the second change while the first drain is still running): the run goes on."""
  spm = tmp_path / "spm.model"
  common = [f"--config.data.tokenizer={spm}", "--config.metrics.progress_bar=False", "--config.model.vocab_size=400"]
  proc = two_processes("--config.model.vocab_size=400", "--config.train.steps=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert elastic.saved_process_count(tmp_path / "run") == (2, 2)
  proc = run_module([
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}", *common,
      "--config.train.steps=4"], check=False)
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "written by 2 process(es) and this run has 1: the data stream first finishes" in proc.stderr
  assert elastic.saved_process_count(tmp_path / "run") == (4, 1)
  state = elastic.saved_states(tmp_path / "run", 4, 1)[0]
  assert data_elastic.is_draining(state) and state["reshard"]["process_count"] == 2
  proc = two_processes("--config.model.vocab_size=400", "--config.train.steps=6")
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "written by 1 process(es) and this run has 2" in proc.stderr
  assert elastic.saved_process_count(tmp_path / "run") == (6, 2)
  rows = metrics.read_metrics(tmp_path / "run")
  losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
  assert sorted(losses) == list(range(1, 7)) and all(np.isfinite(list(losses.values())))

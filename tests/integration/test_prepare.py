"""`prepare`: pre-tokenized shards, refused outputs, resumable and clean stops, complete shard sets."""

import json
import logging
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import pipeline, prepare, shards, sources, tokenizer
from crossbert_jax.data import workers as workers_lib
from tests.helpers import run_command, run_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
_WORDS = "every document must land in exactly one shard once and only once across reruns".split()


def _docs(n, seed=0):
  rng = np.random.default_rng(seed)
  return [f"Doc {i}: " + " ".join(rng.choice(_WORDS, size=int(rng.integers(2, 60)))) for i in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("prep")
  docs = _docs(400)
  (root / "in").mkdir()
  for k in range(4):
    (root / "in" / f"part{k}.txt").write_text("\n\n".join(docs[k::4]) + "\n")
  tokenizer.train_tokenizer(docs, 320, root / "spm.model", num_threads=1)
  tokenizer.train_tokenizer(docs[::2], 300, root / "other.model", num_threads=1)
  return root, docs, tokenizer.Tokenizer.load(root / "spm.model")


def _cfg(path, seq_len=32):
  c = config_lib.get_config("mlm", "tiny").data
  c.path, c.seq_len = str(path), seq_len
  return c


def test_pretokenized_shards_give_the_text_shards_batches(corpus, tmp_path):
  root, docs, tok = corpus
  prepare.prepare(str(root / "in"), str(tmp_path / "text"), 3, progress=False)
  counts = prepare.prepare(str(root / "in"), str(tmp_path / "tok"), 3, progress=False, tokenizer=tok)
  manifest = json.loads((tmp_path / "tok" / shards.MANIFEST).read_text())
  assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["vocab_size"] == tok.vocab_size
  assert [s["documents"] for s in manifest["shards"]] == counts and sum(counts) == len(docs)
  assert sum(s["tokens"] for s in manifest["shards"]) == sum(len(i) for i in tok.encode_batch(docs))
  assert [p.name for p in (tmp_path / "tok").glob(".*")] == [prepare.MARKER], "no staging files left"
  assert prepare.finished(str(tmp_path / "tok"))
  for p, n in ((0, 1), (1, 2)):  # Per-process shares, strided as for text shards.
    a = pipeline.make_iterator(_cfg(tmp_path / "text"), tok, batch_size=4, seed=0, process_index=p, process_count=n)
    b = pipeline.make_iterator(_cfg(tmp_path / "tok"), tok, batch_size=4, seed=0, process_index=p, process_count=n)
    for _ in range(30):
      x, y = next(a), next(b)
      for k in x:
        np.testing.assert_array_equal(x[k], y[k])
    state = b.get_state()  # A saved state resumes bitwise.
    expected = [next(b) for _ in range(5)]
    c = pipeline.make_iterator(_cfg(tmp_path / "tok"), tok, batch_size=4, seed=0, process_index=p, process_count=n)
    c.set_state(state)
    for e in expected:
      np.testing.assert_array_equal(next(c)["tokens"], e["tokens"])
  with pytest.raises(UserError, match=r"tokenized with .*spm.model.*data.tokenizer=.*other.model"):
    pipeline.make_iterator(_cfg(tmp_path / "tok"), tokenizer.Tokenizer.load(root / "other.model"), batch_size=4, seed=0)
  with pytest.raises(UserError, match="holds token ids"):
    list(sources.iter_documents(str(tmp_path / "tok")))


def test_shards_read_without_grain_group_size_errors(corpus, tmp_path, caplog):
  root, _, _ = corpus
  prepare.prepare(str(root / "in"), str(tmp_path / "text"), 2, progress=False)
  with caplog.at_level(logging.INFO):
    ds = pipeline.document_dataset(_cfg(tmp_path / "text"), seed=0)
    [ds[i] for i in range(len(ds))]  # pylint: disable=expression-not-assigned
  assert not [r for r in caplog.records if "group_size" in r.getMessage()], caplog.text[-500:]


def test_a_set_with_missing_members_is_refused(corpus, tmp_path):
  root, _, tok = corpus
  prepare.prepare(str(root / "in"), str(tmp_path / "c"), 3, progress=False)
  (tmp_path / "c" / shards.shard_name("corpus", 1, 3)).unlink()
  with pytest.raises(UserError, match=r"holds 2 of the 3 corpus.*missing corpus-00001-of-00003"):
    pipeline.make_iterator(_cfg(tmp_path / "c"), tok, batch_size=2, seed=0)


def test_bad_outputs_and_flags_are_one_line(corpus, tmp_path):
  root, _, _ = corpus
  with pytest.raises(UserError, match="inside --input"):
    prepare.prepare(str(root / "in"), str(root / "in" / "shards"), 2, progress=False)
  with pytest.raises(UserError, match="inside --input"):
    prepare.prepare(str(root / "in"), str(root / "in"), 2, progress=False)
  with pytest.raises(UserError, match="inside --input"):
    prepare.prepare(f"{root / 'in'}/*.txt", str(root / "in" / "out"), 2, progress=False)
  assert not (root / "in" / "shards").exists() and not (root / "in" / "out").exists()
  (tmp_path / "file").write_text("x")
  with pytest.raises(UserError, match="existing file"):
    prepare.prepare(str(root / "in"), str(tmp_path / "file"), 2, progress=False)
  with pytest.raises(UserError, match="fix --input"):  # Not data.path: prepare has no config.
    prepare.prepare(str(tmp_path / "missing.txt"), str(tmp_path / "o"), 2, progress=False)
  with pytest.raises(UserError, match="is a file, so no folder can be made below it"):
    prepare.prepare(str(root / "in"), str(tmp_path / "file" / "sub"), 2, progress=False)
  with pytest.raises(UserError, match="--workers=-1"):
    prepare.prepare(str(root / "in"), str(tmp_path / "o"), 2, workers=-1, progress=False)
  (tmp_path / "empty.txt").write_text("\n\n")
  with pytest.raises(UserError, match="holds no documents"):
    prepare.prepare(str(tmp_path / "empty.txt"), str(tmp_path / "e"), 2, progress=False)
  assert not (tmp_path / "e").exists(), "nothing of the failed run is left, not even its folder"
  (tmp_path / "mine").mkdir()  # A folder the user made stays (empty, as it was).
  with pytest.raises(UserError, match="holds no documents"):
    prepare.prepare(str(tmp_path / "empty.txt"), str(tmp_path / "mine"), 2, progress=False)
  assert list((tmp_path / "mine").iterdir()) == []


def test_a_bad_book_leaves_nothing_and_the_fixed_rerun_works(corpus, tmp_path):
  root, docs, _ = corpus
  src = tmp_path / "in"
  src.mkdir()
  for p in (root / "in").iterdir():
    (src / p.name).write_bytes(p.read_bytes())
  (src / "bad.txt").write_bytes(b"caf\xe9 au lait\n")
  bystander = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(120,))  # The caller's own.
  bystander.start()
  try:
    with pytest.raises(UserError, match="not UTF-8"):
      prepare.prepare(str(src), str(tmp_path / "out"), 5, workers=2, progress=False)
    assert bystander.is_alive(), "prepare killed a child process that is not one of its workers"
  finally:
    bystander.kill()
  assert not (tmp_path / "out").exists(), "the failed prepare left its folder"
  (src / "bad.txt").write_text("café au lait\n")
  assert sum(prepare.prepare(str(src), str(tmp_path / "out"), 5, workers=2, progress=False)) == len(docs) + 1


def test_the_same_command_on_a_finished_set_says_so_and_writes_nothing(corpus, tmp_path):
  """In process (run_command): prepare's subprocess runs are the stop test's below."""
  root, docs, _ = corpus
  out = tmp_path / "out"
  args = [f"--input={root / 'in'}", f"--output={out}", "--shards=3", "--progress=false"]
  first = run_command("crossbert_jax.prepare", *args)
  assert first.returncode == 0 and "wrote 3 shards" in first.stdout, first.stderr
  written = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
  again = run_command("crossbert_jax.prepare", *args)
  assert again.returncode == 0 and f"already holds 3 shards, {len(docs)} documents" in again.stdout, again.stderr
  assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == written, "a finished set is not rewritten"
  other = run_command("crossbert_jax.prepare", *args[:2], "--shards=2", "--progress=false")
  assert other.returncode == 2 and other.stderr.strip().splitlines()[-1].startswith("error:")
  assert "finished prepare of other inputs or flags (shards differ)" in other.stderr
  assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == written


# SIGKILL: tests/integration/test_fault_inject_prepare.py (random kills, orphans, every document once).
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_is_one_line_workers_die_and_the_rerun_finishes(corpus, tmp_path, sig):
  root, docs, _ = corpus
  big = tmp_path / "big"
  big.mkdir()
  many = _docs(20000, seed=1)
  for k in range(8):
    (big / f"b{k}.txt").write_text("\n\n".join(many[k::8]) + "\n")
  out = tmp_path / "out"
  cmd = [
      sys.executable, "-m", "crossbert_jax.prepare", f"--input={big}", f"--output={out}", "--shards=24", "--workers=2",
      "--progress=false"]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
  deadline = time.time() + 120
  while time.time() < deadline and not list(out.glob("*.arrayrecord")):
    time.sleep(0.05)
  workers = workers_lib.child_pids(proc.pid)
  assert workers, "the pool is running"
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 75, err[-2000:]
  assert err.strip().splitlines()[-1].startswith("stopped by SIG") and "Traceback" not in err, err[-2000:]
  deadline = time.time() + 30  # A worker still importing exits when it starts (data/workers.py).
  while any(workers_lib.alive(w) for w in workers) and time.time() < deadline:
    time.sleep(0.1)
  assert not [w for w in workers if workers_lib.alive(w)], "workers outlived prepare"
  done = len(list(out.glob("corpus-*.arrayrecord")))
  assert 0 < done < 24, done
  run_module(cmd[2:])  # Fails the test unless it exits 0.
  assert sorted(p.name
                for p in out.iterdir()
                if p.name != prepare.MARKER) == [shards.shard_name("corpus", k, 24) for k in range(24)]
  ds = pipeline.document_dataset(_cfg(out), seed=0)
  assert sorted(ds[i] for i in range(len(ds))) == sorted(many)

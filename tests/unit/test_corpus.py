"""Built-in corpus: deterministic, megabytes of English prose, no code."""

import os
import sysconfig

from crossbert_jax.data import corpus


def test_builtin_corpus_is_big_english_prose():
  docs = corpus.builtin_documents()
  chars = sum(map(len, docs))
  assert len(docs) > 2000 and chars > 1_000_000, (len(docs), chars)
  assert len(set(docs)) == len(docs)
  assert not any(">>>" in d for d in docs)
  prose = [d for d in docs if " " in d and sum(c.isalpha() for c in d) > 0.7 * len(d)]
  assert len(prose) > 0.95 * len(docs)
  # Every line is a sentence-like paragraph: capitalised, five words or more.
  lines = [line for d in docs for line in d.split("\n")]
  assert all(line[0].isupper() and len(line.split()) >= 5 for line in lines)
  docs.clear()  # Callers get their own list.
  assert corpus.builtin_documents()


def test_harvest_is_deterministic_and_the_disk_cache_is_faithful(tmp_path, monkeypatch):
  # A slice of the stdlib keeps this fast; the full harvest runs the same code per file.
  stdlib = sysconfig.get_paths()["stdlib"]
  roots = [os.path.join(stdlib, d) for d in ("email", "json", "logging", "xml")]
  monkeypatch.setattr(corpus, "_source_roots", lambda: roots)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  files = [f for r in roots for f in corpus._python_files(r)]  # pylint: disable=protected-access
  fresh = corpus._harvest(files)  # pylint: disable=protected-access
  assert fresh == corpus._harvest(files)  # pylint: disable=protected-access
  assert len(fresh) > 100
  assert corpus._load() == fresh  # pylint: disable=protected-access  (miss: harvests, writes)
  assert list((tmp_path / "crossbert_jax").iterdir())
  assert corpus._load() == fresh  # pylint: disable=protected-access  (hit: reads the cache)

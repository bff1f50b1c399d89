"""tools/fetch_data.py: the data the docs use, fetched into the shared layout the readers read.

The Hub cannot be reached here, so its converters are checked on rows made from the shared data
(the rows `datasets.load_dataset` returns, same columns and label ids): every task the readers
read from the converted files equals the task read from the shared files. The local source is
checked end to end, and a Hub call in offline mode is one error line, exit 2.
"""

import hashlib
import importlib.util
import json

import numpy as np
import pytest
from etils import epath

from crossbert_jax.evaluation import retrieval
from crossbert_jax.evaluation import tasks as eval_tasks
from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("fetch_data", ROOT / "tools" / "fetch_data.py")
fetch_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_data)


def _rows(split: eval_tasks.Split, text: str, pair: str | None = None, label=lambda y: y, **extra) -> list[dict]:
  out = []
  for i in range(len(split)):
    row = {text: split.texts[i], "label": label(split.labels[i].item()), "idx": i, **extra}
    if pair:
      row[pair] = split.pairs[i]
    out.append(row)
  return out


def shared_loader(root):
  """load(repo, config, split) -> the rows the Hub's copy of the shared files has (columns, label ids)."""
  root = epath.Path(str(root))
  task = lambda name: eval_tasks.load_task(name, root)

  def jsonl(rel):
    return [json.loads(line) for line in (root / rel).read_text().splitlines() if line.strip()]

  def load(repo, config, split):
    if repo == "Salesforce/wikitext":
      name = {"validation": "valid", "test": "test"}[split]
      return [{"text": line} for line in (root / f"wikitext-2/{name}.txt").read_text().splitlines(keepends=True)]
    if repo == "nyu-mll/glue":
      ours = {"train": "train", "validation": "dev"}.get(split, split)
      if config == "cola":
        return _rows(task("cola").splits[ours], "sentence")
      if config == "sst2":
        return _rows(task("sst2").splits[ours], "sentence")
      if config == "stsb":
        return _rows(eval_tasks.read_glue_stsb(root, ours), "sentence1", "sentence2")
      if config == "qnli":  # The Hub's ids: 0 = entailment (ours: 1 = entailment).
        rows = _rows(task("qnli").splits["dev"], "question", "sentence", label=lambda y: 1 - y)
        return rows
      if config == "rte":
        return _rows(task("rte").splits[ours], "sentence1", "sentence2")
      if config == "mrpc":  # MSR train = GLUE train + validation: all of it as train here.
        return [] if split == "validation" else _rows(task("mrpc").splits[split], "sentence1", "sentence2")
    if repo == "SetFit/sst5":
      return _rows(task("sst5").splits[{"validation": "dev"}.get(split, split)], "text")
    if repo == "stanfordnlp/snli":  # The Hub keeps pairs without a gold label (-1): dropped.
      rows = _rows(task("snli").splits[{"validation": "dev"}.get(split, split)], "premise", "hypothesis")
      return rows + [{"premise": "no gold", "hypothesis": "label", "label": -1}]
    if repo == "mteb/stsbenchmark-sts":
      s = eval_tasks.read_sts_benchmark(root, {"validation": "dev"}.get(split, split))
      return [{"sentence1": a, "sentence2": b, "score": float(y)} for a, b, y in zip(s.texts, s.pairs, s.labels)]
    if repo == "mteb/scifact":
      if config in ("corpus", "queries"):
        return jsonl(f"beir/scifact/{config}.jsonl")
      lines = (root / f"beir/scifact/qrels/{split}.tsv").read_text().splitlines()[1:]
      return [dict(zip(("query-id", "corpus-id", "score"), line.split("\t"))) for line in lines if line.strip()]
    raise AssertionError(f"no rows for {repo} {config} {split}")

  return load


def _same_task(a: eval_tasks.Task, b: eval_tasks.Task):
  assert a.splits.keys() == b.splits.keys(), a.name
  for name in a.splits:
    x, y = a.splits[name], b.splits[name]
    assert [t.strip() for t in x.texts] == [t.strip() for t in y.texts], (a.name, name)
    assert (x.pairs is None) == (y.pairs is None) and (x.pairs is None or [t.strip() for t in x.pairs] == [
        t.strip() for t in y.pairs]), (a.name, name)
    np.testing.assert_allclose(x.labels, y.labels, err_msg=f"{a.name} {name}")


def test_hub_converters_write_what_the_readers_read(tmp_path, shared_data):
  out = tmp_path / "data"
  out.mkdir()
  fetch_data.fetch(list(fetch_data.CONVERT), out, "hub", load=shared_loader(shared_data), log=lambda s: None)
  assert fetch_data.check_layout(out, list(fetch_data.CONVERT)) == []
  for name in eval_tasks.ALL_TASKS:
    if name == "sst2":  # Its test is SST-5's test without the neutral class: the same sentences and labels.
      ours, theirs = (eval_tasks.load_task(name, r) for r in (out, shared_data))
      assert len(ours.splits["test"]) == len(theirs.splits["test"]) == 1821
      np.testing.assert_array_equal(np.bincount(ours.splits["test"].labels), np.bincount(theirs.splits["test"].labels))
      ours.splits.pop("test"), theirs.splits.pop("test")
      _same_task(ours, theirs)
      continue
    _same_task(eval_tasks.load_task(name, out), eval_tasks.load_task(name, shared_data))
  for split in ("test", "train"):
    got = retrieval.read_beir(str(out / "beir" / "scifact"), split)
    want = retrieval.read_beir(str(shared_data / "beir" / "scifact"), split)
    assert got == want
  manifest = fetch_data.read_manifest(shared_data)
  for rel in ("wikitext-2/valid.txt", "wikitext-2/test.txt"):  # The Hub's rows are the original lines.
    assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == manifest[rel][2]


def test_local_source_copies_checks_and_resumes(tmp_path, shared_data, capsys):
  out = tmp_path / "data"
  argv = ["--source=local", f"--from={shared_data}", f"--output={out}"]
  assert fetch_data.main(argv) == 0
  for name in eval_tasks.ALL_TASKS:
    _same_task(eval_tasks.load_task(name, out), eval_tasks.load_task(name, shared_data))
  theirs, ours = fetch_data.read_manifest(shared_data), fetch_data.read_manifest(out)
  assert ours and all(theirs[p] == row for p, row in ours.items())
  assert (out / "SOURCES.md").is_file()  # What evaluate and tools/mteb_local_data.py look for.
  before = {p: (out / p).stat().st_mtime_ns for p in ours}
  assert fetch_data.main(argv) == 0  # Again: every file is there with its bytes, none rewritten.
  assert before == {p: (out / p).stat().st_mtime_ns for p in ours}
  # A changed file is refused, not overwritten; --force replaces it.
  (out / "glue/RTE/dev.tsv").write_text("mine\n")
  capsys.readouterr()
  assert fetch_data.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "glue/RTE/dev.tsv is already there with other bytes" in err
  assert (out / "glue/RTE/dev.tsv").read_text() == "mine\n"
  assert fetch_data.main([*argv, "--force", "--datasets=glue"]) == 0
  assert hashlib.sha256((out / "glue/RTE/dev.tsv").read_bytes()).hexdigest() == theirs["glue/RTE/dev.tsv"][2]


def test_local_source_links_and_refuses_a_damaged_copy(tmp_path, shared_data, capsys):
  out = tmp_path / "linked"
  assert fetch_data.main([
      "--source=local", f"--from={shared_data}", f"--output={out}", "--link", "--datasets=wikitext-2,sts"]) == 0
  assert (out / "wikitext-2/valid.txt").is_symlink() and fetch_data.check_layout(out, ["wikitext-2", "sts"]) == []
  damaged = tmp_path / "damaged"
  (damaged / "wikitext-2").mkdir(parents=True)
  (damaged / "MANIFEST.tsv").write_text((shared_data / "MANIFEST.tsv").read_text())
  (damaged / "wikitext-2/valid.txt").write_text("cut short\n")
  (damaged / "wikitext-2/test.txt").write_bytes((shared_data / "wikitext-2/test.txt").read_bytes())
  capsys.readouterr()
  assert fetch_data.main(["--source=local", f"--from={damaged}", f"--output={tmp_path / 'o'}",
                          "--datasets=wikitext-2"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "wikitext-2/valid.txt does not match its MANIFEST.tsv sha256" in err
  assert not (tmp_path / "o" / "wikitext-2").exists()  # Nothing written from a damaged copy.


@pytest.mark.parametrize("argv,message", [
    (["--datasets=wiki"], "--datasets=wiki: give any of"),
    (["--datasets=gutenberg"], "gutenberg has no Hub copy"),
    (["--source=local"], "--source=local needs --from=DIR"),
    (["--link"], "--from and --link are for --source=local"),])
def test_bad_flags_are_one_line(tmp_path, capsys, argv, message):
  assert fetch_data.main([*argv, f"--output={tmp_path / 'o'}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_the_hub_offline_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
  """The real Hub loader (datasets.load_dataset at the pinned revision) with the Hub switched off.

  datasets and huggingface_hub read HF_HUB_OFFLINE and the cache folders once, when first imported: a test
  session's earlier test may have imported them already, so their constants are set here too. With only
  the environment set, this test then tried the network and waited 23 s on its timeouts (2026-12-07)."""
  import datasets
  import huggingface_hub

  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))  # An empty cache: nothing to fall back on.
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
  assert fetch_data.main([f"--output={tmp_path / 'o'}", "--datasets=wikitext-2"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Salesforce/wikitext@b08601e0" in err and "HF_HUB_OFFLINE" in err, err
  assert not (tmp_path / "o" / "wikitext-2").exists()

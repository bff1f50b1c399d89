"""Each task reader on the shared files: exact row counts, label types and ranges."""

import json

import numpy as np
import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import generic, tasks as eval_tasks

# task -> {split: rows}, from shared/data/SOURCES.md.
COUNTS = {
    "cola": {"train": 8551, "dev": 1043},
    "sst2": {"train": 67349, "dev": 872, "test": 1821},
    "sst5": {"train": 8544, "dev": 1101, "test": 2210},
    "mrpc": {"train": 4076, "test": 1725},
    "stsb": {"train": 5749, "dev": 1500, "test": 1379},
    "qnli": {"dev": 5463},
    "rte": {"train": 2490, "dev": 277},
    "snli": {"dev": 9842, "test": 9824},}
CLASSES = {"cola": 2, "sst2": 2, "sst5": 5, "mrpc": 2, "qnli": 2, "rte": 2, "snli": 3}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_reader_counts_and_labels(shared_data, name):
  task = eval_tasks.load_task(name, shared_data)
  assert {s: len(sp) for s, sp in task.splits.items()} == COUNTS[name]
  for split, sp in task.splits.items():
    assert len(sp.labels) == len(sp.texts), split
    assert all(isinstance(t, str) and t for t in sp.texts), f"{name}/{split}: empty text"
    assert (sp.pairs is not None) == (task.kind != eval_tasks.CLASSIFICATION), split
    if name == "stsb":
      assert sp.labels.dtype == np.float32 and sp.labels.min() == 0.0 and sp.labels.max() == 5.0
    else:
      assert sp.labels.dtype == np.int64
      assert set(np.unique(sp.labels)) == set(range(CLASSES[name])), f"{name}/{split}"
  assert task.fit in task.splits and all(s in task.splits for s in task.scored)


def test_sts_benchmark_csv(shared_data):
  """QUOTE_NONE keeps quotes inside sentences (a quoting reader would merge rows)."""
  counts = {s: len(eval_tasks.read_sts_benchmark(shared_data, s)) for s in ("train", "dev", "test")}
  assert counts == {"train": 5749, "dev": 1500, "test": 1379}
  test = eval_tasks.read_sts_benchmark(shared_data, "test")
  assert test.texts[0] == "A girl is styling her hair." and test.labels[0] == pytest.approx(2.5)


def test_protocol_notes(shared_data):
  assert eval_tasks.load_task("qnli", shared_data).scored == ()
  assert "cross-validation" in eval_tasks.load_task("qnli", shared_data).note
  assert eval_tasks.load_task("snli", shared_data).note


def test_generic_reader(tmp_path):
  tsv = tmp_path / "d.tsv"
  tsv.write_text("sentence\tother\tlabel\n" +
                 "".join(f"Row {i} \"quoted\".\tx\t{'pos' if i % 2 else 'neg'}\n" for i in range(10)))
  task = generic.read_generic(generic.GenericSpec(str(tsv), text="sentence", label="label"))
  assert task.splits["train"].texts[2] == 'Row 2 "quoted".'
  assert task.splits["train"].labels.tolist() == [0, 1] * 5 and task.scored == () and task.cosine_splits == ()
  jsonl = tmp_path / "d.jsonl"
  jsonl.write_text("\n".join(json.dumps({"a": f"s{i}", "b": f"t{i}", "y": i / 2}) for i in range(10)))
  task = generic.read_generic(generic.GenericSpec(str(jsonl), str(jsonl), "a", "", "y", "regression"))
  assert task.kind == "regression" and task.splits["eval"].labels.dtype == np.float32
  assert task.cosine_splits == ()  # Single texts: no zero-shot cosine.
  pair = generic.read_generic(generic.GenericSpec(str(jsonl), str(jsonl), "a", "b", "y", "regression"))
  assert pair.splits["train"].pairs == [f"t{i}" for i in range(10)] and pair.cosine_splits == ("eval",)
  with pytest.raises(UserError, match="no column 'nope'"):
    generic.read_generic(generic.GenericSpec(str(tsv), text="nope"))
  with pytest.raises(UserError, match="use one of"):
    generic.read_generic(generic.GenericSpec(str(tsv), kind="ranking"))
  with pytest.raises(UserError, match="unknown task"):
    eval_tasks.parse_tasks("sst2,glue")


def _spec(path, **kw):
  return generic.GenericSpec(str(path), **{"text": "t", "label": "y", **kw})


def _tsv(tmp_path, body, name="d.tsv"):
  path = tmp_path / name
  path.write_bytes(body.encode() if isinstance(body, str) else body)
  return path


ROWS = "".join(f"text {i}\t{i % 2}\n" for i in range(10))


@pytest.mark.parametrize("body, match", [
    ("", "is empty"),
    ("t\ty\n", "header but no rows"),
    ("t\ty\n" + ROWS + "a tab\there\t1\n", "line 12 has 3 tab-separated fields, the header has 2: a tab inside"),
    ("t\ty\n" + ROWS + "no label\n", "line 12 has 1 tab-separated fields.*missing value"),
    ("t\ty\n" + ROWS + "empty label\t\n", "line 12: the label 'y' is empty"),
    ("t\ty\n" + "".join(f"text {i}\tsame\n" for i in range(10)), "one class \\('same'\\)"),
    ("t\ty\n" + "".join(f"text {i}\t{min(i, 1)}\n" for i in range(10)), "class '0' has 1 rows.*at least 5"),
    (b"t\ty\nna\xefve\t1\n", "not UTF-8 \\(line 2, byte 6"),])
def test_generic_bad_tsv_is_one_clear_error(tmp_path, body, match):
  """Each bad file is a UserError naming the file (and line), never a traceback or a wrong class."""
  path = _tsv(tmp_path, body)
  with pytest.raises(UserError, match=match) as e:
    generic.read_generic(_spec(path))
  assert str(path) in str(e.value)


def test_generic_bad_jsonl_and_sizes(tmp_path):
  rows = [{"t": f"s{i}", "y": i % 2} for i in range(10)]
  path = _tsv(tmp_path, "\n".join(map(json.dumps, rows[:4] + [{"t": "no label"}] + rows[4:])), "d.jsonl")
  with pytest.raises(UserError, match="line 5 has no key 'y'"):
    generic.read_generic(_spec(path))
  path = _tsv(tmp_path, "\n\n", "e.jsonl")
  with pytest.raises(UserError, match="is empty"):
    generic.read_generic(_spec(path))
  path = _tsv(tmp_path, "\n".join(json.dumps({"t": f"s{i}", "y": i / 3}) for i in range(5)), "r.jsonl")
  with pytest.raises(UserError, match="train has 5 rows, too few.*at least 10"):
    generic.read_generic(_spec(path, kind="regression"))
  path = _tsv(tmp_path, "\n".join(json.dumps({"t": f"s{i}", "y": "x" if i else 1}) for i in range(12)), "n.jsonl")
  with pytest.raises(UserError, match="line 2: label 'x' is not a number"):
    generic.read_generic(_spec(path, kind="regression"))


def test_generic_labels_and_separators(tmp_path):
  """"1" and "1.0" are one class (sorted as numbers); U+2028 inside a text does not split the row."""
  body = "t\ty\n" + "".join(f"line\u2028{i} sep\u0085x\t{['1', '1.0', '0', '2', '10'][i % 5]}\n" for i in range(25))
  task = generic.read_generic(_spec(_tsv(tmp_path, body)))
  train = task.splits["train"]
  assert len(train) == 25 and train.texts[3] == "line\u20283 sep\u0085x"
  assert train.labels[:5].tolist() == [1, 1, 0, 2, 3]  # Classes 0 < 1 < 2 < 10, "1" == "1.0".
  jsonl = _tsv(
      tmp_path, "\n".join(
          json.dumps({"t": f"a\u2028b{i}", "y": [1, "1.0"][i % 2] if i < 6 else 0}, ensure_ascii=False)
          for i in range(12)), "u.jsonl")
  task = generic.read_generic(_spec(jsonl))
  assert len(task.splits["train"]) == 12 and task.metrics == ("accuracy", "f1")
  assert task.splits["train"].labels.tolist() == [1] * 6 + [0] * 6


def test_shared_readers_split_rows_on_newlines_only(tmp_path):
  root = tmp_path / "data"
  (root / "glue/RTE").mkdir(parents=True)
  (root / "glue/RTE/train.tsv").write_text("sentence1\tsentence2\tlabel\tidx\na\u2028b\tc\t0\t0\nd\te\t1\t1\n")
  (root / "glue/RTE/dev.tsv").write_text("sentence1\tsentence2\tlabel\tidx\nx\ty\t1\t0\n")
  task = eval_tasks.load_task("rte", root)
  assert task.splits["train"].texts == ["a\u2028b", "d"]


def test_task_file(tmp_path):
  (tmp_path / "data").mkdir()
  for name in ("a", "b"):
    (tmp_path / "data" / f"{name}.jsonl"
    ).write_text("\n".join(json.dumps({"s1": f"x{i}", "s2": f"y{i}", "score": i / 4, "cls": i % 2}) for i in range(12)))
  doc = {
      "tasks": [{
          "name": "sts", "type": "regression", "train": "data/a.jsonl",
          "eval": {"dev": "data/b.jsonl",
                   "test": "data/b.jsonl"}, "columns": {"text": "s1", "pair": "s2", "label": "score"}}, {
                       "name": "para", "type": "pair_classification", "train": "data/a.jsonl",
                       "columns": {"text": "s1", "pair": "s2", "label": "cls"}}, {
                           "name": "single", "type": "classification", "train": "data/a.jsonl", "eval": "data/b.jsonl",
                           "columns": {"text": "s1", "label": "cls"}}]}
  path = tmp_path / "tasks.json"
  path.write_text(json.dumps(doc))
  tasks = [generic.read_generic(s) for s in generic.read_task_file(str(path))]
  assert [(t.name, t.kind, t.scored, t.cosine_splits) for t in tasks] == [
      ("sts", "regression", ("dev", "test"), ("dev", "test")), ("para", "pair_classification", (), ("train",)),
      ("single", "classification", ("eval",), ())]
  yaml = pytest.importorskip("yaml")
  ypath = tmp_path / "tasks.yaml"
  ypath.write_text(yaml.safe_dump(doc))
  assert generic.read_task_file(str(ypath)) == generic.read_task_file(str(path))
  doc["tasks"][1]["colums"] = {}
  path.write_text(json.dumps(doc))
  with pytest.raises(UserError, match="unknown key 'colums'"):
    generic.read_task_file(str(path))

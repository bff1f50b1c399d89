"""Each task reader on the shared files: exact row counts, label types and ranges."""

import json

import numpy as np
import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import tasks as eval_tasks

# task -> {split: rows}, from shared/data/SOURCES.md.
COUNTS = {
    "cola": {"train": 8551, "dev": 1043},
    "sst2": {"train": 67349, "dev": 872, "test": 1821},
    "mrpc": {"train": 4076, "test": 1725},
    "stsb": {"train": 5749, "dev": 1500, "test": 1379},
    "qnli": {"dev": 5463},
    "rte": {"train": 2490, "dev": 277},
    "snli": {"dev": 9842, "test": 9824},
}
CLASSES = {"cola": 2, "sst2": 2, "mrpc": 2, "qnli": 2, "rte": 2, "snli": 3}


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
  tsv.write_text("sentence\tother\tlabel\nA good one.\tx\tpos\nA bad one.\ty\tneg\nFine \"quoted\".\tz\tpos\n")
  task = eval_tasks.read_generic(eval_tasks.GenericSpec(str(tsv), text="sentence", label="label"))
  assert task.splits["train"].texts[2] == 'Fine "quoted".'
  assert task.splits["train"].labels.tolist() == [1, 0, 1] and task.scored == ()
  jsonl = tmp_path / "d.jsonl"
  jsonl.write_text("\n".join(json.dumps({"a": f"s{i}", "b": f"t{i}", "y": i / 2}) for i in range(4)))
  task = eval_tasks.read_generic(eval_tasks.GenericSpec(str(jsonl), str(jsonl), "a", "", "y", "regression"))
  assert task.kind == "regression" and task.splits["eval"].labels.dtype == np.float32
  pair = eval_tasks.read_generic(eval_tasks.GenericSpec(str(jsonl), "", "a", "b", "y", "pair_classification"))
  assert pair.splits["train"].pairs == ["t0", "t1", "t2", "t3"]
  with pytest.raises(UserError, match="no column 'nope'"):
    eval_tasks.read_generic(eval_tasks.GenericSpec(str(tsv), text="nope"))
  with pytest.raises(UserError, match="--generic_type"):
    eval_tasks.read_generic(eval_tasks.GenericSpec(str(tsv), kind="ranking"))
  with pytest.raises(UserError, match="unknown task"):
    eval_tasks.parse_tasks("sst2,glue")

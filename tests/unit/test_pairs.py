"""Pair / triplet files for the contrastive stage: JSONL, Parquet, TSV, SNLI triplets, and each bad input's line."""

import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import pairs

ROWS = [{"anchor": "a dog runs", "positive": "an animal moves", "negative": "a cat sleeps"},
        {"anchor": "it rains", "positive": "the weather is wet", "negative": "it is sunny"}]
EXPECTED = [pairs.Pair(r["anchor"], r["positive"], r["negative"]) for r in ROWS]


def _write(tmp_path: pathlib.Path, fmt: str, rows: list[dict], name: str = "pairs") -> pathlib.Path:
  path = tmp_path / f"{name}.{fmt}"
  if fmt == "jsonl":
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  elif fmt == "tsv":
    header = list(rows[0]) if rows else ["anchor", "positive"]
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(str(r[k]) for k in header) + "\n" for r in rows))
  else:
    pq.write_table(pa.Table.from_pylist(rows), path)
  return path


@pytest.mark.parametrize("fmt", ["jsonl", "tsv", "parquet"])
def test_reads_triplets_and_pairs(tmp_path, fmt):
  assert pairs.read_pairs(_write(tmp_path, fmt, ROWS)) == EXPECTED
  no_neg = [{k: r[k] for k in ("anchor", "positive")} for r in ROWS]
  assert pairs.read_pairs(_write(tmp_path, fmt, no_neg, "two")) == [pairs.Pair(p.anchor, p.positive) for p in EXPECTED]


@pytest.mark.parametrize("names", [("sentence1", "sentence2"), ("premise", "hypothesis"), ("q", "d")])
def test_column_names(tmp_path, names):
  """The known pair columns are found by themselves; others are named by the caller."""
  rows = [{names[0]: r["anchor"], names[1]: r["positive"], "label": 1} for r in ROWS]
  path = _write(tmp_path, "jsonl", rows)
  columns = names if names == ("q", "d") else None
  assert pairs.read_pairs(path, columns) == [pairs.Pair(p.anchor, p.positive) for p in EXPECTED]


def test_tsv_keeps_quotes(tmp_path):
  """TSV is read without quoting (as the shared STS/SNLI files need): a quote is text."""
  path = tmp_path / "q.tsv"
  path.write_text('anchor\tpositive\n"quoted" start\the said "hi\n')
  assert pairs.read_pairs(path) == [pairs.Pair('"quoted" start', 'he said "hi')]


@pytest.mark.parametrize("fmt", ["jsonl", "tsv", "parquet"])
def test_missing_column_is_one_line(tmp_path, fmt):
  path = _write(tmp_path, fmt, [{"anchor": "x", "other": "y"}])
  with pytest.raises(UserError, match=rf"^{path}: no positive column \(has \['anchor', 'other'\]\); name its columns"):
    pairs.read_pairs(path)
  with pytest.raises(UserError, match=rf"^{path}: no column 'neg' \(has .*\); name its columns"):
    pairs.read_pairs(path, ("anchor", "other", "neg"))


@pytest.mark.parametrize("fmt", ["jsonl", "tsv", "parquet"])
def test_empty_file_is_one_line(tmp_path, fmt):
  if fmt == "parquet":
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"anchor": pa.array([], pa.string()), "positive": pa.array([], pa.string())}), path)
  else:
    path = tmp_path / f"e.{fmt}"
    path.write_text("anchor\tpositive\n" if fmt == "tsv" else "\n")
  with pytest.raises(UserError, match=rf"^{path}: holds no pairs \(empty, or a header only\)"):
    pairs.read_pairs(path)


@pytest.mark.parametrize("fmt,where", [("jsonl", ":2"), ("parquet", " row 2"), ("tsv", ":3")])
def test_null_text_names_file_and_row(tmp_path, fmt, where):
  rows = [dict(ROWS[0]), dict(ROWS[1], positive=None if fmt != "tsv" else "  ")]
  path = _write(tmp_path, fmt, rows)
  what = "empty" if fmt == "tsv" else "null"
  with pytest.raises(UserError, match=rf"^{path}{where}: column 'positive' is {what}; fill in the text or remove"):
    pairs.read_pairs(path)


def test_other_bad_files(tmp_path):
  bad_json = tmp_path / "b.jsonl"
  bad_json.write_text('{"anchor": "a", "positive": "b"}\n{not json\n')
  with pytest.raises(UserError, match=rf"^{bad_json}:2: not JSON"):
    pairs.read_pairs(bad_json)
  ragged = tmp_path / "r.tsv"
  ragged.write_text("anchor\tpositive\na\tb\tc\n")
  with pytest.raises(UserError, match=rf"^{ragged}:2: 3 tab-separated fields, the header has 2"):
    pairs.read_pairs(ragged)
  (tmp_path / "x.csv").write_text("anchor,positive\na,b\n")
  with pytest.raises(UserError, match=r"unknown pair-file type '\.csv'"):
    pairs.read_pairs(tmp_path / "x.csv")
  with pytest.raises(UserError, match="no such pair file"):
    pairs.read_pairs(tmp_path / "missing.jsonl")


def test_nli_triplets():
  rows = [("P1", "e1", "entailment"), ("P1", "n1", "neutral"), ("P1", "c1", "contradiction"),
          ("P1", "e2", "entailment"), ("P2", "e3", "entailment"), ("P3", "c3", "contradiction"),
          ("P1", "c2", "contradiction")]
  # P2 has no contradiction, P3 no entailment: neither gives a triplet.
  assert pairs.nli_triplets(rows) == [pairs.Pair("P1", "e1", "c1"), pairs.Pair("P1", "e2", "c2")]


def test_text_ids_and_columns():
  ids = pairs.text_ids(["a b", "c", " a b "])
  assert ids.dtype.name == "int32" and ids[0] == ids[2] != ids[1] and ids.min() >= 0
  assert pairs.as_columns(EXPECTED)["negative"] == ["a cat sleeps", "it is sunny"]
  with pytest.raises(UserError, match="1 of 2 examples have a negative"):
    pairs.as_columns([EXPECTED[0], pairs.Pair("x", "y")])


def test_senteval_nli_misaligned(tmp_path):
  for name, text in (("s1.dev", "a\nb\n"), ("s2.dev", "c\n"), ("labels.dev", "entailment\n")):
    (tmp_path / name).write_text(text)
  with pytest.raises(UserError, match=r"have 2, 1, 1 lines; they must be line-aligned"):
    pairs.read_senteval_nli(tmp_path, "dev")
  with pytest.raises(UserError, match=r"s1.test: missing"):
    pairs.read_senteval_nli(tmp_path, "test")


def test_real_snli_triplets(shared_data):
  """The shared SNLI dev split (SentEval layout) as triplets."""
  folder = shared_data / "senteval/downstream/SNLI"
  assert (folder / "s1.dev").exists(), f"{folder} holds no SNLI dev split"
  rows = pairs.read_senteval_nli(folder, "dev")
  assert len(rows) == 9842
  triplets = pairs.nli_triplets(rows)
  assert len(triplets) == 3172  # The premises with an entailment and a contradiction (2,943), some with two.
  first = triplets[0]
  assert first == pairs.Pair("Two women are embracing while holding to go packages .",
                             "Two woman are holding packages .", "The men are fighting outside a deli .")
  assert all(t.anchor and t.positive and t.negative and t.positive != t.negative for t in triplets)


def test_hub_specs():
  assert pairs.is_hub(" hf:a/b") and not pairs.is_hub("runs/hf:a.jsonl")
  assert pairs.parse_hub("hf:sentence-transformers/all-nli") == ("sentence-transformers/all-nli", None, "train")
  assert pairs.parse_hub("hf:sentence-transformers/all-nli:triplet@dev") == ("sentence-transformers/all-nli", "triplet",
                                                                             "dev")
  for bad in ("hf:all-nli", "hf:a/b/c", "hf:/b:x", "hf:a/b,c/d"):
    with pytest.raises(UserError, match=r"write a Hub dataset as hf:OWNER/NAME\[:CONFIG\]\[@SPLIT\]"):
      pairs.parse_hub(bad)

"""mteb_eval's local task data (evaluation/mteb_data.py): malformed or unscorable files are one line naming the
file (and line), never a traceback or a silent nan; read through mteb's own task objects, offline."""

import json
import pathlib

import pytest

from tests.helpers import run_command

STS_HEADER = "sentence1\tsentence2\tscore\n"
STS_GOOD = STS_HEADER + "a cat sat\ta cat sits\t4.5\na dog ran\tthe sky is blue\t0.5\n"
CORPUS = [{"_id": "d1", "title": "", "text": "cats purr"}, {"_id": "d2", "title": "", "text": "dogs bark"}]
QUERIES = [{"_id": "q1", "text": "what purrs"}, {"_id": "q2", "text": "what barks"}]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n"


def _jsonl(rows) -> str:
  return "".join(json.dumps(r) + "\n" for r in rows)


def _sts(root: pathlib.Path, text: str) -> pathlib.Path:
  (root / "STSBenchmark").mkdir(parents=True)
  (root / "STSBenchmark" / "test.tsv").write_text(text)
  return root / "STSBenchmark" / "test.tsv"


def _scifact(root: pathlib.Path, **files: str) -> pathlib.Path:
  """A tiny SciFact in the BEIR layout; `files` replace its corpus / queries / qrels text."""
  folder = root / "SciFact"
  (folder / "qrels").mkdir(parents=True)
  texts = {"corpus": _jsonl(CORPUS), "queries": _jsonl(QUERIES), "qrels": QRELS} | files
  (folder / "corpus.jsonl").write_text(texts["corpus"])
  (folder / "queries.jsonl").write_text(texts["queries"])
  (folder / "qrels" / "test.tsv").write_text(texts["qrels"])
  return folder


def _fill(task_name: str, root: pathlib.Path):
  import mteb

  from crossbert_jax.evaluation import mteb_data

  return mteb_data.fill_local(mteb.get_task(task_name), str(root))


def test_well_formed_files_fill_the_tasks(tmp_path):
  sts = _fill("STSBenchmark", _sts(tmp_path, STS_GOOD).parents[1])
  assert sts.dataset["test"]["score"] == [4.5, 0.5]
  _scifact(tmp_path)
  split = _fill("SciFact", tmp_path).dataset["default"]["test"]
  assert (len(split["corpus"]), len(split["queries"]), split["relevant_docs"]) == (2, 2,
                                                                                   {"q1": {"d1": 1}, "q2": {"d2": 1}})


STS_CASES = {
    "one_column_row": (STS_GOOD + "only one column\n", " line 4 has 1 tab-separated fields, the header has 3"),
    "non_numeric_score": (STS_GOOD + "a\tb\thigh\n", " line 4: score 'high' is not a finite number"),
    "nan_score": (STS_GOOD + "a\tb\tnan\n", " line 4: score 'nan' is not a finite number"),
    "constant_scores": (STS_HEADER + "a\tb\t3.0\nc\td\t3.0\n", ": every score is 3.0; Spearman and Pearson"),
    "score_out_of_range": (STS_GOOD + "a\tb\t7\n", " line 4: score 7 is outside STSBenchmark's range 0..5"),
    "header_only": (STS_HEADER, " has a header but no rows"),}


@pytest.mark.parametrize("case", list(STS_CASES))
def test_bad_sts_file_is_one_line_naming_file_and_line(tmp_path, case):
  from crossbert_jax.core.errors import UserError

  text, expected = STS_CASES[case]
  path = _sts(tmp_path, text)
  with pytest.raises(UserError) as e:
    _fill("STSBenchmark", tmp_path)
  assert str(e.value).startswith(f"{path}{expected}") and "\n" not in str(e.value), str(e.value)


RETRIEVAL_CASES = {
    "bad_corpus_line": ({"corpus": _jsonl(CORPUS) + "{not json\n"}, "corpus.jsonl line 3: invalid JSON"),
    "corpus_without_id": ({"corpus": _jsonl([{"id": "d1", "text": "x"}])}, "corpus.jsonl line 1 has no key '_id'"),
    "empty_corpus": ({"corpus": ""}, "corpus.jsonl is empty"),
    "bad_queries_line": ({"queries": '{"_id": "q1", "text": "x"\n'}, "queries.jsonl line 1: invalid JSON"),
    "one_column_qrels_row": ({"qrels": QRELS + "q1\n"}, "qrels/test.tsv line 4 has 1 tab-separated field(s)"),
    "non_numeric_qrels_score": ({"qrels": QRELS + "q1\td2\tyes\n"}, "qrels/test.tsv line 4: score 'yes' is not a "
                                "finite number"),
    "fractional_qrels_score": ({"qrels": QRELS + "q1\td2\t0.5\n"}, "qrels/test.tsv line 4: score '0.5' is not a "
                               "whole number"),
    "queries_without_qrels": ({"queries": _jsonl([{"_id": "other",
                                                   "text": "x"}])}, "qrels/test.tsv line 2: query 'q1' is not in "),
    "header_only_qrels": ({"qrels": "query-id\tcorpus-id\tscore\n"}, "qrels/test.tsv holds no judgements"),}


@pytest.mark.parametrize("case", list(RETRIEVAL_CASES))
def test_bad_retrieval_file_is_one_line_naming_file_and_line(tmp_path, case):
  from crossbert_jax.core.errors import UserError

  files, expected = RETRIEVAL_CASES[case]
  folder = _scifact(tmp_path, **files)
  with pytest.raises(UserError) as e:
    _fill("SciFact", tmp_path)
  assert str(e.value).startswith(f"{folder}/{expected}") and "\n" not in str(e.value), str(e.value)


def test_mteb_eval_refuses_bad_data_before_loading_and_leaves_no_output(tmp_path):
  """The command: the file's line on stderr, exit 2, no traceback, before any run is read (the --workdir here is
  not even a run), and no --output_dir made."""
  path = _sts(tmp_path / "data", STS_GOOD + "a\tb\tnan\n")
  out = tmp_path / "mteb"
  proc = run_command("crossbert_jax.mteb_eval", f"--workdir={tmp_path / 'run'}", "--tasks=STSBenchmark",
                     f"--data_dir={tmp_path / 'data'}", f"--output_dir={out}",
                     env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: {path} line 4: score 'nan' is not a finite number; fix or drop the row"], proc.stderr[-2000:]
  assert not out.exists()

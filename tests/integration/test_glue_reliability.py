"""evaluate --benchmark=glue with bad input and earlier results (issue 49: 5, 8, 10, 11, 13, 14, 16), in process:
one error line and exit 2 before any model loads, --force over saved results, a damaged saved result rerun,
an --output_dir's table gaining columns (never losing one) and its default in the run; and mteb_eval's
"superseded" note printed once (issue 54: 7), in a subprocess, since what the terminal shows is the point."""

import functools
import json
import shutil

import numpy as np
import pytest
from absl import flags as absl_flags

from crossbert_jax import evaluate
from tests.helpers import cpu_env, run_module
from tests.integration.test_glue import OFFLINE, _datasets_cache, write_hub_copy  # noqa: F401 - _datasets_cache: autouse.
from tests.integration.test_mteb import local_data, small_data  # noqa: F401 - fixtures (small_data reads local_data).


class _Flags:
  """absl.flags with a fresh FlagValues: evaluate's flags defined here do not clash with other commands'."""
  def __init__(self):
    self.FLAGS = absl_flags.FlagValues()  # pylint: disable=invalid-name

  def __getattr__(self, name):
    attr = getattr(absl_flags, name)
    return functools.partial(attr, flag_values=self.FLAGS) if name.startswith("DEFINE") else attr


@pytest.fixture
def evaluate_cli(monkeypatch, capsys):
  """Runs evaluate's main in process: (exit code or None, stdout, stderr)."""
  for name, value in OFFLINE.items():
    monkeypatch.setenv(name, value)

  def run(*args):
    monkeypatch.setattr(evaluate, "flags", _Flags())
    evaluate._define_flags()  # pylint: disable=protected-access
    evaluate.flags.FLAGS(["evaluate", *args])
    code = None
    try:
      evaluate.main(["evaluate"])
    except SystemExit as e:
      code = e.code
    out, err = capsys.readouterr()
    return code, out, err

  return run


@pytest.fixture(scope="module")
def runs(tiny_run, tmp_path_factory):
  """Two copies of the tiny run whose folders share a name (a/run, b/run): same column label, other models."""
  root = tmp_path_factory.mktemp("glue_runs")
  for parent in ("a", "b"):
    shutil.copytree(tiny_run, root / parent / "run", ignore=shutil.ignore_patterns("eval_cache", "glue*", "eval_*"))
  return root / "a" / "run", root / "b" / "run"


@pytest.fixture(scope="module")
def copy(tmp_path_factory, shared_data):
  out = tmp_path_factory.mktemp("glue_copy")
  write_hub_copy(shared_data, out, ("cola", "rte"))
  return out


def _glue(run, data, *more):
  return ("--benchmark=glue", f"--workdir={run}", f"--data_dir={data}", "--max_length=64", "--noprogress",
          "--max_examples=200", "--probe_seeds=1", *more)


def _edit(path, **columns):
  """Rewrites a parquet file with some columns replaced ({name: list})."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  table = pq.read_table(path)
  for name, values in columns.items():
    table = table.set_column(table.column_names.index(name), name, pa.array(values, table.schema.field(name).type))
  pq.write_table(table, path)


@pytest.mark.parametrize("tasks", ["--tasks=", "--tasks=,"])
def test_tasks_naming_nothing_is_refused(evaluate_cli, tmp_path, copy, tasks):
  code, _, err = evaluate_cli(*_glue(tmp_path / "no_run", copy, tasks, f"--output_dir={tmp_path / 'out'}"))
  given = tasks.split("=")[1]
  assert code == 2 and err.splitlines() == [
      f"error: --tasks={given!r} names no task: give GLUE tasks (cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte) or all, or "
      "drop --tasks for the whole benchmark"], err


def test_force_over_saved_results_and_a_damaged_one_rerun(evaluate_cli, runs, copy, tmp_path):
  out = tmp_path / "out"
  args = _glue(runs[0], copy, "--tasks=cola", f"--output_dir={out}")
  assert evaluate_cli(*args)[0] is None
  table = (out / "glue_table.json").read_bytes()
  (saved,) = out.glob("tasks/*/*/cola.json")
  code, stdout, err = evaluate_cli(*args, "--force")
  assert code is None and "Traceback" not in err, err
  assert " texts, " in stdout and not list(out.glob("tasks/*/*/*.tmp"))  # Run again, written whole.
  assert (out / "glue_table.json").read_bytes() == table
  for damage in ("", saved.read_text()[:100], json.dumps({"task": "cola"})):
    saved.write_text(damage)
    code, stdout, err = evaluate_cli(*args)
    assert code is None, err
    warnings = [l for l in stdout.splitlines() if l.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {saved} is damaged (") and warnings[0].endswith(
        "); running cola again"), stdout
    assert " texts, " in stdout and (out / "glue_table.json").read_bytes() == table


def test_output_dir_gains_columns_and_defaults_to_the_run(evaluate_cli, runs, copy, tmp_path, monkeypatch):
  """Two runs named alike into one --output_dir: both columns; one scored again keeps its column; another
  settings' table is refused; without --output_dir the table goes into the run (nothing in the current folder)."""
  a, b = runs
  out = tmp_path / "out"
  assert evaluate_cli(*_glue(a, copy, "--tasks=cola", f"--output_dir={out}"))[0] is None
  assert evaluate_cli(*_glue(b, copy, "--tasks=cola", f"--output_dir={out}"))[0] is None
  table = json.loads((out / "glue_table.json").read_text())
  assert table["columns"] == ["run@5", f"run@5 ({b})"], table["columns"]
  first = table["rows"]["cola"]["scores"]["run@5"]
  assert evaluate_cli(*_glue(a, copy, "--tasks=cola", f"--output_dir={out}"))[0] is None
  again = json.loads((out / "glue_table.json").read_text())
  assert again["columns"] == table["columns"] and again["rows"]["cola"]["scores"]["run@5"] == first
  code, _, err = evaluate_cli(*_glue(a, copy, "--tasks=cola", f"--output_dir={out}", "--probe_seeds=2"))
  assert code == 2 and err.splitlines() == [
      f"error: --output_dir {out} holds a GLUE table scored with other settings (probe_seeds: 1 there, 2 here), so "
      "their columns would not compare: choose another --output_dir, or rerun with those settings"], err
  assert json.loads((out / "glue_table.json").read_text()) == again
  monkeypatch.chdir(tmp_path)
  assert evaluate_cli(*_glue(a, copy, "--tasks=cola"))[0] is None
  assert json.loads((a / "glue" / "glue_table.json").read_text())["columns"] == ["run@5"]
  assert not (tmp_path / "glue_results").exists()


@pytest.fixture
def rte_copy(tmp_path, shared_data):
  write_hub_copy(shared_data, tmp_path / "copy", ("rte",))
  return tmp_path / "copy"


def test_a_null_text_is_refused_naming_file_and_row(evaluate_cli, runs, rte_copy, tmp_path):
  import pyarrow.parquet as pq

  train = rte_copy / "rte" / "train-00000-of-00001.parquet"
  texts = pq.read_table(train).column("sentence2").to_pylist()
  _edit(train, sentence2=texts[:7] + [None] + texts[8:])
  code, _, err = evaluate_cli(*_glue(runs[0], rte_copy, "--tasks=rte", f"--output_dir={tmp_path / 'out'}"))
  assert code == 2 and err.splitlines() == [
      f"error: --data_dir {rte_copy}/rte: train-00000-of-00001.parquet row 7 has no 'sentence2' (null): GLUE has "
      "none; copy the file again from nyu-mll/glue, or drop that row"], err
  assert not (tmp_path / "out").exists()


def test_a_train_split_with_one_class_is_refused_before_embedding(evaluate_cli, runs, rte_copy, tmp_path):
  import pyarrow.parquet as pq

  train = rte_copy / "rte" / "train-00000-of-00001.parquet"
  _edit(train, label=np.zeros(pq.read_metadata(train).num_rows, np.int64))
  code, out, err = evaluate_cli(*_glue(runs[0], rte_copy, "--tasks=rte", f"--output_dir={tmp_path / 'out'}"))
  assert code == 2 and err.splitlines() == [
      f"error: --data_dir {rte_copy}/rte: rte train has one class (every label is 0), which no probe can be fitted "
      "to; give nyu-mll/glue's train split whole"], err
  assert "run@5" not in out and not (tmp_path / "out").exists()  # Refused before the model loaded.


def _empty(path):
  import pyarrow.parquet as pq

  pq.write_table(pq.read_table(path).slice(0, 0), path)


def _renamed(path):
  import pyarrow.parquet as pq

  table = pq.read_table(path)
  pq.write_table(table.rename_columns(["premise2" if c == "sentence2" else c for c in table.column_names]), path)


@pytest.mark.parametrize("split,damage,expected", [
    ("train", lambda p: p.write_bytes(b"not parquet"), "rte/train-00000-of-00001.parquet is not a readable parquet "
     "file (ArrowInvalid: Parquet magic bytes not found in footer. Either the file is corrupted or this is not a "
     "parquet file.); copy it again from nyu-mll/glue"),
    ("train", lambda p: p.write_bytes(b""), "rte/train-00000-of-00001.parquet is not a readable parquet file "
     "(ArrowInvalid: Parquet file size is 0 bytes); copy it again from nyu-mll/glue"),
    ("train", _empty, "rte/train-*.parquet has no rows (train-00000-of-00001.parquet); copy the files again from "
     "nyu-mll/glue"),
    ("validation", _renamed, "rte/validation-00000-of-00001.parquet has no column 'sentence2' (columns: sentence1, "
     "premise2, label, idx); give nyu-mll/glue's parquet files as the Hub has them"),],
                         ids=["damaged", "zero_bytes", "no_rows", "columns_unlike_train"])
def test_hub_copy_faults_are_one_line_naming_the_file(evaluate_cli, runs, rte_copy, tmp_path, caplog, split, damage,
                                                      expected):
  damage(rte_copy / "rte" / f"{split}-00000-of-00001.parquet")
  code, _, err = evaluate_cli(*_glue(runs[0], rte_copy, "--tasks=rte", f"--output_dir={tmp_path / 'out'}"))
  assert code == 2 and err.splitlines() == [f"error: --data_dir {rte_copy}: {expected}"], err
  assert not [r for r in caplog.records if r.name.startswith("datasets")]  # No log lines of datasets' own.


def test_an_extra_column_in_one_split_is_read(evaluate_cli, runs, rte_copy, tmp_path):
  """A validation split with a column train lacks (datasets' builder cast both to one schema and failed)."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  path = rte_copy / "rte" / "validation-00000-of-00001.parquet"
  table = pq.read_table(path)
  pq.write_table(table.append_column("extra", pa.array(np.zeros(len(table), np.int64))), path)
  code, out, err = evaluate_cli(*_glue(runs[0], rte_copy, "--tasks=rte", f"--output_dir={tmp_path / 'out'}"))
  assert code is None and "[1/1] rte: linear " in out, err


def test_mteb_superseded_note_is_printed_once(runs, small_data, tmp_path):  # noqa: F811 - small_data: a fixture.
  """mteb warned twice per model and task (a log line and a UserWarning); now one note, before any work. On
  test_mteb.py's `small_data` (200 STSBenchmark pairs): mteb warns per task evaluated, whatever its size."""
  proc = run_module([
      "crossbert_jax.mteb_eval", f"--workdir={runs[0]}", f"--data_dir={small_data}", "--max_length=64",
      f"--output_dir={tmp_path / 'mteb'}", "--tasks=STSBenchmark"], env=cpu_env(**OFFLINE))
  both = proc.stdout + proc.stderr
  assert both.count("superseded") == 1, both[-3000:]
  assert proc.stdout.splitlines()[0] == (
      "note: mteb marks STSBenchmark superseded (by STSBenchmark.v2): name the newer task in --tasks, unless you "
      "compare with scores of the older one"), proc.stdout[-2000:]

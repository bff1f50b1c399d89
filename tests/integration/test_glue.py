"""evaluate --benchmark=glue: the registry and the GLUE average, a local copy in the Hub's layout read by
`datasets` (built here from the shared files), the datasets cache offline, scores equal to today's --tasks
path, the CLI, bad input, and a kill -9 during the third task resumed to the same table byte for byte (slow)."""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import glue, glue_data, glue_run, glue_table, probes
from crossbert_jax.evaluation import tasks as eval_tasks
from tests.helpers import copy_run, cpu_env, run_module

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# GLUE config -> (today's reader, {Hub split: reader split}): what the shared data holds.
COPIED = {
    "cola": ("cola", {"train": "train", "validation": "dev"}), "sst2": ("sst2", {"train": "train",
                                                                                 "validation": "dev"}),
    "mrpc": ("mrpc", {"train": "train",
                      "validation": "test"}), "stsb": ("stsb", {"train": "train", "validation": "dev"}),
    "qnli": ("qnli", {"validation": "dev"}), "rte": ("rte", {"train": "train", "validation": "dev"})}


def write_hub_copy(shared_data, out, configs=tuple(COPIED), label_of=None) -> None:
  """The shared GLUE files as `hf download nyu-mll/glue` lays them out: <config>/<split>-00000-of-00001.parquet,
  with the Hub's column names and label encodings (idx, int labels, STS-B float scores)."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  for config in configs:
    reader, splits = COPIED[config]
    task, spec = eval_tasks.READERS[reader](epath.Path(str(shared_data))), glue.TASKS[config]
    (out / config).mkdir(parents=True, exist_ok=True)
    for hub_split, ours in splits.items():
      sp = task.splits[ours]
      labels = sp.labels if label_of is None else label_of(sp.labels)
      cols = {
          spec.columns[0]: sp.texts, **({spec.columns[1]: sp.pairs} if spec.is_pair else {}), "label": pa.array(
              labels,
              pa.int64() if spec.num_classes else pa.float32()), "idx": pa.array(np.arange(len(sp), dtype=np.int32))}
      pq.write_table(pa.table(cols), out / config / f"{hub_split}-00000-of-00001.parquet")


@pytest.fixture(scope="module")
def run_copy(tiny_run, tmp_path_factory):
  """The session's tiny CrossBERT run (conftest's tiny_run), copied: the GLUE command records its table and
  scores in the run's folder."""
  return copy_run(tiny_run, tmp_path_factory.mktemp("glue_run"))


@pytest.fixture(scope="module")
def hub_copy(tmp_path_factory, shared_data):
  out = tmp_path_factory.mktemp("glue_copy")
  write_hub_copy(shared_data, out)
  return out


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
  """An empty datasets cache: nothing of nyu-mll/glue is cached, the parquet builder writes here."""
  import datasets

  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


def test_registry_metrics_and_glue_average():
  assert glue.ROWS == ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli-m", "mnli-mm", "qnli", "rte")
  assert {n: t.metrics for n, t in glue.TASKS.items()} == {
      "cola": ("matthews",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"), "stsb": ("pearson", "spearman"),
      "qqp": ("f1", "accuracy"), "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",)}
  # Hand-checked: two-metric rows give their mean (MRPC .75, STS-B .70, QQP .70); 6.5 / 9 rows.
  rows = {
      "cola": .5, "sst2": .9, "mrpc": glue.row_score({"f1": .8, "accuracy": .7}),
      "stsb": glue.row_score({"pearson": .8, "spearman": .6}), "qqp": glue.row_score({"f1": .6, "accuracy": .8}),
      "mnli-m": .8, "mnli-mm": .7, "qnli": .85, "rte": .6}
  assert glue.glue_average(rows) == pytest.approx(6.5 / 9)
  assert glue.glue_average({**rows, "qqp": None}) is None
  assert glue.partial_average({**rows, "qqp": None, "mnli-m": None}) == (pytest.approx(5.0 / 7), 7)
  assert glue.parse_tasks("rte,cola") == ["cola", "rte"] and glue.parse_tasks("all") == list(glue.TASKS)
  with pytest.raises(UserError, match="'wnli' is not a GLUE task"):
    glue.parse_tasks("cola,wnli")


def test_table_average_over_seeds_and_the_markdown():
  """The table's GLUE average is the per-seed average of the nine rows, then its mean and spread."""
  rows = {
      "cola": [.5, .3], "sst2": [.9, .9], "mrpc": [.75, .75], "stsb": [.7, .7], "qqp": [.7, .7], "mnli-m": [.8, .8],
      "mnli-mm": [.7, .7], "qnli": [.85, .85], "rte": [.6, .6]}
  results = {}
  for name, task in glue.TASKS.items():
    results[name] = {
        "rows": {r: {p: {m: rows[r] for m in task.metrics} for p in ("linear", "knn")} for r, _ in task.rows}, "note": "",
        "sizes": {}}
  table = glue_table.summary({"m": results}, {}, {}, {"probe_seeds": 2})
  avg = table["average"]["m"]["linear"]["glue"]
  assert avg["mean"] == pytest.approx(100 * (6.5 + 6.3) / 18) and avg["std"] == pytest.approx(100 * .1 / 9)
  md = glue_table.markdown(table)
  assert "| CoLA | MCC | 40.0 ± 10.0 |" in md and "| **GLUE average** | 9 rows | 71.1 ± 1.1 |" in md
  assert glue_table.card_scores(table, "m")["glue/average/linear"] == pytest.approx(0.711111)


def test_nearest_large_matches_nearest():
  """The big-train KNN's torch top-k gives probes.nearest's neighbours, in the same order."""
  rng = np.random.default_rng(0)
  keys, queries = rng.normal(size=(3000, 16)).astype(np.float32), rng.normal(size=(600, 16)).astype(np.float32)
  (i1, s1), (i2, s2) = probes.nearest(keys, queries, 33), glue_run.nearest_large(keys, queries, 33, chunk=100)
  np.testing.assert_array_equal(i1, i2)
  np.testing.assert_allclose(s1, s2, atol=1e-6)


def test_hub_layout_copy_through_datasets(hub_copy, shared_data):
  """The copy is read by datasets' parquet builder into exactly the readers' texts and labels; MNLI and QQP
  (absent, offline, not cached) are skipped; a missing reported split and foreign labels are refused."""
  sources, skipped = glue_data.plan(list(glue.TASKS), str(hub_copy), online=False)
  assert sources == {n: "copy" for n in COPIED} and set(skipped) == {"qqp", "mnli"}
  with pytest.raises(UserError, match="^--strict: 1 GLUE task\\(s\\) have no data: mnli; put a copy"):
    glue_data.checked_plan(["cola", "mnli"], str(hub_copy), strict=True, online=False)
  for name in ("rte", "qnli", "stsb"):
    ours = glue_data.from_local_copy(glue.TASKS[name], str(hub_copy))
    theirs = eval_tasks.READERS[COPIED[name][0]](epath.Path(str(shared_data)))
    for hub_split, split in COPIED[name][1].items():
      assert ours.splits[hub_split].texts == theirs.splits[split].texts
      assert ours.splits[hub_split].pairs == theirs.splits[split].pairs
      np.testing.assert_array_equal(ours.splits[hub_split].labels, theirs.splits[split].labels)
  assert glue_data.from_local_copy(glue.TASKS["qnli"], str(hub_copy)).scored == ()  # Dev only: cross-validation.
  (hub_copy / "rte" / "validation-00000-of-00001.parquet").rename(hub_copy / "rte.bak")
  try:
    with pytest.raises(UserError, match="rte/validation-\\*.parquet is missing"):
      glue_data.from_local_copy(glue.TASKS["rte"], str(hub_copy))
  finally:
    (hub_copy / "rte.bak").rename(hub_copy / "rte" / "validation-00000-of-00001.parquet")


def test_labels_outside_the_classes_are_refused(tmp_path, shared_data):
  write_hub_copy(shared_data, tmp_path / "copy", ("rte",), label_of=lambda y: np.where(np.arange(len(y)) == 3, -1, y))
  with pytest.raises(UserError, match="rte train has label -1 outside the task's classes \\(0..1\\)"):
    glue_data.from_local_copy(glue.TASKS["rte"], str(tmp_path / "copy"))


def _fill_datasets_cache(copy, cache, config) -> None:
  """The datasets cache as an online load_dataset("nyu-mll/glue", config) leaves it, made offline: datasets'
  own parquet builder prepares the copy's files, renamed as a Hub load names them (<cache>/nyu-mll___glue/
  <config>/0.0.0/<hash>/glue-<split>.arrow, dataset_info.json naming the config)."""
  import datasets

  files = {s: str(copy / config / f"{s}-00000-of-00001.parquet") for s in ("train", "validation")}
  datasets.load_dataset("parquet", data_files=files, cache_dir=str(cache / "build"))
  src = next((cache / "build").rglob("dataset_info.json")).parent
  dst = cache / "nyu-mll___glue" / config / "0.0.0" / glue.HUB_REVISION
  dst.mkdir(parents=True)
  for f in src.iterdir():
    (dst / f.name.replace("parquet-", "glue-")).write_bytes(f.read_bytes())
  info = json.loads((dst / "dataset_info.json").read_text())
  (dst / "dataset_info.json"
  ).write_text(json.dumps({**info, "config_name": config, "dataset_name": "glue", "builder_name": "glue"}))


def test_offline_from_the_datasets_cache(hub_copy, tmp_path):
  """HF_DATASETS_OFFLINE with the config in the datasets cache: planned as "hub" and read by the real
  load_dataset("nyu-mll/glue", config, revision=...) call (datasets falls back to its cache)."""
  _fill_datasets_cache(hub_copy, tmp_path / "cache", "rte")
  code = ("from crossbert_jax.evaluation import glue, glue_data; print(glue_data.plan(['rte', 'cola'], '')); "
          "t = glue_data.from_hub(glue.TASKS['rte']); print(len(t.splits['train']), len(t.splits['validation']))")
  proc = subprocess.run([sys.executable, "-c", code], env=cpu_env(**OFFLINE, HF_DATASETS_CACHE=str(tmp_path / "cache")),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines() == [
      "({'rte': 'hub'}, {'cola': 'no data in --data_dir, Hub unreachable and not in the datasets cache'})",
      "2490 277"], proc.stdout


def test_a_damaged_parquet_file_is_one_line(tmp_path, shared_data):
  write_hub_copy(shared_data, tmp_path / "copy", ("rte",))
  (tmp_path / "copy" / "rte" / "train-00000-of-00001.parquet").write_bytes(b"not parquet")
  with pytest.raises(
      UserError, match="rte/train-00000-of-00001.parquet is not a readable parquet file .*; copy it again from "
      "nyu-mll/glue$"):
    glue_data.from_local_copy(glue.TASKS["rte"], str(tmp_path / "copy"))


def test_scores_equal_todays_tasks_path(run_copy, hub_copy, shared_data):
  """Seed 0 of the GLUE runner on the copy == today's evaluate_task on the shared files (same process)."""
  from crossbert_jax.data import tokenizer
  from crossbert_jax.evaluation import embedder, runner
  from crossbert_jax.model.encoder import EncoderSpec
  from crossbert_jax.run import load

  config, params, _ = load.load_run(str(run_copy))
  emb = embedder.JaxEmbedder(EncoderSpec.from_config(config.model), params["encoder"],
                             tokenizer.Tokenizer.load(config.data.tokenizer), embedder.Options(max_length=64))
  for name, metric in (("cola", "matthews"), ("rte", "accuracy")):
    task = glue_data.from_local_copy(glue.TASKS[name], str(hub_copy))
    task.splits = {s: v.subset(300, 0) for s, v in task.splits.items()}
    ours = glue_run.run_task(emb, task, glue.TASKS[name], seeds=2, cache_dir=None)["rows"][name]
    today = runner.evaluate_task(emb, eval_tasks.load_task(name, str(shared_data)), max_examples=300)["scores"]
    for probe in ("linear", "knn"):
      assert ours[probe][metric][0] == today[f"{probe}/dev/{metric}"], (name, probe)


def _glue_cli(run_dir, data_dir, out, *flags, wait=True, check=True):
  args = [
      "crossbert_jax.evaluate", "--benchmark=glue", f"--workdir={run_dir}", f"--data_dir={data_dir}", "--max_length=64",
      "--noprogress", f"--output_dir={out}", *flags]
  return run_module(args, env=cpu_env(**OFFLINE, HF_DATASETS_CACHE=str(out) + "-hf"), wait=wait, check=check)


def test_cli_table_skips_and_the_model_card_record(run_copy, hub_copy, tmp_path):
  out = tmp_path / "glue"
  proc = _glue_cli(run_copy, hub_copy, out, "--tasks=cola,mnli", "--max_examples=200", "--probe_seeds=2")
  skipped = [l for l in proc.stdout.splitlines() if l.startswith("skipping ")]
  assert len(skipped) == 1 and skipped[0].endswith(": mnli"), proc.stdout[-2000:]
  assert "[1/1] cola: linear " in proc.stdout and " texts, " in proc.stdout
  table = json.loads((out / "glue_table.json").read_text())
  assert table["columns"] == ["run@5"] and table["skipped"] == {"mnli": table["skipped"]["mnli"]}
  cola = table["rows"]["cola"]["scores"]["run@5"]["linear"]
  assert len(json.loads(next(out.glob("tasks/*/*/cola.json")).read_text())["rows"]["cola"]["linear"]["matthews"]) == 2
  assert table["average"]["run@5"]["linear"]["glue"] is None
  assert table["average"]["run@5"]["linear"]["rows_run"] == 1
  assert (run_copy / "glue_table.md").read_text() == (out / "glue_table.md").read_text()  # One column: the same.
  record = json.loads((run_copy / "eval_results.json").read_text())
  assert record["scores"]["glue/cola/linear"] == pytest.approx(cola["mean"] / 100, abs=1e-6)
  from crossbert_jax.hf import files  # The export's model card shows the record as a table.

  record = files.run_summary(epath.Path(str(run_copy)), config=None, step=5)["results"]
  card = "\n".join(files._evaluation_table(record, 5))  # pylint: disable=protected-access
  assert f"| glue/cola/linear | {cola['mean']:.1f} |" in card and "| glue/mean_of_1_rows/knn |" in card


def test_cli_unknown_benchmark_is_one_line(tmp_path):
  """Refused before any model is read (an unknown --tasks name goes the same way: parse_tasks above)."""
  proc = _glue_cli(tmp_path, tmp_path, tmp_path / "out", "--benchmark=superglue", check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      "error: --benchmark='superglue': evaluate runs only glue (frozen GLUE); MTEB benchmarks run with python -m "
      "crossbert_jax.mteb_eval --benchmark=..."], proc.stderr[-2000:]


def test_cli_copy_with_a_missing_split_is_one_line(run_copy, tmp_path, shared_data):
  write_hub_copy(shared_data, tmp_path / "copy", ("rte",))
  (tmp_path / "copy" / "rte" / "validation-00000-of-00001.parquet").unlink()
  proc = _glue_cli(run_copy, tmp_path / "copy", tmp_path / "out", "--tasks=rte", check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: --data_dir {tmp_path / 'copy'}: rte/validation-*.parquet is missing (the reported split); copy it "
      "from nyu-mll/glue (hf download nyu-mll/glue --repo-type=dataset) or remove rte/"], proc.stderr[-2000:]


@pytest.mark.slow  # Three runs: three tasks, two (killed during the third), one.
def test_killed_during_the_third_task_resumes_to_the_same_table(run_copy, hub_copy, tmp_path):
  """SIGKILL during the third task; the rerun loads the first two and runs the third, to the same table as an
  uninterrupted run, byte for byte. 300 examples a split (1,500 before): the resume does not depend on the
  size, and MRPC's 300 train pairs still take seconds to embed and probe, far longer than the kill takes to land
  after the "[2/3]" line (a late kill fails the mrpc.json check, it cannot pass silently)."""
  flags = ("--tasks=cola,sst2,mrpc", "--max_examples=300", "--nocache")
  whole = tmp_path / "whole"
  _glue_cli(run_copy, hub_copy, whole, *flags)
  killed = tmp_path / "killed"
  proc = _glue_cli(run_copy, hub_copy, killed, *flags, wait=False)
  for line in proc.stdout:
    if line.startswith("[2/3] sst2"):
      proc.send_signal(signal.SIGKILL)
      break
  assert proc.wait(timeout=600) == -signal.SIGKILL
  assert not (killed / "glue_table.json").exists() and not list(killed.glob("tasks/*/*/mrpc.json"))
  resumed = _glue_cli(run_copy, hub_copy, killed, *flags)
  assert "[1/3] cola: linear " in resumed.stdout and resumed.stdout.count("(cached, ") == 2, resumed.stdout
  assert " texts, " in resumed.stdout.split("[3/3] mrpc")[1].splitlines()[0]
  for name in ("glue_table.json", "glue_table.md"):
    assert (killed / name).read_bytes() == (whole / name).read_bytes()

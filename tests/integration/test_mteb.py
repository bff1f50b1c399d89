"""mteb_eval end to end, offline: a benchmark by name on the tasks with local data, mteb's results layout
(read back by mteb.ResultCache), the local STS layout against the direct loader, and kill/resume."""

import hashlib
import json
import signal
import subprocess
import sys

import pytest

from tests.helpers import ROOT, cpu_env, run_command, run_module

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def run_dir(tiny_run):
  """A tiny CrossBERT run, 5 steps (conftest.py)."""
  return tiny_run


@pytest.fixture(scope="module")
def local_data(tmp_path_factory, shared_data):
  """The shared STS Benchmark and SciFact in mteb_eval's local layout, made by the converter script."""
  out = tmp_path_factory.mktemp("mteb_data")
  proc = subprocess.run([sys.executable, "tools/mteb_local_data.py", f"--data_dir={shared_data}", f"--out={out}"],
                        cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(p.name for p in out.iterdir()) == ["STSBenchmark", "SciFact"]
  return out


@pytest.fixture(scope="module")
def small_data(local_data, tmp_path_factory):
  """`local_data` cut down for the commands' runs, whose checks hold at any size: STSBenchmark's first 200 pairs
  (of 1,379), SciFact's corpus cut to the documents its qrels name plus the first 300 (566 of 5,183; every query
  keeps its relevant documents). An mteb_eval run of both tasks then embeds 1,266 texts instead of 8,241."""
  out = tmp_path_factory.mktemp("mteb_small")
  (out / "STSBenchmark").mkdir()
  sts = (local_data / "STSBenchmark" / "test.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
  (out / "STSBenchmark" / "test.tsv").write_text("".join(sts[:201]), encoding="utf-8")  # The header and 200 pairs.
  src, dst = local_data / "SciFact", out / "SciFact"
  (dst / "qrels").mkdir(parents=True)
  for name in ("queries.jsonl", "qrels/test.tsv"):
    (dst / name).write_bytes((src / name).read_bytes())
  relevant = {line.split("\t")[1] for line in (src / "qrels" / "test.tsv").read_text().splitlines()[1:]}
  corpus = (src / "corpus.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
  kept = [line for i, line in enumerate(corpus) if i < 300 or json.loads(line)["_id"] in relevant]
  assert len(kept) == 566, len(kept)
  (dst / "corpus.jsonl").write_text("".join(kept), encoding="utf-8")
  return out


def _args(run_dir, data, out, *flags):
  return [f"--workdir={run_dir}", f"--data_dir={data}", "--max_length=64", f"--output_dir={out}", *flags]


def _mteb_eval(run_dir, local_data, out, *flags, wait=True, check=True):
  """The command as a subprocess (its smoke test, and where a kill is the point)."""
  return run_module(["crossbert_jax.mteb_eval", *_args(run_dir, local_data, out, *flags)], env=cpu_env(**OFFLINE),
                    wait=wait, check=check)


def _in_process(run_dir, local_data, out, *flags, check=False):
  """The command in this process (tests/helpers.py's run_command): refusals, and commands reading earlier results."""
  return run_command("crossbert_jax.mteb_eval", *_args(run_dir, local_data, out, *flags), env=OFFLINE, check=check)


def test_benchmark_offline_layout_and_result_cache(run_dir, small_data, tmp_path):
  """MTEB(eng, v2) offline: STSBenchmark runs from the local layout, the other 40 are named in one line
  and skipped; mteb.ResultCache reads the written folder back with the table's scores. The command's one
  subprocess smoke test (on `small_data`: the layout and the read-back do not depend on the data's size);
  --strict's refusal runs in process."""
  import mteb

  out = tmp_path / "mteb"
  proc = _mteb_eval(run_dir, small_data, out, "--benchmark=MTEB(eng, v2)")
  skipped = [l for l in proc.stdout.splitlines() if l.startswith("skipping ")]
  assert len(skipped) == 1 and skipped[0].startswith("skipping 40 task(s)"), proc.stdout[-2000:]
  assert "STSBenchmark" not in skipped[0] and "ArguAna" in skipped[0]
  assert "Traceback" not in proc.stderr
  table = json.loads((out / "mteb_table.json").read_text())
  assert len(table["tasks"]) == 41 and table["Mean (Task)"] == {"run@5": None}  # 40 tasks not run: no mean.
  ours = table["tasks"]["STSBenchmark"]["run@5"]
  revision = f"step5-{hashlib.sha256(f'{run_dir.resolve()}@5'.encode()).hexdigest()[:8]}"  # The run's identity.
  folder = out / "results" / "crossbert_jax__run" / revision
  assert sorted(p.name for p in folder.iterdir()) >= ["STSBenchmark.json", "model_meta.json"]
  results = mteb.ResultCache(out).load_results(models=["crossbert_jax/run"], tasks=["STSBenchmark"])
  (model,) = results.model_results
  assert model.model_revision == revision
  assert abs(100 * model.task_results[0].get_score() - ours) < 1e-9
  assert "| STSBenchmark | STS |" in (out / "mteb_table.md").read_text()

  proc = _in_process(run_dir, small_data, tmp_path / "strict", "--benchmark=MTEB(eng, v2)", "--strict")
  assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --strict: 40 task(s)"), proc.stderr[-2000:]
  assert not (tmp_path / "strict").exists()


def test_local_sts_layout_matches_direct_loader(run_dir, local_data, shared_data):
  """STS Benchmark through the converter + the general loader scores as the shared csv filled directly."""
  import datasets
  import mteb
  from etils import epath

  from crossbert_jax.evaluation import embedder, mteb as mteb_lib, mteb_data, tasks as eval_tasks
  from crossbert_jax.model.encoder import EncoderSpec
  from crossbert_jax.run import load
  from crossbert_jax.data import tokenizer

  config, params, _ = load.load_run(str(run_dir))
  emb = embedder.JaxEmbedder(EncoderSpec.from_config(config.model), params["encoder"],
                             tokenizer.Tokenizer.load(config.data.tokenizer), embedder.Options(max_length=64))
  direct = mteb.get_task("STSBenchmark")
  test = eval_tasks.read_sts_benchmark(epath.Path(str(shared_data)), "test")
  direct.dataset = datasets.DatasetDict({
      "test": datasets.Dataset.
              from_dict({"sentence1": test.texts, "sentence2": test.pairs, "score": [float(x) for x in test.labels]})})
  direct.data_loaded = True
  local = mteb_data.fill_local(mteb.get_task("STSBenchmark"), str(local_data))
  encoder = mteb_lib.MtebEncoder(emb)
  a, b = (mteb.evaluate(encoder, t, cache=None).task_results[0].get_score() for t in (direct, local))
  assert abs(a - b) < 1e-6, (a, b)
  scifact = mteb_data.fill_local(mteb.get_task("SciFact"), str(local_data)).dataset["default"]["test"]
  assert (len(scifact["corpus"]), len(scifact["queries"]), len(scifact["relevant_docs"])) == (5183, 300, 300)


def _tamper(out) -> list:
  """Sets every main_score saved in `out`'s results to 0.123456 (what a cached result's table cell would then show);
  returns the result files."""
  files = sorted(out.glob("results/crossbert_jax__run/*/*.json"))
  files = [f for f in files if f.name != "model_meta.json"]
  for f in files:
    result = json.loads(f.read_text())
    for split in result["scores"].values():
      for row in split:
        row["main_score"] = 0.123456
    f.write_text(json.dumps(result))
  return files


@pytest.mark.slow  # Three runs of two tasks (on `small_data`), one killed.
def test_killed_during_second_task_resumes_to_the_same_table(run_dir, small_data, tmp_path):
  """SIGKILL while the second task runs; the rerun loads the first, runs the second, writes the same
  table as an uninterrupted run; --force redoes both.

  The uninterrupted run is the --force run: both tasks embedded and scored in one process (no "(cached", each
  line counts its documents), over saved results first tampered with (every main_score 0.123456, which a
  table built from them would show): its table equals the resumed one byte for byte only if both tasks were
  recomputed and the resume was right. (Before, a separate uninterrupted run into a fresh folder was the
  reference: a fourth run of both tasks.) On `small_data` SciFact takes seconds, still far longer than the
  kill takes to land after the "[1/2]" line (a late kill fails the table check, it cannot pass silently)."""
  import mteb

  tasks = "--tasks=STSBenchmark,SciFact"
  killed = tmp_path / "killed"
  proc = _mteb_eval(run_dir, small_data, killed, tasks, wait=False)
  for line in proc.stdout:
    if line.startswith("[1/2] STSBenchmark"):
      proc.send_signal(signal.SIGKILL)
      break
  assert proc.wait(timeout=600) == -signal.SIGKILL
  assert not (killed / "mteb_table.json").exists()
  resumed = _mteb_eval(run_dir, small_data, killed, tasks)
  assert "[1/2] STSBenchmark" in resumed.stdout and "(cached" in resumed.stdout
  assert "[2/2] SciFact" in resumed.stdout and " docs, " in resumed.stdout.split("[2/2] SciFact")[1].splitlines()[0]
  tables = {name: (killed / name).read_bytes() for name in ("mteb_table.json", "mteb_table.md")}

  files = _tamper(killed)
  assert sorted(f.stem for f in files) == ["STSBenchmark", "SciFact"]
  (model,) = mteb.ResultCache(killed).load_results(models=["crossbert_jax/run"]).model_results
  assert {r.task_name: r.get_score() for r in model.task_results} == {"STSBenchmark": 0.123456, "SciFact": 0.123456}
  forced = _mteb_eval(run_dir, small_data, killed, tasks, "--force")
  assert "(cached" not in forced.stdout, forced.stdout[-2000:]
  for task in ("[1/2] STSBenchmark", "[2/2] SciFact"):
    assert " docs, " in forced.stdout.split(task)[1].splitlines()[0], forced.stdout[-2000:]
  for name, table in tables.items():
    assert (killed / name).read_bytes() == table, name


def test_runs_with_the_same_folder_name_get_their_own_results(run_dir, small_data, tmp_path):
  """A second run whose folder has the same name, scored into an --output_dir holding the first's results:
  it is embedded and scored (not served the first's result), kept apart in results/, its own column. Both
  commands run in process (the second reads the first's results; no float is compared between them)."""
  import shutil

  other = tmp_path / "elsewhere" / run_dir.name
  shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("eval_cache"))
  out = tmp_path / "mteb"
  _in_process(run_dir, small_data, out, "--tasks=STSBenchmark", check=True)
  proc = _in_process(run_dir, small_data, out, "--tasks=STSBenchmark", f"--workdir={other}", check=True)
  first, second = [l for l in proc.stdout.splitlines() if l.startswith("[1/1] STSBenchmark")]
  assert "(cached" in first and " docs, " in second, proc.stdout[-2000:]
  table = json.loads((out / "mteb_table.json").read_text())
  assert list(table["Mean (Task)"]) == ["run@5", f"run@5 ({other})"]
  revisions = sorted(p.name for p in (out / "results" / "crossbert_jax__run").iterdir())
  assert len(revisions) == 2 and all(r.startswith("step5-") for r in revisions), revisions


def test_a_model_given_twice_is_refused_before_loading(run_dir, local_data, tmp_path):
  """The same run twice (two spellings of one path) would be two identical columns: one line, exit 2."""
  out = tmp_path / "twice"
  proc = _in_process(run_dir, local_data, out, "--tasks=STSBenchmark", f"--workdir={run_dir}/.")
  assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
  assert proc.stderr.startswith(f"error: --workdir={run_dir}/. is --workdir={run_dir} again"), proc.stderr
  assert not out.exists()


def test_a_tokenizer_that_is_not_the_runs_is_refused(run_dir, local_data, shared_data, tmp_path):
  """--tokenizer must be the one the run was trained with (its sha256 is in the checkpoint), as on resume: a larger
  one would embed as NaN (sklearn's traceback), a same-size one would score something else. One line, exit 2."""
  from crossbert_jax.data import corpus, tokenizer

  larger, same_size = tmp_path / "larger.model", tmp_path / "same_size.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:1000], 600, larger)
  tokenizer.train_tokenizer(corpus.builtin_documents()[1000:3000], 512, same_size)
  cases = [([
      "crossbert_jax.mteb_eval", f"--workdir={run_dir}", f"--tokenizer={larger}", "--tasks=STSBenchmark",
      f"--data_dir={local_data}", f"--output_dir={tmp_path / 'mteb'}"], larger),
           ([
               "crossbert_jax.evaluate", f"--workdir={run_dir}", f"--tokenizer={same_size}", "--tasks=stsb",
               f"--data_dir={shared_data}", "--max_examples=50", "--nocache"], same_size),
           ([
               "crossbert_jax.pooler", f"--workdir={run_dir}", f"--tokenizer={same_size}",
               f"--pairs={shared_data}/senteval/downstream/SNLI", f"--output={tmp_path / 'pooler'}"], same_size)]
  for args, given in cases:  # In process (run_command): each is refused before any work.
    proc = run_command(*args, env=OFFLINE)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: --workdir {run_dir} (step 5) was trained with the tokenizer "), proc.stderr
    assert f"--tokenizer={given} differs" in proc.stderr, proc.stderr
  assert not (tmp_path / "pooler").exists() and not (tmp_path / "mteb").exists()


def test_output_dir_in_an_input_or_a_run_is_refused_and_a_failed_start_leaves_no_folder(run_dir, local_data, tmp_path):
  """--output_dir may not be, contain or sit inside an input (--workdir, --data_dir) nor hold or sit inside a
  training run, as export's and pooler's outputs: one line, exit 2, nothing made. A start that fails later (a
  --layers the encoder lacks, found at the first batch) takes back the folders it made. In process (run_command)."""
  other_run = tmp_path / "other_run"
  (other_run / "checkpoints").mkdir(parents=True)
  cases = {
      run_dir / "mteb": f"is inside --workdir {run_dir}", run_dir / "checkpoints" / "mteb": "is inside --workdir",
      local_data: f"is --data_dir {local_data}", other_run: "holds training checkpoints",
      other_run / "checkpoints" / "mteb": f"is inside {other_run}, which holds training checkpoints",
      run_dir.parent: f"contains --workdir {run_dir}"}
  for out, expected in cases.items():
    made = not out.exists()
    proc = _in_process(run_dir, local_data, out, "--tasks=STSBenchmark")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: --output_dir {out} ") and expected in proc.stderr, proc.stderr
    assert not (made and out.exists())
  out = tmp_path / "new" / "mteb"
  proc = _in_process(run_dir, local_data, out, "--tasks=STSBenchmark", "--layers=9")
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr[-2000:]
  assert proc.stderr.startswith("error: --layers: 9 is out of range") and not (tmp_path / "new").exists()

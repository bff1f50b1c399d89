"""Reliability of the commands other than train: outputs that never delete inputs or runs, bad
inputs refused before slow work, one `error:` line and exit 2 instead of tracebacks.

pooler, export import, report, compile, train (probe inputs), mteb_eval, evaluate --task_file and bench
run in-process through their real mains and flag parsing (tests/helpers.py's `run_main`; one bench
case as a subprocess); the output-folder rules they share (`core.outputs`) and the readers are also
tested directly.
"""

import hashlib
import json
import pathlib

import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import generic, runner
from crossbert_jax.evaluation import pooler as pooler_lib
from crossbert_jax.hf import convert
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import spec as spec_lib
from tests.helpers import run_module
from tests.integration.test_scaling_sweep import TINY_SPEC

VOCAB = 512


def _digest(folder: pathlib.Path) -> dict[str, str]:
  return {
      str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
      for p in sorted(folder.rglob("*"))
      if p.is_file()}


def _run_all(cases: dict[str, list[str]], *, smoke: str | None = None, **env) -> dict:
  """Runs each command in this process, as its CLI would (tests/helpers.py's `run_command`); `smoke`
  names the one case run as a real `python -m` subprocess (the command's smoke test).
  {name: (returncode, stdout, stderr)}."""
  from tests.helpers import cpu_env, run_command  # pylint: disable=g-import-not-at-top

  env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env}
  results = {}
  for name, args in cases.items():
    if name == smoke:
      p = run_module(args, env=cpu_env(**env), check=False)
    else:
      p = run_command(*args, env=env)
    results[name] = (p.returncode, p.stdout, p.stderr)
  return results


def _one_error_line(result, *needles: str) -> str:
  code, _, err = result
  lines = [l for l in err.splitlines() if l.startswith("error:")]
  assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  return lines[0]


@pytest.fixture(scope="module", autouse=True)
def _bert_run_started(tiny_bert_run):
  """The session's tiny flat-BERT run (conftest's tiny_bert_run), started at module set-up so its
  compile overlaps the in-process tests."""
  return tiny_bert_run


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, spm_model) -> pathlib.Path:
  """An HF export of a random tiny encoder (the `export` writer, no training)."""
  from crossbert_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  from tests.integration.test_export import _config, _params  # pylint: disable=g-import-not-at-top

  c = _config()
  out = tmp_path_factory.mktemp("hf") / "model"
  convert.export(c, _params(c), tokenizer.Tokenizer.load(spm_model), out)
  return out


# ----------------------------------------------------------------------------- output folders


def test_output_folder_rules(tmp_path):
  """No output is, contains or sits inside an input or a run; a file is never replaced."""
  run = tmp_path / "run"
  (run / "checkpoints" / "2").mkdir(parents=True)
  src = tmp_path / "src"
  src.mkdir()
  (src / "model.safetensors").write_text("weights")
  refused = [
      ((run, True), {}, "holds training checkpoints"),
      ((tmp_path, True), {}, "holds training checkpoints"),  # Above a run.
      ((run / "pooler", True), {}, "which holds training checkpoints"),
      ((run / "checkpoints" / "x", True), {"inside_run_ok": True}, "which holds training checkpoints"),
      ((src, True), {"inputs": {"--hf": src}}, f"is --hf {src}"),
      ((src / "sub", True), {"inputs": {"--hf": src}}, "is inside --hf"),
      ((tmp_path / "other", True), {"inputs": {"--hf": tmp_path / "other" / "m"}}, "contains --hf"),
      ((src, False), {}, "not empty: choose a new folder or pass --force"),
      ((src / "model.safetensors", True), {}, "is a file, not a folder"),
      ((src / "model.safetensors" / "x", True), {}, "is a file, so no folder can be made below it")]
  for args, kwargs, message in refused:
    with pytest.raises(UserError, match=message):
      outputs.check_output_dir(*args, **kwargs)
  outputs.check_output_dir(run / "pooler", True, inside_run_ok=True)  # The pooler's default place.
  outputs.check_output_dir(src / "pooler", True, inputs={"--hf": src}, may_sit_inside=("--hf",))
  outputs.check_output_dir(src, True)  # Plain user data: --force may replace it.
  assert _digest(run) == {} and (src / "model.safetensors").read_text() == "weights"

  with pytest.raises(RuntimeError):  # A failed writer leaves the old folder as it was.
    with outputs.staged_output_dir(src, True) as tmp:
      (tmp / "half").write_text("x")
      raise RuntimeError("killed")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "src"] and (src / "model.safetensors").exists()
  with outputs.staged_output_dir(src, True) as tmp:
    (tmp / "new").write_text("y")
  assert sorted(p.name for p in src.iterdir()) == ["new"]


def test_staged_files_keep_other_files_and_need_force(tmp_path):
  """`report.md` is replaced only with --force; files of the user's own in the folder stay."""
  out = tmp_path / "results"
  out.mkdir()
  (out / "summary.md").write_text("hand-written")
  for force in (False, True):
    with outputs.staged_files(out, force, marker="report.md") as tmp:
      (tmp / "report.md").write_text(f"report {force}")
      (tmp / "plot.png").write_text("png")
  with pytest.raises(UserError, match="already holds report.md: pass --force"):
    with outputs.staged_files(out, False, marker="report.md"):
      pass
  assert (out / "report.md").read_text() == "report True" and (out / "summary.md").read_text() == "hand-written"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


def test_output_file_is_probed_and_left_absent(tmp_path):
  """`compile --out` a folder or below a file is refused; a probed new file is not left behind."""
  with pytest.raises(UserError, match="is a folder: give a file path"):
    outputs.check_output_file(str(tmp_path), "--out")
  (tmp_path / "f").write_text("x")
  with pytest.raises(UserError, match="is a file, so nothing can be written below it"):
    outputs.check_output_file(str(tmp_path / "f" / "c.json"), "--out")
  outputs.check_output_file(str(tmp_path / "new" / "c.json"), "--out")
  assert not (tmp_path / "new" / "c.json").exists() and (tmp_path / "f").read_text() == "x"
  (tmp_path / "r.md").write_text("table")  # Without --force, an earlier file or its companion is refused.
  with pytest.raises(UserError, match=r"r\.md exists \(earlier results\).*--force"):
    outputs.check_output_file(str(tmp_path / "r.json"), "--output", force=False, companions=(".md",))
  outputs.check_output_file(str(tmp_path / "r.json"), "--output", force=True, companions=(".md",))
  assert (tmp_path / "r.md").read_text() == "table"


# ----------------------------------------------------------------------------- readers and options


def test_damaged_hf_folders_are_one_line(tmp_path, hf_folder):
  """`export import` of a garbage config.json or a truncated model.safetensors: UserError, one line."""
  import shutil  # pylint: disable=g-import-not-at-top

  garbage, truncated = tmp_path / "garbage", tmp_path / "truncated"
  for folder in (garbage, truncated):
    shutil.copytree(hf_folder, folder)
  (garbage / "config.json").write_text('{"model_type": "modernbert", "hidden_')
  data = (truncated / "model.safetensors").read_bytes()
  (truncated / "model.safetensors").write_bytes(data[:len(data) // 2])
  for folder, message in ((garbage, "config.json is not valid JSON"), (truncated, "truncated or damaged")):
    with pytest.raises(UserError, match=message) as e:
      convert.read_hf(folder)
    assert "\n" not in str(e.value)
  (garbage / "config.json").write_text('{"model_type": "modernbert"}')
  with pytest.raises(UserError, match="lacks 'num_hidden_layers'"):
    convert.read_hf(garbage)


def test_pooler_options_are_checked():
  """A batch of 0 (NaN pooler), a negative learning rate, 0 steps, a negative width."""
  for change, flag in (({"batch_size": 0}, "--batch_size=0"), ({"batch_size": 1}, "--batch_size=1"),
                       ({"learning_rate": -1e-3},
                        "--learning_rate=-0.001"), ({"steps": 0}, "--steps=0"), ({"steps": -5}, "--steps=-5"),
                       ({"out_dim": -3}, "--out_dim=-3"), ({"learning_rate": float("nan")}, "--learning_rate=nan")):
    with pytest.raises(UserError, match=flag):
      pooler_lib.TrainOptions(**change).check()
  pooler_lib.TrainOptions().check()


def test_task_file_names_and_hints(tmp_path):
  """`name: null` is no task "None"; a missing file or a folder says task file."""
  (tmp_path / "t.tsv").write_text("text\tlabel\na\t1\n")
  task_file = tmp_path / "tasks.json"
  task_file.write_text(json.dumps([{"name": None, "type": "classification", "train": "t.tsv"}]))
  with pytest.raises(UserError, match="name is None; give each task a non-empty string name"):
    generic.read_task_file(str(task_file))
  for path, what in ((tmp_path / "missing.json", "does not exist"), (tmp_path, "is a folder")):
    with pytest.raises(UserError, match=f"{what}: give a .json \\(or .yaml\\) task file"):
      generic.read_task_file(str(path))


def test_probe_inputs_are_checked_with_config_key_names(tmp_path, shared_data):
  """A bad eval.data_dir / eval.tasks is found before training, named as the config key."""
  c = config_lib.get_config("crossbert", "tiny")
  c.unlock()
  c.eval.every_steps = 2
  for data_dir, tasks, message in ((str(tmp_path / "none"), "sst2", "--config.eval.data_dir .* does not exist"),
                                   (str(tmp_path), "stsb", "--config.eval.data_dir .*glue/STS-B/train.tsv"),
                                   (str(shared_data), "sst2,nope", "--config.eval.tasks: unknown task 'nope'"),
                                   (str(shared_data), " , ", "names no task")):
    c.eval.data_dir, c.eval.tasks = data_dir, tasks
    with pytest.raises(UserError, match=message):
      runner.check_probe_inputs(c)
  c.eval.data_dir, c.eval.tasks = str(shared_data), "stsb"
  runner.check_probe_inputs(c)


def test_config_files_lacking_keys_are_one_line(tmp_path):
  """No `objective`, or a missing section, named; core/config.py, not config.py."""
  import ml_collections  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError, match="sets no `objective`.*crossbert_jax/core/config.py"):
    config_lib.from_flag(ml_collections.ConfigDict({"model": {"embed_dim": 8}}))
  c = config_lib.get_config("mlm", "tiny")
  c.unlock()
  del c["eval"]
  with pytest.raises(UserError, match="lacks config key eval:"):
    config_lib.from_flag(c)


# ----------------------------------------------------------------------------- the CLIs


def _sweep_root(root: pathlib.Path, rows: int, data: pathlib.Path) -> pathlib.Path:
  """A sweep root as the sweep writes it (plan.json, runs/*/metrics.jsonl) with `rows` logged steps."""
  spec_file = root.parent / f"{root.name}_spec.py"
  spec_file.write_text(TINY_SPEC.replace("FLOPS", "3e9").replace("DATA", repr(str(data))))
  spec = spec_lib.load_spec(str(spec_file))
  runs = plan_lib.plan(spec, str(root / "tokenizer.model"))
  root.mkdir(parents=True)
  plan_lib.save_plan(root, spec, runs)
  for r in runs:
    (root / "runs" / r.name).mkdir(parents=True)
    (root / "runs" / r.name / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 7.0 - 0.1 * s, "tokens_per_second": 1000.0}) + "\n" for s in range(1, rows + 1)))
  return root


def test_commands_refuse_bad_outputs_and_inputs_in_one_line(tmp_path, tiny_bert_run, hf_folder, shared_data):
  """Every case is one `error:` line, exit 2, and nothing is lost."""
  run = tiny_bert_run.finished()
  run_before, hf_before = _digest(run), _digest(hf_folder)
  snli = str(shared_data / "senteval/downstream/SNLI")
  pooler = [
      "crossbert_jax.pooler", f"--workdir={run}", f"--pairs={snli}", "--steps=5", "--max_length=16",
      f"--output={tmp_path / 'p'}"]
  root = _sweep_root(tmp_path / "sweep", 1, shared_data)  # Runs that logged one row each.
  good, damaged = (_sweep_root(tmp_path / name, 3, shared_data) for name in ("good", "damaged"))
  (damaged / "plan.json").write_text((damaged / "plan.json").read_text()[:200])
  report_out = tmp_path / "report"
  report_out.mkdir()
  (report_out / "report.md").write_text("the earlier report")
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  earlier = tmp_path / "eval" / "results.json"
  earlier.parent.mkdir()
  earlier.write_text("earlier results")
  evaluate = ["crossbert_jax.evaluate", f"--workdir={run}", f"--data_dir={shared_data}", "--tasks=stsb"]
  cases = {
      "evaluate_exists": [*evaluate, f"--output={earlier}"],
      "evaluate_md": [*evaluate, f"--output={tmp_path / 'eval' / 'results.md'}"],
      "pooler_export_run": [*pooler, f"--export={run}", "--force"],
      "pooler_output_run": [*pooler, f"--output={run}", "--force"],
      "pooler_batch": [*pooler, "--batch_size=0"],
      "import_into_itself": ["crossbert_jax.export", "import", f"--hf={hf_folder}", f"--output={hf_folder}", "--force"],
      "report_one_row": ["crossbert_jax.report", f"--root={root}", f"--output={tmp_path / 'one_row'}"],
      "report_exists": ["crossbert_jax.report", f"--root={good}", f"--output={report_out}"],
      "report_damaged": ["crossbert_jax.report", f"--root={damaged}", f"--output={tmp_path / 'r2'}"],
      "compile_out_dir": ["crossbert_jax.compile", "--config=configs/crossbert.py:tiny", f"--out={tmp_path}"],
      "train_eval_dir": [
          "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'w'}",
          "--config.eval.every_steps=1", f"--config.eval.data_dir={tmp_path}"],
      "train_workdir_file": ["crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={a_file}"],
      "train_workdir_below_file": [
          "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={a_file / 'sub'}"],
      "mteb_task": [
          "crossbert_jax.mteb_eval", f"--workdir={run}", "--tasks=NoSuchTask", f"--data_dir={shared_data}",
          f"--output_dir={tmp_path / 'mteb'}"],
      "mteb_output_file": [
          "crossbert_jax.mteb_eval", f"--workdir={run}", "--tasks=STSBenchmark", f"--data_dir={shared_data}",
          f"--output_dir={a_file}"],}
  results = _run_all(cases)
  _one_error_line(results["pooler_export_run"], f"--export {run} is --workdir {run}")
  _one_error_line(results["pooler_output_run"], f"--output {run} is --workdir {run}")
  _one_error_line(results["pooler_batch"], "--batch_size=0")
  _one_error_line(results["import_into_itself"], f"--output {hf_folder} is --hf {hf_folder}")
  code, out, err = results["report_one_row"]
  assert code == 0 and (tmp_path / "one_row" / "report.md").is_file(), err[-3000:]
  _one_error_line(results["report_exists"], "already holds report.md: pass --force")
  _one_error_line(results["report_damaged"], "plan.json", "is damaged")
  _one_error_line(results["compile_out_dir"], "is a folder: give a file path")
  # Refused before the checkpoint restore, as the mteb case below.
  assert results["evaluate_exists"][2].strip().splitlines(
  ) == [_one_error_line(results["evaluate_exists"], f"{earlier} exists (earlier results)", "--force")]
  _one_error_line(results["evaluate_md"], "ends in .md")
  _one_error_line(results["train_eval_dir"], "--config.eval.data_dir", "is missing")
  # Refused before the checkpoint restore: the error is the only line (no Orbax INFO chatter).
  assert results["mteb_task"][2].strip().splitlines() == [_one_error_line(results["mteb_task"], "NoSuchTask")]
  _one_error_line(results["mteb_output_file"], f"--output_dir {a_file} is a file")
  _one_error_line(results["train_workdir_file"], f"--workdir {a_file} is a file, not a folder")
  _one_error_line(results["train_workdir_below_file"], f"{a_file} is a file, so no folder can be made below it")
  assert a_file.read_text() == "x"
  assert _digest(run) == run_before and _digest(hf_folder) == hf_before
  assert (report_out / "report.md").read_text() == "the earlier report" and a_file.read_text() == "x"
  assert earlier.read_text() == "earlier results" and sorted(p.name for p in earlier.parent.iterdir()) == [
      "results.json"]
  assert not (tmp_path / "p").exists() and not (tmp_path / "w").exists() and not (tmp_path / "r2").exists()


def test_bench_checks_out_and_data_flags_before_any_work(tmp_path):
  """bench refuses a folder --out, an existing --out without --force, a negative --long_len and
  train-step flags with --data, in one line before timing anything (not after minutes, nor ignored)."""
  earlier = tmp_path / "earlier.json"
  earlier.write_text("earlier results")
  small = ["crossbert_jax.bench", "--config=configs/crossbert.py:tiny"]
  results = _run_all(
      {
          "dir": [*small, f"--out={tmp_path}"],
          "exists": [*small, f"--out={earlier}"],
          "below_file": [*small, f"--out={earlier}/x.json"],
          "long_len": [*small, "--long_len=-5", f"--out={tmp_path / 'long.json'}"],
          "data_steps": ["crossbert_jax.bench", "--data", "--steps=-1", f"--out={tmp_path / 'feed.json'}"],
          "data_config": [
              "crossbert_jax.bench", "--data", "--config=configs/crossbert.py:tiny", f"--out={tmp_path / 'feed.json'}"],
      }, smoke="dir")  # The bench command's subprocess smoke test.
  _one_error_line(results["dir"], "is a folder")
  _one_error_line(results["exists"], "exists (earlier results)", "--force")
  _one_error_line(results["below_file"], "is a file")
  _one_error_line(results["long_len"], "--long_len must be >= 0")
  _one_error_line(results["data_steps"], "--steps does nothing with --data")
  _one_error_line(results["data_config"], "--config does nothing with --data")
  assert earlier.read_text() == "earlier results" and not (tmp_path / "feed.json").exists()
  assert not (tmp_path / "long.json").exists()


def test_a_failed_train_start_leaves_no_empty_folders(tmp_path, spm_model):
  """A start that fails (here: an empty data file) removes the folders it made that hold no file
  (compilation_cache/, checkpoints/, a workdir it created); a workdir's own files stay."""
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  kept = tmp_path / "kept"
  kept.mkdir()
  (kept / "notes.txt").write_text("mine")
  train = [
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--config.data.tokenizer={spm_model}",
      f"--config.data.path={empty}", "--config.metrics.progress_bar=False"]
  results = _run_all({"new": [*train, f"--workdir={tmp_path / 'new'}"], "kept": [*train, f"--workdir={kept}"]})
  for name in ("new", "kept"):
    _one_error_line(results[name], "holds no documents")
  assert not (tmp_path / "new").exists()
  assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"] and (kept / "notes.txt").read_text() == "mine"

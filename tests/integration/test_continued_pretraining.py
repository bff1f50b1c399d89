"""Continued pretraining of an imported ModernBERT (a tiny one made here, ModernBERT-like special ids):
`export import`, `train --config=configs/*.py:from_hf`, a kill and resume, `export --verify`."""

import importlib.util
import json
import pathlib
import shutil
import signal
import time

import numpy as np
import pytest

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus, tokenizer
from tests import hf_models
from tests.helpers import ROOT, run_command, run_module

# The tiny model's numerics on CPU: float32, no remat; a short schedule.
RUN = [
    "--config.train.batch_size=4", "--config.data.seq_len=64", "--config.model.dtype=float32",
    "--config.model.remat=none", "--config.train.warmup_steps=2", "--config.train.steps=20",
    "--config.checkpoint.every_steps=10", "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False",
    "--config.checkpoint.async_save=False"]
# A train command run in process (tests/helpers.py's run_command) sees 8 fake CPU devices: a batch they divide.
IN_PROCESS = ["--config.train.batch_size=8"]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.", "[MASK] and [CLS] spelled in text, <|endoftext|> too.",
    "She ordered a café crème. 😀", "  leading spaces\tand tabs\n\nand blank lines  ", ""]


def _from_hf(path: str, variant: str = "from_hf"):
  """`path`:from_hf, loaded as config_flags loads a config file (by path)."""
  spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem + "_config", ROOT / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


@pytest.mark.parametrize("path", ["configs/crossbert.py", "configs/bert.py"])
def test_from_hf_cpu_is_from_hf_with_the_cpu_trial_run_settings(path):
  """The documented CPU trial: from_hf's pod settings (bf16, full remat, batch 256, warmup 3000) would
  learn nothing in its 100 steps; from_hf_cpu differs from from_hf in exactly core/config.CPU_TRIAL."""
  from crossbert_jax.core import config as config_lib

  pod, cpu = _from_hf(path).to_dict(), _from_hf(path, "from_hf_cpu").to_dict()
  changed = {f"{s}.{k}" for s in pod if isinstance(pod[s], dict) for k in pod[s] if pod[s][k] != cpu[s][k]}
  assert changed == set(config_lib.CPU_TRIAL)
  assert all(cpu[k.split(".")[0]][k.split(".")[1]] == v for k, v in config_lib.CPU_TRIAL.items())
  assert cpu["train"]["warmup_steps"] < cpu["train"]["steps"] and cpu["train"]["shape_from_init"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """(the ModernBertForMaskedLM folder, the `export import` folder made from it by the CLI, in process: export's
  subprocess smoke tests are in test_export.py)."""
  root = tmp_path_factory.mktemp("mb")
  hf = hf_models.tiny_modernbert(root / "hf")
  run_command("crossbert_jax.export", "import", f"--hf={hf}", f"--output={root / 'imp'}", check=True)
  return hf, root / "imp"


def test_from_hf_takes_the_imported_shape_and_tokenizer(imported):
  from crossbert_jax.hf import import_config  # pylint: disable=g-import-not-at-top

  hf, imp = imported
  assert sorted(p.name for p in imp.iterdir(
  )) == ["config.json", "params.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
  c = _from_hf("configs/bert.py")
  with c.unlocked():
    c.train.init_from = str(imp)
  r = import_config.resolve(c)
  assert (r.model.vocab_size, r.model.embed_dim, r.model.num_layers, r.model.num_heads, r.model.mlp_dim) == (640, 64, 3,
                                                                                                             4, 96)
  assert (r.model.global_every, r.model.local_window, r.model.rope_theta) == (2, 16, 160_000.0)
  assert r.data.tokenizer == str(imp)
  assert (r.reconstructor.embed_dim, r.reconstructor.num_heads, r.reconstructor.mlp_dim) == (64, 4, 96)
  with c.unlocked():
    c.reconstructor.embed_dim = 128  # Set apart from the encoder's width: kept.
  assert import_config.resolve(c).reconstructor.embed_dim == 128
  plan_lib.build(r)
  with c.unlocked():
    c.train.init_from, c.data.tokenizer = str(hf), "mine.model"
  with pytest.raises(UserError, match="is not one `export import` wrote"):
    import_config.resolve(c)  # The HF folder itself, not the import.
  with c.unlocked():
    c.train.init_from = ""
  with pytest.raises(UserError, match="train.init_from is empty"):
    import_config.resolve(c)


def test_bert_keeps_the_imported_mlm_head(imported):
  """BERT's state starts from the imported encoder and MLM head (transformers' weights, bitwise)."""
  import jax  # pylint: disable=g-import-not-at-top
  from crossbert_jax.hf import convert, import_config  # pylint: disable=g-import-not-at-top
  from crossbert_jax.run import warm_start  # pylint: disable=g-import-not-at-top
  from crossbert_jax.training import program, sharding  # pylint: disable=g-import-not-at-top

  _, imp = imported
  c = _from_hf("configs/bert.py")
  with c.unlocked():
    c.train.init_from, c.data.seq_len, c.model.dtype, c.model.remat = str(imp), 64, "float32", "none"
  c = import_config.resolve(c)
  train_program = program.TrainProgram(c, sharding.make_mesh(c.mesh))
  state = warm_start.from_imported(c, train_program.init_state(), tokenizer.Tokenizer.load(imp))
  _, want = convert.load_imported(imp)
  assert set(want) == {"encoder", "head"}
  for part in ("encoder", "head"):
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.params[part]), want[part])


def _wait_for_checkpoint(proc, workdir, step: int, timeout: float = 400) -> None:
  deadline = time.time() + timeout
  while not (workdir / "checkpoints" / str(step)).exists():
    assert proc.poll() is None, f"training exited early: {proc.stderr.read()[-2000:]}"
    assert time.time() < deadline, f"no step-{step} checkpoint in {timeout} s"
    time.sleep(0.05)


def _export_and_check(workdir, out, hf) -> dict:
  """`export --verify` of the run (in process: the command reads the finished run); the tokenizer gives the
  imported folder's ids; config.json its special ids."""
  import transformers  # pylint: disable=g-import-not-at-top

  proc = run_command("crossbert_jax.export", f"--workdir={workdir}", f"--output={out}", "--verify", check=True)
  assert "verified" in proc.stdout, proc.stdout
  ours, theirs = (transformers.AutoTokenizer.from_pretrained(str(p)) for p in (out, hf))
  assert ours(TEXTS)["input_ids"] == theirs(TEXTS)["input_ids"]
  assert ours(TEXTS[:2], TEXTS[2:4])["input_ids"] == theirs(TEXTS[:2], TEXTS[2:4])["input_ids"]
  config = json.loads((out / "config.json").read_text())
  want = json.loads((hf / "config.json").read_text())
  for key in ("pad_token_id", "cls_token_id", "sep_token_id", "vocab_size", "hidden_size", "layer_types"):
    assert config[key] == want[key], key
  return config


@pytest.mark.slow
def test_crossbert_continues_an_imported_modernbert_through_a_kill(imported, tmp_path):
  """20 CrossBERT steps from the import (SIGKILL after the step-5 checkpoint, then the same command
  resumes), exported and verified in transformers and sentence-transformers. A save every 5 steps (each
  synchronous) leaves the kill 15 steps and 3 saves before the end: with a save every 10 steps and a
  0.5 s poll, CI's loaded cores once saw the kill land after the step-20 save, so nothing was left to resume."""
  hf, imp = imported
  workdir = tmp_path / "run"
  cmd = [
      "crossbert_jax.train", "--config=configs/crossbert.py:from_hf", f"--workdir={workdir}",
      f"--config.train.init_from={imp}", *RUN, "--config.checkpoint.every_steps=5"]
  first = run_module(cmd, wait=False)
  try:
    _wait_for_checkpoint(first, workdir, 5)
  finally:
    first.send_signal(signal.SIGKILL)
    first.communicate()
  assert first.returncode == -signal.SIGKILL, "the first run must be killed mid-way"
  assert not (workdir / "checkpoints" / "20").exists(), "the first run saved its last step before the kill"
  proc = run_module(cmd)
  assert "done: step 20" in proc.stdout, proc.stdout
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert max(r.get("step", 0) for r in rows) == 20
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["data"]["tokenizer"] == str(imp) and saved["model"]["vocab_size"] == 640
  config = _export_and_check(workdir, tmp_path / "export", hf)
  assert config["architectures"] == ["ModernBertModel"]


def test_bert_continues_an_imported_modernbert(imported, tmp_path):
  """20 BERT steps from the import (its MLM head kept), exported as ModernBertForMaskedLM and verified."""
  hf, imp = imported
  workdir = tmp_path / "run"
  proc = run_module([
      "crossbert_jax.train", "--config=configs/bert.py:from_hf", f"--workdir={workdir}",
      f"--config.train.init_from={imp}", *RUN])
  assert "done: step 20" in proc.stdout, proc.stdout
  config = _export_and_check(workdir, tmp_path / "export", hf)
  assert config["architectures"] == ["ModernBertForMaskedLM"]
  # The evaluation embedder (packed rows padded with the tokenizer's [PAD]) agrees with transformers.
  from crossbert_jax.evaluation import embedder  # pylint: disable=g-import-not-at-top
  from crossbert_jax.evaluation import run_models  # pylint: disable=g-import-not-at-top
  from crossbert_jax.run import load  # pylint: disable=g-import-not-at-top
  texts = corpus.builtin_documents()[:40] + TEXTS
  ours, _ = run_models.jax_model(str(workdir), load.load_for_evaluation(str(workdir)), embedder.Options(),
                                 progress=False)
  theirs = embedder.HFEmbedder(str(tmp_path / "export"), embedder.Options())
  np.testing.assert_allclose(ours.embed(texts), theirs.embed(texts), atol=1e-4)


def _refused(proc, words: str) -> None:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr[-2000:]


def test_a_tokenizer_other_than_the_imports_is_refused(imported, tmp_path):
  """The import's embedding rows are its tokenizer's ids: a SentencePiece model in data.tokenizer is refused in one
  line before step 1 (nothing left in the workdir); an import without a tokenizer is checked by size."""
  from crossbert_jax.run import warm_start  # pylint: disable=g-import-not-at-top

  _, imp = imported
  spm = tokenizer.train_tokenizer(corpus.builtin_documents()[:60], 340, tmp_path / "spm.model", num_threads=1)
  workdir = tmp_path / "run"
  _refused(
      run_command("crossbert_jax.train", "--config=configs/crossbert.py:from_hf", f"--workdir={workdir}",
                  f"--config.train.init_from={imp}", f"--config.data.tokenizer={spm}", *RUN, *IN_PROCESS),
      f"config train.init_from={imp} was trained with the tokenizer {imp}")
  assert not workdir.exists()
  bare = tmp_path / "bare"  # An import of a folder without tokenizer files.
  bare.mkdir()
  for name in ("config.json", "params.safetensors"):
    (bare / name).write_bytes((imp / name).read_bytes())
  c = _from_hf("configs/crossbert.py")
  with c.unlocked():
    c.train.init_from, c.data.tokenizer = str(bare), str(spm)
  with pytest.raises(UserError, match="has 640 embedding rows but data.tokenizer=.* only 340 ids"):
    warm_start.check_tokenizer(c, tokenizer.Tokenizer.load(spm), 640)
  warm_start.check_tokenizer(c, tokenizer.Tokenizer.load(imp), 640)  # 620 ids, padded to 640: its own.


def test_bert_over_an_import_without_mlm_head_is_refused(tmp_path):
  """A ModernBertModel (no MLM head) imported for CrossBERT: BERT's from_hf refuses it in one line, as
  `export import --objective=mlm` does, instead of training a fresh head."""
  hf = hf_models.tiny_modernbert(tmp_path / "hf", with_head=False)
  imp = tmp_path / "imp"
  run_command("crossbert_jax.export", "import", f"--hf={hf}", f"--output={imp}", check=True)
  _refused(
      run_command("crossbert_jax.export", "import", f"--hf={hf}", f"--output={tmp_path / 'mlm'}", "--objective=mlm"),
      "holds no MLM head")
  workdir = tmp_path / "run"
  _refused(
      run_command("crossbert_jax.train", "--config=configs/bert.py:from_hf", f"--workdir={workdir}",
                  f"--config.train.init_from={imp}", *RUN, *IN_PROCESS), f"train.init_from={imp} holds no MLM head")
  assert not workdir.exists()


def test_a_fork_takes_its_sources_init_from_and_refuses_another(imported, tmp_path):
  """A fork that leaves train.init_from out takes its source's (config.json), hence the imported shape;
  given, it must be the source's checkpoint's (the params come from the checkpoint, not the import)."""
  from crossbert_jax.hf import import_config  # pylint: disable=g-import-not-at-top
  from crossbert_jax.run import fork  # pylint: disable=g-import-not-at-top

  _, imp = imported
  source = tmp_path / "source"
  source.mkdir()
  c = _from_hf("configs/crossbert.py")
  with c.unlocked():
    c.train.fork_from = f"{source}:4"
  with pytest.raises(
      UserError, match=r"config\.json is missing or unreadable, so the fork cannot take its source's "
      r"train\.init_from \(its shape\); pass the source's --config\.train\.init_from=IMP"):
    fork.with_source_init(c)
  (source / "config.json").write_text(json.dumps({"train": {"init_from": str(imp)}}))
  r = import_config.resolve(fork.with_source_init(c))
  assert r.train.init_from == str(imp) and r.model.vocab_size == 640 and r.data.tokenizer == str(imp)
  plan_lib.build(r)  # train.fork_from and train.init_from together.
  saved = {"train": {"init_from": str(imp)}}
  fork._check_init_from("key", str(source), saved, r)  # pylint: disable=protected-access
  with r.unlocked():
    r.train.init_from = str(tmp_path / "elsewhere")
  assert fork.with_source_init(r) is r
  with pytest.raises(
      UserError, match=f"the fork gives train.init_from={tmp_path}/elsewhere, but the source "
      f"started from train.init_from={imp}; a fork's params come from its source's checkpoint"):
    fork._check_init_from("key", str(source), saved, r)  # pylint: disable=protected-access


@pytest.mark.slow  # About 60 s on 2 idle cores (105 s under load): four short runs and a refusal in process.
def test_a_fork_of_a_from_hf_run_trains_on_from_the_sources_step(imported, tmp_path):
  """A from_hf run stopped at step 4, forked with its own command plus train.fork_from (train.init_from as
  the source had it, or left out), trains steps 5-6 as the source resumed does; another train.init_from is
  refused in one line, leaving no workdir."""
  from crossbert_jax.run import metrics  # pylint: disable=g-import-not-at-top

  _, imp = imported
  other = tmp_path / "imp_copy"
  shutil.copytree(imp, other)
  source = tmp_path / "source"
  train = [
      "crossbert_jax.train", "--config=configs/crossbert.py:from_hf", *RUN, "--config.train.steps=6",
      "--config.checkpoint.every_steps=2", "--config.metrics.log_every=1"]
  run_module([*train, f"--workdir={source}", f"--config.train.init_from={imp}", "--config.train.stop_at_step=4"])
  fork = f"--config.train.fork_from={source}"
  procs = {
      "given": [*train, f"--workdir={tmp_path / 'given'}", f"--config.train.init_from={imp}", fork],
      "left_out": [*train, f"--workdir={tmp_path / 'left_out'}", fork]}
  procs = {name: run_module(args, wait=False) for name, args in procs.items()}
  # The refused fork in process (run_command; a batch the 8 fake devices divide) while the two forks train.
  another = run_command(*train, f"--workdir={tmp_path / 'another'}", f"--config.train.init_from={other}", fork,
                        *IN_PROCESS)
  done = {name: (p.wait(timeout=600), *p.communicate()) for name, p in procs.items()}
  run_module([*train, f"--workdir={source}", f"--config.train.init_from={imp}"])  # The source resumed to step 6.

  rc, err = another.returncode, another.stderr
  assert rc == 2 and len(err.strip().splitlines()) == 1, err[-2000:]
  assert err.startswith(f"error: config train.fork_from={source}: the fork gives train.init_from={other}, but the "
                        f"source started from train.init_from={imp}; "), err
  assert not (tmp_path / "another").exists()
  resumed = {r["step"]: r for r in metrics.read_metrics(source)}
  for name in ("given", "left_out"):
    rc, _, err = done[name]
    assert rc == 0 and f"forked from {source} at step 4" in err, err[-2000:]
    rows = {r["step"]: r for r in metrics.read_metrics(tmp_path / name)}
    assert sorted(rows) == [5, 6], name
    for step in (5, 6):
      for key in ("loss", "learning_rate", "tokens_seen"):
        assert rows[step][key] == resumed[step][key], (name, step, key)
    saved = json.loads((tmp_path / name / "config.json").read_text())
    assert saved["train"]["init_from"] == str(imp) and saved["model"]["vocab_size"] == 640


def test_contrastive_stage_from_an_import(imported, tmp_path):
  """contrast.init_from=IMPORT: the run takes the import's shape and tokenizer and trains a few
  steps of supervised pairs (objective=contrast, docs/embedding.md)."""
  from crossbert_jax.run import load

  _, imp = imported
  data = tmp_path / "pairs.jsonl"
  data.write_text("".join(
      json.dumps({"anchor": t, "positive": t.upper()}) + "\n" for t in corpus.builtin_documents()[:16]))
  workdir = tmp_path / "emb"
  proc = run_command("crossbert_jax.contrast", "--config=configs/contrast.py:tiny_pairs", f"--workdir={workdir}",
                     f"--config.contrast.init_from={imp}", f"--config.data.path={data}",
                     "--config.contrast.hard_negatives=False", "--config.train.batch_size=8", "--config.train.steps=2",
                     "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False")
  assert proc.returncode == 0, proc.stderr[-2000:]
  saved = json.loads((workdir / "config.json").read_text())
  imported_model = json.loads((imp / "config.json").read_text())["model"]
  assert {k: saved["model"][k] for k in ("vocab_size", "embed_dim", "num_layers", "global_every")
         } == {k: imported_model[k] for k in ("vocab_size", "embed_dim", "num_layers", "global_every")}
  assert saved["data"]["tokenizer"] == str(imp) and saved["train"]["init_from"] == str(imp)
  config, params, step = load.load_run(workdir)
  assert step == 2 and set(params) == {"encoder"} and config.objective == "contrast"

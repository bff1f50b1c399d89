"""`python -m crossbert_jax.contrast` end to end on the session's tiny CrossBERT run: SNLI triplets from the
shared data, an exact in-process resume, the sentence-transformers export, evaluation reading the run,
SimCSE on the built-in corpus, GradCache's gradient through the objective, and each bad input's one line."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.data import contrast_feed, pairs, tokenizer as tokenizer_lib
from crossbert_jax.hf import import_config
from crossbert_jax.run import load, warm_start
from crossbert_jax.training import objectives, program as program_lib, sharding
from tests.helpers import cpu_env, run_module

TINY = [
    "--config.train.batch_size=16", "--config.metrics.log_every=1", "--config.metrics.progress_bar=False",
    "--config.metrics.tensorboard=False"]


@pytest.fixture(scope="module")
def snli(tmp_path_factory, shared_data):
  """SNLI dev's triplets (premise, entailment, contradiction of the same premise) as a jsonl file."""
  rows = pairs.nli_triplets(pairs.read_senteval_nli(shared_data / "senteval/downstream/SNLI", "dev"))
  path = tmp_path_factory.mktemp("snli") / "triplets.jsonl"
  path.write_text("".join(
      json.dumps({"anchor": p.anchor, "positive": p.positive, "negative": p.negative}) + "\n" for p in rows))
  return path


def _contrast(command, workdir, source, data, *flags, variant="tiny_pairs"):
  return command("crossbert_jax.contrast", f"--config=configs/contrast.py:{variant}", f"--workdir={workdir}",
                 f"--config.contrast.init_from={source}", f"--config.data.path={data}", *TINY, *flags)


def test_pairs_resume_exactly_export_and_evaluate(command, tiny_run, snli, shared_data, tmp_path):
  """4 steps straight equal 2 steps, stop, resume to 4 (params bitwise); the export loads in
  sentence-transformers with the run's pooling (CLS here) + Normalize; evaluate scores the run."""
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  steps = ["--config.train.steps=4", "--config.checkpoint.every_steps=2", "--config.contrast.pooling=cls"]
  proc = _contrast(command, straight, tiny_run, snli, *steps)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines()[-1].startswith("done: step 4, loss ")
  for stop in ("--config.train.stop_at_step=2", "--config.train.stop_at_step=0"):
    proc = _contrast(command, resumed, tiny_run, snli, *steps, stop)
    assert proc.returncode == 0, proc.stderr[-2000:]
  assert "contrast: resuming from step 2" in proc.stdout
  a, b = load.load_run(straight)[1], load.load_run(resumed)[1]
  assert jax.tree.all(jax.tree.map(lambda x, y: bool((np.asarray(x) == np.asarray(y)).all()), a, b))
  rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
  trained = [r for r in rows if "positive_cosine" in r]
  assert [r["step"] for r in trained] == [1, 2, 3, 4]
  assert all(-1 <= r["negative_cosine"] < r["positive_cosine"] <= 1 and r["temperature"] == pytest.approx(0.05)
             for r in trained)

  out = tmp_path / "hf"
  proc = command("crossbert_jax.export", f"--workdir={straight}", f"--output={out}", "--verify")
  assert proc.returncode == 0 and "verified" in proc.stdout, proc.stderr[-2000:]
  modules = [m["type"].rsplit(".", 1)[1] for m in json.loads((out / "modules.json").read_text())]
  assert modules == ["Transformer", "Pooling", "Normalize"]
  pooling = json.loads((out / "1_Pooling/config.json").read_text())
  assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]

  proc = command("crossbert_jax.evaluate", f"--workdir={straight}", f"--data_dir={shared_data}", "--tasks=stsb",
                 "--max_examples=200", "--nocache", "--noprogress")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "straight@4" in proc.stdout and "stsb" in proc.stdout


def test_warm_start_takes_the_source_encoder_and_cached_grads_match(tiny_run, snli, spm_model):
  """contrast.init_from=RUN: the fresh state's encoder is the run's newest checkpoint's, bitwise (its
  reconstructor dropped); GradCache's gradient (chunks of 8 texts) equals the plain one on that batch,
  a learnable temperature's included."""
  c = plan_lib.build(import_config.resolve(_config(tiny_run, snli, learn_temperature=True)))
  assert c.train.init_from == str(tiny_run) and c.data.tokenizer  # The run's shape and tokenizer.
  tok = tokenizer_lib.Tokenizer.load(c.data.tokenizer)
  program = program_lib.TrainProgram(c.phases[0].config, sharding.make_mesh(c.mesh), specials=tok.special_ids)
  state = warm_start.from_imported(c.phases[0].config, program.init_state(), tok)
  source = load.load_run(tiny_run)[1]
  assert set(state.params) == {"encoder", "log_temperature"}
  assert jax.tree.all(
      jax.tree.map(lambda x, y: bool((np.asarray(x) == np.asarray(y)).all()), state.params["encoder"],
                   source["encoder"]))

  batch = jax.tree.map(jax.numpy.asarray, next(contrast_feed.make_iterator(c, tok, batch_size=16, seed=0)))
  key = jax.random.key(0)
  plain = jax.jit(objectives.make_grad_fn(c))(state.params, batch, key)
  cached = jax.jit(objectives.make_grad_fn(plan_lib.with_keys(c, {"contrast.chunk_size": 8})))(state.params, batch, key)
  np.testing.assert_allclose(cached[0][0], plain[0][0], rtol=1e-6)
  for g, h in zip(jax.tree.leaves(cached[1]), jax.tree.leaves(plain[1])):
    np.testing.assert_allclose(g, h, atol=1e-5 * float(np.abs(h).max()) + 1e-12)
  assert float(np.abs(plain[1]["log_temperature"])) > 0

  # contrast.padding=batch: the same texts padded to the batch's length, not data.seq_len (256 here): the same
  # loss and gradients (padding is masked; float sums of another length only).
  wide = plan_lib.with_keys(c, {"data.seq_len": 256})
  full, short = (jax.tree.map(
      jax.numpy.asarray,
      next(
          contrast_feed.make_iterator(plan_lib.with_keys(wide, {"contrast.padding": padding}), tok, batch_size=16,
                                      seed=0))) for padding in ("max", "batch"))
  n = short["tokens"].shape[-1]
  assert full["tokens"].shape[-1] == 256 and n < 256 and int(full["segment_ids"].sum(-1).max()) > n // 2
  assert (short["tokens"] == full["tokens"][..., :n]).all() and not full["segment_ids"][..., n:].any()
  grad_fn = jax.jit(objectives.make_grad_fn(wide))
  (loss_full, _), grads_full = grad_fn(state.params, full, key)
  (loss_short, _), grads_short = grad_fn(state.params, short, key)
  np.testing.assert_allclose(loss_short, loss_full, rtol=1e-5)
  for g, h in zip(jax.tree.leaves(grads_short), jax.tree.leaves(grads_full)):
    np.testing.assert_allclose(g, h, atol=1e-5 * float(np.abs(h).max()) + 1e-12)


def _config(source, data, **contrast):
  from crossbert_jax.core import config as config_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.get_config("contrast", "tiny")
  c.contrast.init_from, c.contrast.hard_negatives, c.data.path, c.data.seq_len = str(source), True, str(data), 32
  c.train.batch_size = 16
  for k, v in contrast.items():
    c.contrast[k] = v
  return c


def test_simcse_on_the_builtin_corpus(command, tiny_run, tmp_path):
  """Unsupervised SimCSE: each text against itself under another dropout mask (positives below cosine 1)."""
  workdir = tmp_path / "simcse"
  proc = _contrast(command, workdir, tiny_run, "builtin", "--config.train.steps=2", variant="tiny_simcse")
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert all(0 < r["positive_cosine"] < 0.9999 for r in rows if "positive_cosine" in r)


def test_bad_inputs_are_one_line_and_write_nothing(command, tiny_run, snli, tmp_path):
  missing = tmp_path / "missing.jsonl"
  missing.write_text(json.dumps({"anchor": "a", "other": "b"}) + "\n")
  empty = tmp_path / "empty.tsv"
  empty.write_text("")
  cases = [
      (tiny_run, missing, [], f"{missing}: no positive column"),
      (tiny_run, empty, [], f"{empty}: holds no pairs"),
      (tmp_path, snli, [], f"config contrast.init_from={tmp_path} is neither a training run's workdir nor"),
      (tiny_run, snli, ["--config.contrast.temperature=0"], "config contrast.temperature: must be a number > 0"),
      (tiny_run, snli, ["--config.train.batch_size=1"], "config train.batch_size: 1: a contrastive batch needs"),]
  for source, data, flags, message in cases:
    workdir = tmp_path / "never"
    proc = _contrast(command, workdir, source, data, *flags)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {message}"), proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and not workdir.exists()


def _cache_hub_dataset(cache, repo: str, config: str, rows: list[pairs.Pair]) -> None:
  """The datasets cache as an online load_dataset(repo, config) leaves it, made offline: datasets' own
  parquet builder prepares the rows, renamed as a Hub load names them (<cache>/<owner>___<name>/<config>/
  0.0.0/<hash>/<name>-train.arrow, dataset_info.json naming the config)."""
  import datasets

  name = repo.split("/")[1]
  parquet = cache / "rows.parquet"
  datasets.Dataset.from_dict(pairs.as_columns(rows)).to_parquet(str(parquet))
  datasets.load_dataset("parquet", data_files={"train": str(parquet)}, cache_dir=str(cache / "build"))
  src = next((cache / "build").rglob("dataset_info.json")).parent
  dst = cache / repo.replace("/", "___") / config / "0.0.0" / "0123abcd"
  dst.mkdir(parents=True)
  for f in src.iterdir():
    (dst / f.name.replace("parquet-", f"{name}-")).write_bytes(f.read_bytes())
  info = json.loads((dst / "dataset_info.json").read_text())
  (dst / "dataset_info.json"
  ).write_text(json.dumps({**info, "config_name": config, "dataset_name": name, "builder_name": name}))


def test_a_hub_dataset_read_offline_from_the_datasets_cache(command, tiny_run, snli, tmp_path, monkeypatch):
  """data.path=hf:OWNER/NAME:CONFIG through the real datasets.load_dataset, offline from its cache: the same
  examples as the same rows in a file; a config or split the cache lacks is one line, exit 2, nothing written."""
  import datasets
  import huggingface_hub

  rows = pairs.read_pairs(snli)[:40]
  _cache_hub_dataset(tmp_path / "cache", "sentence-transformers/all-nli", "triplet", rows)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  file = tmp_path / "rows.jsonl"
  file.write_text("".join(json.dumps(dataclasses.asdict(p)) + "\n" for p in rows))
  hub = "hf:sentence-transformers/all-nli:triplet"
  for spec in (hub, hub + "@train"):
    assert contrast_feed.read_examples(_config(tiny_run, spec)) == contrast_feed.read_examples(_config(tiny_run, file))
  cases = [(hub.replace("triplet", "pair"), "sentence-transformers/all-nli (pair) split 'train' could not be loaded"),
           (hub + "@test", "sentence-transformers/all-nli (triplet) split 'test' could not be loaded"),
           ("hf:all-nli", "write a Hub dataset as hf:OWNER/NAME[:CONFIG][@SPLIT]")]
  for spec, message in cases:
    workdir = tmp_path / "never"
    proc = _contrast(command, workdir, tiny_run, spec)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert not workdir.exists()


def test_command_smoke(tiny_run, tmp_path):
  """The command's one subprocess run: its real argv, exit status and last line."""
  data = tmp_path / "pairs.tsv"
  data.write_text("sentence1\tsentence2\n" + "".join(f"text {i}\tsame as text {i}\n" for i in range(8)))
  proc = run_module([
      "crossbert_jax.contrast", "--config=configs/contrast.py:tiny_pairs", f"--workdir={tmp_path / 'run'}",
      f"--config.contrast.init_from={tiny_run}", f"--config.data.path={data}", "--config.contrast.hard_negatives=False",
      "--config.train.batch_size=8", "--config.train.steps=2", "--config.metrics.progress_bar=False"], env=cpu_env())
  assert proc.stdout.splitlines()[-1].startswith("done: step 2, loss ") and "Traceback" not in proc.stderr

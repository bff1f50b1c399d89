"""End to end: a tiny run trained a few steps, scored through the CLI next to a tiny HF ModernBERT.

The CLI subsamples tasks (--max_examples) and truncates (--max_length) to stay fast; the full
data command is for users (docs/evaluation.md).
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.data import corpus, tokenizer
from tests.helpers import copy_run, cpu_env, run_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = cpu_env(HF_HUB_OFFLINE="1")
OFFLINE = {"HF_HUB_OFFLINE": "1"}  # ENV's addition, for the commands run in process (tests/helpers.py's run_command).


@pytest.fixture(scope="module")
def run_dir(tiny_run, tmp_path_factory) -> pathlib.Path:
  """The session's tiny CrossBERT run (conftest's tiny_run: 512-piece tokenizer, 5 steps), copied: the
  commands here record their scores in the run's folder."""
  return copy_run(tiny_run, tmp_path_factory.mktemp("eval_run"))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> pathlib.Path:
  """A tiny random ModernBERT with a word-level tokenizer, saved with save_pretrained (no internet)."""
  import tokenizers
  import transformers

  path = tmp_path_factory.mktemp("hf_model")
  words = sorted({w for d in corpus.builtin_documents()[:500] for w in d.lower().split()})[:2000]
  vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
  tok.normalizer = tokenizers.normalizers.Lowercase()
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.post_processor = tokenizers.processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                                special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                              cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                              model_input_names=["input_ids", "attention_mask"])
  fast.save_pretrained(path)
  config = transformers.ModernBertConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=256,
                                         pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
  transformers.ModernBertModel(config).save_pretrained(path)
  return path


def test_cli_end_to_end(run_dir, hf_dir, shared_data, tmp_path):
  """Two tasks + SciFact retrieval for the run and the HF model side by side; every key in the JSON."""
  out = tmp_path / "results.json"
  cmd = [
      sys.executable, "-m", "crossbert_jax.evaluate", f"--workdir={run_dir}", f"--hf={hf_dir}",
      f"--data_dir={shared_data}", "--tasks=sst2,stsb", "--retrieval=beir/scifact", "--max_examples=300",
      "--max_length=64", "--retrieval_max_docs=500", f"--output={out}", "--noprogress",
      f"--cache_dir={tmp_path / 'cache'}"]
  proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(out.read_text())["models"]
  assert list(results) == ["run@5", f"hf:{hf_dir.name}"]
  expected = {f"{p}/{s}/accuracy" for p in ("linear", "knn") for s in ("dev", "test")}
  for label, r in results.items():
    assert set(r["tasks"]["sst2"]["scores"]) == expected, label
    stsb = r["tasks"]["stsb"]["scores"]
    assert set(stsb) == ({
        f"{p}/{s}/{m}" for p in ("linear", "knn") for s in ("dev", "test") for m in ("spearman", "pearson")} |
                         {"cosine/dev/spearman", "cosine/test/spearman"})
    assert r["tasks"]["stsb"]["sizes"] == {"train": 300, "dev": 300, "test": 300}
    scifact = r["retrieval"]["scifact"]
    assert 500 < scifact["documents"] < 5183 and scifact["queries"] == 300
    assert all(0.0 <= scifact[k] <= 1.0 for k in ("ndcg@10", "map@100", "recall@100"))
    assert all(math.isfinite(v) for t in r["tasks"].values() for v in t["scores"].values())
    assert r["sentences_per_second"] > 0
  table = out.with_suffix(".md").read_text()
  assert "| score | run@5 | hf:" in table and "| sst2/linear/dev/accuracy |" in table
  assert "| scifact/ndcg@10 |" in table


def test_cli_user_errors(tmp_path, command):
  proc = command("crossbert_jax.evaluate", f"--workdir={tmp_path}", "--data_dir=/nonexistent", "--tasks=sst2")
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "--data_dir" in lines[0], proc.stderr[-2000:]


def test_a_model_given_twice_is_refused(tmp_path, command):
  """Two spellings of one --workdir would be two identical columns: one line, before anything is read."""
  proc = command("crossbert_jax.evaluate", f"--workdir={tmp_path}", f"--workdir={tmp_path}/.", "--tasks=sst2")
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: --workdir={tmp_path}/. is --workdir={tmp_path} again: give each model once"], proc.stderr[-2000:]


def test_probe_scores_cache_and_mteb_wrapper(run_dir, shared_data, tmp_path):
  """probe_scores: the expected keys, finite, deterministic; the mteb wrapper's encode contract."""
  from crossbert_jax.run import load
  from crossbert_jax.evaluation import embedder, runner, mteb as mteb_eval

  cache_dir = tmp_path / "cache"
  config, params, _ = load.load_run(run_dir)
  config = plan_lib.with_keys(config, {"eval.data_dir": str(shared_data), "eval.max_examples": 200})
  tok = tokenizer.Tokenizer.load(config.data.tokenizer)
  scores = runner.probe_scores(config, params["encoder"], tok)
  assert set(
      scores
  ) == {"probe/sst2/linear", "probe/sst2/knn", "probe/stsb/linear", "probe/stsb/knn", "probe/stsb/cosine_spearman"}
  assert all(math.isfinite(v) for v in scores.values()), scores
  assert runner.probe_scores(config, params["encoder"], tok) == scores
  # The embedding cache: a second pass embeds nothing and scores the same.
  emb = embedder.JaxEmbedder(runner.EncoderSpec.from_config(config.model), params["encoder"], tok,
                             embedder.Options(max_length=64), identity="test@5")
  task = runner._cached_task("rte", str(shared_data))
  first = runner.evaluate_task(emb, task, max_examples=100, cache_dir=str(cache_dir))
  seen = emb.sentences_seen
  assert seen == 200 and len(list(cache_dir.iterdir())) == 2  # train + dev, joint pairs.
  assert runner.evaluate_task(emb, task, max_examples=100, cache_dir=str(cache_dir)) == first
  assert emb.sentences_seen == seen
  spec = runner.EncoderSpec.from_config(config.model)
  enc = mteb_eval.MtebEncoder(embedder.JaxEmbedder(spec, params["encoder"], tok, embedder.Options(max_length=32)))
  batches = [{"text": ["a first sentence", "a second"]}, {"text": ["third"]}]  # mteb 2.x DataLoader batches.
  out = enc.encode(batches, batch_size=2)
  assert out.shape == (3, config.model.embed_dim) and np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
  np.testing.assert_allclose(enc.encode(["third"]), out[2:], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- Evaluation II


def _tsv(path: pathlib.Path, header: list[str], rows) -> str:
  path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))
  return str(path)


def _run_embedder(run_dir, max_length=64):
  from crossbert_jax.evaluation import embedder
  from crossbert_jax.model.encoder import EncoderSpec
  from crossbert_jax.run import load

  config, params, step = load.load_run(run_dir)
  tok = tokenizer.Tokenizer.load(config.data.tokenizer)
  emb = embedder.JaxEmbedder(EncoderSpec.from_config(config.model), params["encoder"], tok,
                             embedder.Options(max_length=max_length), identity=f"{os.path.abspath(run_dir)}@{step}")
  return emb, params


def test_generic_pair_regression_and_task_file_cli(run_dir, shared_data, tmp_path):
  """One command, no --tasks/--data_dir: a generic pair-regression TSV (zero-shot cosine Spearman,
  equal to the cosine computed here) plus a task file of three tasks, one model load, one cache. In process
  (run_command): evaluate's subprocess smoke test is test_cli_end_to_end."""
  from crossbert_jax.evaluation import probes, tasks as eval_tasks

  sts_train = eval_tasks.read_sts_benchmark(shared_data, "train").subset(300, 0)
  sts_test = eval_tasks.read_sts_benchmark(shared_data, "test").subset(200, 0)
  train = _tsv(tmp_path / "sts_train.tsv", ["sentence1", "sentence2", "score"],
               zip(sts_train.texts, sts_train.pairs, sts_train.labels))
  test = _tsv(tmp_path / "sts_test.tsv", ["sentence1", "sentence2", "score"],
              zip(sts_test.texts, sts_test.pairs, sts_test.labels))
  sst = eval_tasks.load_task("sst2", shared_data)
  for split, n in (("train", 200), ("dev", 100)):
    sp = sst.splits[split].subset(n, 0)
    (tmp_path / f"sst_{split}.jsonl"
    ).write_text("\n".
                 join(json.dumps({"review": t, "stars": ["neg", "pos"][int(y)]}) for t, y in zip(sp.texts, sp.labels)))
  mrpc = eval_tasks.load_task("mrpc", shared_data).splits["train"].subset(200, 0)
  _tsv(tmp_path / "mrpc.tsv", ["a", "b", "paraphrase"], zip(mrpc.texts, mrpc.pairs, mrpc.labels))
  snli = eval_tasks.load_task("snli", shared_data).splits["dev"].subset(150, 0)
  (tmp_path / "data").mkdir()
  _tsv(tmp_path / "data" / "snli.tsv", ["premise", "hypothesis", "label"], zip(snli.texts, snli.pairs, snli.labels))
  task_file = tmp_path / "tasks.json"
  task_file.write_text(
      json.dumps({
          "tasks": [{
              "name": "sst", "type": "classification", "train": str(tmp_path / "sst_train.jsonl"),
              "eval": {"dev": str(tmp_path / "sst_dev.jsonl")}, "columns": {"text": "review", "label": "stars"}}, {
                  "name": "para", "type": "pair_classification", "train": "mrpc.tsv",
                  "columns": {"text": "a", "pair": "b", "label": "paraphrase"}}, {
                      "name": "nli", "type": "pair_classification", "train": "data/snli.tsv",
                      "columns": {"text": "premise", "pair": "hypothesis", "label": "label"}}]}))
  out, cache = tmp_path / "results.json", tmp_path / "cache"
  proc = run_command("crossbert_jax.evaluate", f"--workdir={run_dir}", f"--generic_train={train}",
                     f"--generic_eval={test}", "--generic_text=sentence1", "--generic_pair=sentence2",
                     "--generic_label=score", "--generic_type=regression", "--generic_name=sts_pairs",
                     f"--task_file={task_file}", "--max_length=64", f"--output={out}", "--noprogress",
                     f"--cache_dir={cache}", env=OFFLINE)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())["models"]["run@5"]["tasks"]
  assert list(result) == ["sts_pairs", "sst", "para", "nli"]
  # The score is the Spearman of the CLI's own cosines (its cached embeddings), exactly.
  side_a, side_b = (np.load(next(cache.glob(f"sts_pairs-eval-{part}-*.npy"))) for part in ("a", "b"))
  cli_cosine = probes.cosine(side_a, side_b)
  assert result["sts_pairs"]["scores"]["cosine/eval/spearman"] == probes.spearman(cli_cosine, sts_test.labels)
  # And those embeddings are this process's, to float32 rounding. The command runs in this process now (8 fake
  # devices, as the embedder below); as a subprocess it ran on 1 CPU device, so the per-device batch shapes (and
  # XLA's CPU kernels) differed. Measured then on AMD EPYC: max |diff| 1.8e-7 in the embeddings and cosines; the
  # sorted cosines have gaps of 6e-8, so ranks of near-ties flip and Spearman moves by 4.9e-5. Compare the
  # continuous cosines, within the tolerance either side holds.
  emb, _ = _run_embedder(run_dir)
  here_cosine = probes.cosine(emb.embed(sts_test.texts), emb.embed(sts_test.pairs))
  np.testing.assert_allclose(cli_cosine, here_cosine, rtol=0, atol=1e-6)
  assert {"linear/eval/spearman", "knn/eval/spearman"} <= set(result["sts_pairs"]["scores"])
  assert set(result["sst"]["scores"]) == {f"{p}/dev/{m}" for p in ("linear", "knn") for m in ("accuracy", "f1")}
  assert {"cosine/cv/accuracy", "cosine/cv/f1", "linear/cv/f1"} <= set(result["para"]["scores"])
  assert not any(k.startswith("cosine") for k in result["nli"]["scores"])  # Three classes: no threshold.
  assert result["nli"]["sizes"] == {"train": 150}
  assert {p.name.split("-")[0] for p in cache.iterdir()} == {"sts_pairs", "sst", "para", "nli"}
  # The run's own scores are recorded in its workdir, and export's model card shows them as a table.
  from etils import epath
  from crossbert_jax.hf import files
  from crossbert_jax.run import load

  record = json.loads((run_dir / "eval_results.json").read_text())
  score = result["sts_pairs"]["scores"]["cosine/eval/spearman"]
  assert record["step"] == 5 and record["scores"]["sts_pairs/cosine/eval/spearman"] == round(score, 6)
  config, _, _ = load.load_run(run_dir)
  card = files.model_card(config, files.run_summary(epath.Path(run_dir), config, 5), None)
  assert "Frozen probes (`python -m crossbert_jax.evaluate`) at step 5:" in card, card
  assert f"| sts_pairs/cosine/eval/spearman | {100 * score:.1f} |" in card, card


def test_pooler_training_leaves_the_encoder_untouched(run_dir, shared_data):
  """Bitwise-equal encoder params after training; the loss's gradient tree is the pooler's alone;
  the attention pooler at init is exactly the mean-pooled embedding (padding handled)."""
  import jax
  from crossbert_jax.evaluation import pooler

  emb, params = _run_embedder(run_dir)
  before = jax.tree.map(np.array, params["encoder"])
  anchors, positives, negatives = pooler.read_pairs(str(shared_data / "senteval/downstream/SNLI"), "dev")
  assert len(anchors) == len(negatives) > 2000
  texts, triples = pooler.triples_from(anchors[:160], positives[:160], negatives[:160])
  features = pooler.frozen_features(emb, "attention", texts)
  trained, losses = pooler.train_pooler(features, triples,
                                        pooler.TrainOptions("attention", steps=30, batch_size=32, learning_rate=3e-3),
                                        log=None)
  assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
  same = jax.tree.map(lambda a, b: a.dtype == b.dtype and np.array_equal(a, np.asarray(b)), before, params["encoder"])
  # The embedder holds the encoder replicated over the local devices: a copy, bitwise the same.
  kept = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), before, emb.params)
  assert all(jax.tree.leaves(same)) and all(jax.tree.leaves(kept))
  model = pooler.Pooler("attention", emb.spec.embed_dim)
  grads = jax.grad(pooler.pooler_loss, argnums=1)(model, trained, features.hidden_NxLxD[triples.T[:, :32]],
                                                  features.mask_NxL[triples.T[:, :32]], 20.0)
  assert jax.tree.structure(grads) == jax.tree.structure(trained)
  assert sorted(jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(grads)
               ) == ["['dense']['bias']", "['dense']['kernel']", "['query']"]
  init = model.init(jax.random.key(0), features.hidden_NxLxD[:1], features.mask_NxL[:1])["params"]
  at_init = pooler.PoolerEmbedder(emb, pooler.LoadedPooler("attention", jax.device_get(init), {}, "init"))
  np.testing.assert_allclose(at_init.embed(texts[:50]), emb.embed(texts[:50]), atol=1e-5)


def _digest(folder: pathlib.Path) -> dict[str, str]:
  import hashlib
  return {
      str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
      for p in sorted(folder.rglob("*"))
      if p.is_file()}


@pytest.mark.slow
def test_pooler_cli_export_and_side_by_side(run_dir, shared_data, tmp_path):
  """The pooler CLI trains on SNLI, exports a sentence-transformers folder matching JAX within 1e-4,
  leaves the run's checkpoints bitwise unchanged; evaluate scores the run with and without it."""
  from sentence_transformers import SentenceTransformer
  from crossbert_jax.evaluation import pooler, tasks as eval_tasks

  ckpt_before = _digest(run_dir / "checkpoints")
  out, st_dir = tmp_path / "pooler", tmp_path / "st"
  cmd = [
      sys.executable, "-m", "crossbert_jax.pooler", f"--workdir={run_dir}",
      f"--pairs={shared_data / 'senteval/downstream/SNLI'}", "--steps=40", "--batch_size=32", "--max_length=64",
      f"--output={out}", f"--export={st_dir}"]
  proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "verified" in proc.stdout and _digest(run_dir / "checkpoints") == ckpt_before
  sts = eval_tasks.read_sts_benchmark(shared_data, "test").subset(40, 1)
  st = SentenceTransformer(str(st_dir), device="cpu")
  assert [type(m).__name__ for m in st] == ["Transformer", "Pooling", "Dense"]
  emb, _ = _run_embedder(run_dir, max_length=st.max_seq_length)  # The folder truncates at the run's seq_len.
  ours = pooler.PoolerEmbedder(emb, pooler.load_pooler(str(out))).embed(sts.texts)
  np.testing.assert_allclose(st.encode(sts.texts, convert_to_numpy=True), ours, atol=1e-4)
  res = tmp_path / "results.json"
  proc = run_command("crossbert_jax.evaluate", f"--workdir={run_dir}", f"--pooler={out}", f"--data_dir={shared_data}",
                     "--tasks=stsb", "--max_examples=200", "--max_length=64", "--noprogress", f"--output={res}",
                     "--nocache", env=OFFLINE)  # In process: it reads what the pooler CLI (the subprocess) wrote.
  assert proc.returncode == 0, proc.stderr[-3000:]
  models = json.loads(res.read_text())["models"]
  assert list(models) == ["run@5", "run@5+pooler"]
  plain, pooled = (models[m]["tasks"]["stsb"]["scores"]["cosine/test/spearman"] for m in models)
  assert plain != pooled and "| score | run@5 | run@5+pooler |" in res.with_suffix(".md").read_text()


def test_mteb_offline_matches_our_stsb(run_dir, shared_data, tmp_path):
  """mteb's own STSBenchmark evaluator on the local layout (HF_HUB_OFFLINE=1) agrees with our figure. The layout
  is the converter's (tools/mteb_local_data.py's STSBenchmark, called here) and mteb_eval runs in process
  (run_command): the script's and the command's subprocess runs are test_mteb.py's."""
  from crossbert_jax.evaluation import probes, tasks as eval_tasks
  from tools import mteb_local_data

  local = tmp_path / "local"
  assert mteb_local_data.sts_benchmark(shared_data, local) == 1379
  proc = run_command("crossbert_jax.mteb_eval", f"--workdir={run_dir}", "--tasks=STSBenchmark", f"--data_dir={local}",
                     "--max_length=64", f"--output_dir={tmp_path / 'mteb'}",
                     env={**OFFLINE, "HF_DATASETS_OFFLINE": "1"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  theirs = float(next(l for l in proc.stdout.splitlines() if l.startswith("[1/1] STSBenchmark: ")).split()[2])
  test = eval_tasks.read_sts_benchmark(shared_data, "test")
  emb, _ = _run_embedder(run_dir)
  ours = probes.spearman(probes.cosine(emb.embed(test.texts), emb.embed(test.pairs)), test.labels)
  assert abs(theirs - ours) < 0.01, (theirs, ours)


def test_pooler_and_task_file_user_errors(tmp_path):
  """Bad inputs to the new commands and flags: one `error:` line, exit status 2, nothing written."""
  bad_tsv = tmp_path / "bad.tsv"
  bad_tsv.write_text("a\tb\nonly one field\n")
  task_file = tmp_path / "tasks.json"
  task_file.write_text(
      json.dumps([{"name": "t", "type": "regression", "train": "bad.tsv", "columns": {"text": "a", "label": "b"}}]))
  cases = [(["crossbert_jax.pooler", f"--workdir={tmp_path}", f"--pairs={bad_tsv}",
             "--pairs_columns=a,b"], "line 2 has 1 tab-separated fields"),
           (["crossbert_jax.evaluate", f"--workdir={tmp_path}",
             f"--task_file={task_file}"], "line 2 has 1 tab-separated fields")]
  for args, message in cases:  # In process (run_command): refused before any work.
    proc = run_command(*args, env=OFFLINE)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tsv", "tasks.json"]


def test_load_run_restores_only_the_params(run_dir, monkeypatch):
  """evaluate / export / pooler / mteb_eval read the params item alone: no optimizer is built and the
  AdamW moments (twice the params) are never materialised."""
  import gc

  import jax

  from crossbert_jax.run import load
  from crossbert_jax.training import optimizer, program

  def no_optimizer(*args, **kwargs):
    raise AssertionError("load_run built an optimizer")

  monkeypatch.setattr(optimizer, "make_optimizer", no_optimizer)
  gc.collect()
  before = {id(a) for a in jax.live_arrays()}
  config, params, step = load.load_run(run_dir)
  gc.collect()
  restored = sum(a.nbytes for a in jax.live_arrays() if id(a) not in before)
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  assert step == 5 and param_bytes > 0
  assert restored == param_bytes, f"{restored} bytes on the device after load_run, the params are {param_bytes}"
  abstract = program.abstract_params(config)
  assert jax.tree.structure(params) == jax.tree.structure(abstract)
  assert all(p.shape == a.shape and p.dtype == a.dtype
             for p, a in zip(jax.tree.leaves(params), jax.tree.leaves(abstract)))

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

from crossbert_jax.data import corpus, tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> pathlib.Path:
  """A tiny CrossBERT run: 512-piece tokenizer, 5 steps."""
  base = tmp_path_factory.mktemp("eval_run")
  spm = base / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:4000], 512, spm)
  workdir = base / "run"
  cmd = [sys.executable, "-m", "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
         f"--config.data.tokenizer={spm}", "--config.model.vocab_size=512", "--config.train.steps=5",
         "--config.metrics.progress_bar=False"]
  proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  if proc.returncode != 0:
    pytest.fail(f"training failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return workdir


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
  tok.post_processor = tokenizers.processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
      mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"])
  fast.save_pretrained(path)
  config = transformers.ModernBertConfig(
      vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
      max_position_embeddings=256, pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2,
      eos_token_id=3)
  transformers.ModernBertModel(config).save_pretrained(path)
  return path


def test_cli_end_to_end(run_dir, hf_dir, shared_data, tmp_path):
  """Two tasks + SciFact retrieval for the run and the HF model side by side; every key in the JSON."""
  out = tmp_path / "results.json"
  cmd = [sys.executable, "-m", "crossbert_jax.evaluate", f"--workdir={run_dir}", f"--hf={hf_dir}",
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
    assert set(stsb) == ({f"{p}/{s}/{m}" for p in ("linear", "knn") for s in ("dev", "test")
                          for m in ("spearman", "pearson")} | {"cosine/dev/spearman", "cosine/test/spearman"})
    assert r["tasks"]["stsb"]["sizes"] == {"train": 300, "dev": 300, "test": 300}
    scifact = r["retrieval"]["scifact"]
    assert 500 < scifact["documents"] < 5183 and scifact["queries"] == 300
    assert all(0.0 <= scifact[k] <= 1.0 for k in ("ndcg@10", "map@100", "recall@100"))
    assert all(math.isfinite(v) for t in r["tasks"].values() for v in t["scores"].values())
    assert r["sentences_per_second"] > 0
  table = out.with_suffix(".md").read_text()
  assert "| score | run@5 | hf:" in table and "| sst2/linear/dev/accuracy |" in table
  assert "| scifact/ndcg@10 |" in table


def test_cli_user_errors(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "crossbert_jax.evaluate", f"--workdir={tmp_path}",
                         "--data_dir=/nonexistent", "--tasks=sst2"], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "--data_dir" in lines[0], proc.stderr[-2000:]


def test_probe_scores_cache_and_mteb_wrapper(run_dir, shared_data, tmp_path):
  """probe_scores: the expected keys, finite, deterministic; the mteb wrapper's encode contract."""
  from crossbert_jax.training import checkpoint
  from crossbert_jax.evaluation import embedder, runner as evaluate, mteb as mteb_eval

  cache_dir = tmp_path / "cache"
  config, params, _ = checkpoint.load_run(run_dir)
  config.eval.data_dir = str(shared_data)
  config.eval.max_examples = 200
  tok = tokenizer.Tokenizer.load(config.data.tokenizer)
  scores = evaluate.probe_scores(config, params["encoder"], tok)
  assert set(scores) == {"probe/sst2/linear", "probe/sst2/knn", "probe/stsb/linear", "probe/stsb/knn",
                         "probe/stsb/cosine_spearman"}
  assert all(math.isfinite(v) for v in scores.values()), scores
  assert evaluate.probe_scores(config, params["encoder"], tok) == scores
  # The embedding cache: a second pass embeds nothing and scores the same.
  emb = embedder.JaxEmbedder(evaluate.EncoderSpec.from_config(config.model), params["encoder"], tok,
                             embedder.Options(max_length=64), identity="test@5")
  task = evaluate._cached_task("rte", str(shared_data))
  first = evaluate.evaluate_task(emb, task, max_examples=100, cache_dir=str(cache_dir))
  seen = emb.sentences_seen
  assert seen == 200 and len(list(cache_dir.iterdir())) == 2  # train + dev, joint pairs.
  assert evaluate.evaluate_task(emb, task, max_examples=100, cache_dir=str(cache_dir)) == first
  assert emb.sentences_seen == seen
  spec = evaluate.EncoderSpec.from_config(config.model)
  enc = mteb_eval.MtebEncoder(embedder.JaxEmbedder(spec, params["encoder"], tok, embedder.Options(max_length=32)))
  batches = [{"text": ["a first sentence", "a second"]}, {"text": ["third"]}]  # mteb 2.x DataLoader batches.
  out = enc.encode(batches, batch_size=2)
  assert out.shape == (3, config.model.embed_dim) and np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
  np.testing.assert_allclose(enc.encode(["third"]), out[2:], rtol=1e-5, atol=1e-6)

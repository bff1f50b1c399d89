"""The contrastive stage's config (configs/contrast.py, the `contrast` section, model.dropout) and its batches
(data/contrast_feed.py): each bad key one line naming it; batches of T texts, their ids, an exact resume."""

import importlib.util
import json

import ml_collections
import numpy as np
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import contrast_feed, pairs, tokenizer as tokenizer_lib
from crossbert_jax.run import feed
from tests.helpers import ROOT


def _variant(name: str) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location("contrast_configs", ROOT / "configs" / "contrast.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(name)
  c.contrast.init_from = "runs/source"
  return c


@pytest.mark.parametrize("name", ["tiny_pairs", "tiny_simcse", "base_pairs", "base_simcse"])
def test_variants_build(name):
  plan = plan_lib.build(_variant(name))
  assert plan.objective == "contrast" and isinstance(plan.contrast, sections.Contrast)
  assert plan.contrast.recipe == name.split("_")[1]
  assert (plan.model.dropout > 0) == (plan.contrast.recipe == "simcse")
  if name == "base_pairs":  # ModernBERT's train_st.py: batch 512, lr 8e-5, a cached loss.
    assert (plan.train.batch_size, plan.train.learning_rate, plan.contrast.chunk_size) == (512, 8e-5, 64)
  # A saved config (config.json, a checkpoint's) reads back to the same typed section.
  assert plan_lib.of_saved(json.loads(plan.to_json())).contrast == plan.contrast


def test_unknown_variant_is_one_line():
  with pytest.raises(UserError, match="config variant 'tiny': use one of tiny_pairs, tiny_simcse"):
    _variant("tiny")


BAD = [
    ("contrast.temperature", 0.0, r"config contrast.temperature: must be a number > 0 \(got 0.0\)"),
    ("contrast.temperature", -0.05, r"config contrast.temperature: must be a number > 0"),
    ("train.batch_size", 1, r"config train.batch_size: 1: a contrastive batch needs >= 2 examples"),
    ("contrast.init_from", "", r"config contrast.init_from: is empty: give the encoder the stage starts from"),
    ("train.init_from", "other", r"config train.init_from: 'other' differs from contrast.init_from"),
    ("contrast.recipe", "mlm", r"config contrast.recipe: 'mlm': use one of simcse, pairs"),
    ("contrast.pooling", "max", r"config contrast.pooling: 'max': use one of mean, cls"),
    ("contrast.chunk_size", -1, r"config contrast.chunk_size: must be >= 0"),
    ("train.grad_accum", 2, r"config train.grad_accum: micro-batches would shrink the in-batch negatives"),
    ("contrast.columns", "a,b", r"config contrast.columns: 'a,b' and contrast.hard_negatives=True disagree"),
    ("contrast.columns", "a", r"config contrast.columns: 'a': give 'anchor,positive'"),
    ("model.dropout", 1.0, r"config model.dropout: must be in \[0, 1\), got 1.0"),
    ("contrast.padding", "longest", r"config contrast.padding: 'longest': use one of max, batch"),]


@pytest.mark.parametrize("key,value,match", BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_bad_key_is_one_line(key, value, match):
  c = _variant("tiny_pairs")
  section, name = key.split(".")
  c[section][name] = value
  with pytest.raises(UserError, match="^" + match) as e:
    plan_lib.build(c)
  assert "\n" not in str(e.value)


def test_simcse_needs_dropout_and_no_pair_keys():
  c = _variant("tiny_simcse")
  c.model.dropout = 0.0
  with pytest.raises(UserError, match=r"^config model.dropout: is 0, but contrast.recipe=simcse"):
    plan_lib.build(c)
  c = _variant("tiny_simcse")
  c.contrast.hard_negatives = True
  with pytest.raises(UserError, match=r"^config contrast.hard_negatives: applies to contrast.recipe=pairs only"):
    plan_lib.build(c)


def test_dropout_is_the_contrastive_stage_s_only():
  """model.dropout is drawn only by an objective that passes a dropout key: pretraining refuses it, and its
  default (0) leaves pretraining's config as it was."""
  c = config_lib.get_config("crossbert", "tiny")
  assert c.model.dropout == 0.0
  c.model.dropout = 0.1
  with pytest.raises(UserError, match=r"^config model.dropout: objective=crossbert draws no dropout"):
    plan_lib.build(c)


# -- batches ---------------------------------------------------------------------------------

ROWS = [("a dog runs", "an animal moves", "a cat sleeps"), ("it rains", "the weather is wet", "it is sunny"),
        ("two men talk", "people speak", "nobody is there"), ("a dog runs", "an animal moves", "a bird sings")]


def _pairs_plan(tmp_path, spm_model, **keys):
  path = tmp_path / "pairs.jsonl"
  path.write_text("".join(json.dumps(dict(zip(("anchor", "positive", "negative"), r))) + "\n" for r in ROWS))
  c = _variant("tiny_pairs")
  c.data.path, c.data.tokenizer, c.train.batch_size = str(path), spm_model, 4
  for key, value in keys.items():
    section, name = key.split("__")
    c[section][name] = value
  return plan_lib.build(c)


def test_pair_batches(tmp_path, spm_model):
  """B x T x L rows laid out as the embedder's ([CLS] ids [SEP], padded), equal texts sharing an id."""
  c = _pairs_plan(tmp_path, spm_model)
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  batch = next(contrast_feed.make_iterator(c, tok, batch_size=4, seed=0))
  assert {k: v.shape for k, v in batch.items()
         } == {"tokens": (4, 3, 32), "segment_ids": (4, 3, 32), "positions": (4, 3, 32), "text_ids": (4, 3)}
  assert all(v.dtype == np.int32 for v in batch.values())
  ids = {tuple(row) for row in batch["text_ids"].tolist()}
  assert ids == {tuple(pairs.text_ids(list(r)).tolist()) for r in ROWS}  # One epoch: every example once.
  positives = batch["text_ids"][:, 1]
  assert len(set(positives.tolist())) == 3  # The repeated example's positive: one id twice.
  assert (batch["tokens"][..., 0] == tok.special_ids.cls).all()
  lengths = batch["segment_ids"].sum(-1)
  rows = np.take_along_axis(batch["tokens"], (lengths - 1)[..., None], axis=-1)[..., 0]
  assert (rows == tok.special_ids.sep).all() and (batch["positions"].max(-1) == lengths - 1).all()
  # Without hard negatives: T = 2, the same first two texts.
  two = next(
      contrast_feed.make_iterator(_pairs_plan(tmp_path, spm_model, contrast__hard_negatives=False), tok, batch_size=4,
                                  seed=0))
  assert two["tokens"].shape == (4, 2, 32) and (two["tokens"] == batch["tokens"][:, :2]).all()


def test_pair_stream_resumes_exactly_and_splits_processes(tmp_path, spm_model):
  c = _pairs_plan(tmp_path, spm_model)
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  it = contrast_feed.make_iterator(c, tok, batch_size=2, seed=3)
  next(it)
  state = it.get_state()
  after = [next(it) for _ in range(3)]  # Into the second epoch (2 batches an epoch).
  again = contrast_feed.make_iterator(c, tok, batch_size=2, seed=3)
  again.set_state(state)
  for a, b in zip(after, [next(again) for _ in range(3)]):
    assert all((a[k] == b[k]).all() for k in a)
  # Two processes read disjoint halves of an epoch.
  halves = [
      next(contrast_feed.make_iterator(c, tok, batch_size=2, seed=3, process_index=i, process_count=2))["text_ids"]
      for i in range(2)]
  assert sorted(map(tuple,
                    np.concatenate(halves).tolist())) == sorted(tuple(pairs.text_ids(list(r)).tolist()) for r in ROWS)


def test_pair_file_refusals_are_one_line(tmp_path, spm_model):
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  two = tmp_path / "two.jsonl"
  two.write_text("".join(json.dumps({"anchor": r[0], "positive": r[1]}) + "\n" for r in ROWS))
  c = plan_lib.with_keys(_pairs_plan(tmp_path, spm_model), {"data.path": str(two)})
  with pytest.raises(UserError, match=rf"^{two}: no negative column \(contrast.hard_negatives=True\)"):
    contrast_feed.make_iterator(c, tok, batch_size=4, seed=0)
  c = plan_lib.with_keys(_pairs_plan(tmp_path, spm_model), {"train.batch_size": 8})
  with pytest.raises(UserError, match=r"holds 4 pair\(s\), fewer than one batch \(train.batch_size=8\)"):
    contrast_feed.make_iterator(c, tok, batch_size=8, seed=0)


def test_simcse_batches_one_text_per_example(spm_model):
  c = _variant("tiny_simcse")
  c.data.tokenizer, c.train.batch_size = spm_model, 8
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  batch = next(contrast_feed.make_iterator(plan_lib.build(c), tok, batch_size=8, seed=0))
  assert batch["tokens"].shape == (8, 1, 32) and batch["text_ids"].shape == (8, 1)
  assert (batch["segment_ids"][:, 0, :2] == 1).all()


def test_per_batch_padding(tmp_path, spm_model):
  """contrast.padding=batch: the texts of `max`'s batch cut to the shortest of pad_lengths holding the longest;
  the run's feed pads reads of other lengths to their longest (on several processes: the longest of any process,
  tests/slow/test_multiprocess.py)."""
  assert contrast_feed.pad_lengths(256) == [16, 32, 64, 128, 256] and contrast_feed.pad_lengths(100)[-2:] == [64, 100]
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  full, short = (next(
      contrast_feed.make_iterator(_pairs_plan(tmp_path, spm_model, contrast__padding=padding), tok, batch_size=4,
                                  seed=0)) for padding in ("max", "batch"))
  longest = int(full["segment_ids"].sum(-1).max())
  assert full["tokens"].shape[-1] == 32 and short["tokens"].shape[-1] == 16 and longest <= 16
  for key in ("tokens", "segment_ids", "positions"):
    assert (short[key] == full[key][..., :16]).all()
  assert (short["text_ids"] == full["text_ids"]).all()
  it = contrast_feed.make_iterator(_pairs_plan(tmp_path, spm_model, contrast__padding="batch"), tok, batch_size=4,
                                   seed=0)
  assert it.pad_values == {"tokens": tok.special_ids.pad, "segment_ids": 0, "positions": 0}
  cut = {**short, **{k: short[k][..., :8] for k in it.pad_values}}
  (a, b) = feed.same_length([cut, short], it.pad_values, process_count=1)
  assert a["tokens"].shape == b["tokens"].shape == short["tokens"].shape and (b["tokens"] == short["tokens"]).all()
  assert (a["tokens"][..., 8:] == tok.special_ids.pad).all() and not a["segment_ids"][..., 8:].any()
  assert (a["positions"][..., :8] == short["positions"][..., :8]).all() and (a["text_ids"] == short["text_ids"]).all()

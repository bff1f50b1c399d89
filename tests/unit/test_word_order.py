"""The word-order probe (`evaluate --word_order`, make demo's last step) computes what it prints.

No learned score is asserted: the pairs keep every token and only reorder words; the score is
scikit-learn's logistic regression on the pair differences; a bag of words gets zero features;
the "random init" row is the trainer's own step 0.
"""

import jax
import numpy as np
import pytest
from sklearn import linear_model

from crossbert_jax.core import config as config_lib
from crossbert_jax.data import corpus, tokenizer as tokenizer_lib
from crossbert_jax.evaluation import embedder as embedder_lib, word_order
from crossbert_jax.run import load
from crossbert_jax.training import program, sharding

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def tok(spm_model) -> tokenizer_lib.Tokenizer:
  return tokenizer_lib.Tokenizer.load(spm_model)


@pytest.fixture(scope="module")
def pairs(tok) -> word_order.Pairs:
  return word_order.make_pairs(corpus.builtin_documents()[:3000], tok, MAX_LENGTH, num_pairs=400)


class _Fixed(embedder_lib.Embedder):
  """A deterministic function of the text: `fn(token ids) -> D floats`."""
  def __init__(self, tok, fn):
    self.tok, self.fn = tok, fn

  def _embed(self, texts, pairs):
    return np.stack([self.fn(np.asarray(ids)) for ids in self.tok.encode_batch(texts)]).astype(np.float32)


def _bag_of_words(ids):
  return np.bincount(ids, minlength=512)


def _order_aware(ids):
  """Counts plus where each piece sits: some word-order signal for the probe to find."""
  basis = np.random.default_rng(0).normal(size=(512, 16))
  weights = np.linspace(1.0, -1.0, len(ids))[:, None]
  return np.concatenate([basis[ids].sum(0), (weights * basis[ids]).sum(0)])


def test_pairs_reorder_the_words_and_keep_every_token(pairs, tok):
  assert len(pairs) == 400 and 0 < pairs.real_first_N.mean() < 1
  assert pairs.test_N.sum() == round(400 * word_order.TEST_FRACTION)
  for real, shuffled in zip(pairs.real, pairs.shuffled):
    assert real != shuffled and sorted(real.split()) == sorted(shuffled.split())
    a, b = tok.encode(real), tok.encode(shuffled)
    assert sorted(a) == sorted(b) and len(a) + 2 <= MAX_LENGTH
  again = word_order.make_pairs(corpus.builtin_documents()[:3000], tok, MAX_LENGTH, num_pairs=400)
  assert again.real == pairs.real and again.shuffled == pairs.shuffled
  np.testing.assert_array_equal(again.real_first_N, pairs.real_first_N)
  np.testing.assert_array_equal(again.test_N, pairs.test_N)


def test_score_is_sklearns_logistic_regression_on_pair_differences(pairs, tok):
  emb = _Fixed(tok, _order_aware)
  result = word_order.score(emb, pairs)
  real, shuffled = emb.embed(pairs.real), emb.embed(pairs.shuffled)
  x = np.stack([r - s if first else s - r for r, s, first in zip(real, shuffled, pairs.real_first_N)])
  y = pairs.real_first_N.astype(int)
  fit, test = ~pairs.test_N, pairs.test_N
  mean, std = x[fit].mean(0), x[fit].std(0) + 1e-6
  model = linear_model.LogisticRegression(C=result["C"], max_iter=500).fit((x[fit] - mean) / std, y[fit])
  assert result["accuracy"] == np.mean(model.predict((x[test] - mean) / std) == y[test])
  assert result["accuracy"] > 0.6  # The position-weighted features carry the order by construction.


def test_a_bag_of_words_sees_identical_sides(pairs, tok):
  """Zero features for every pair: the probe predicts one orientation for all, i.e. chance."""
  emb = _Fixed(tok, _bag_of_words)
  x, _ = word_order.pair_features(pairs, emb.embed(pairs.real), emb.embed(pairs.shuffled))
  assert not x.any()
  y_test = pairs.real_first_N[pairs.test_N]
  assert word_order.score(emb, pairs)["accuracy"] in (y_test.mean(), 1 - y_test.mean())


def test_init_params_are_the_trainers_step_0():
  c = config_lib.get_config("crossbert", "tiny")
  trainer = program.TrainProgram(c, sharding.make_mesh(c.mesh)).init_state().params
  ours = load.init_params(c)
  assert jax.tree.structure(ours) == jax.tree.structure(trainer)
  diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), ours, trainer))
  assert max(diffs) <= 1e-7, max(diffs)
  c.unlock()
  c.train.seed = 1
  other = jax.tree.leaves(load.init_params(c)["encoder"]["embeddings"]["tok_embeddings"])[0]
  assert np.abs(np.asarray(other) -
                np.asarray(ours["encoder"]["embeddings"]["tok_embeddings"]["embedding"])).max() > 0.01


def test_report_shows_the_first_scored_pair_and_every_row(pairs):
  text = word_order.report(pairs, {"run@300": 0.824, "random init (its step 0)": 0.616})
  i = int(np.flatnonzero(pairs.test_N)[0])
  assert pairs.real[i] in text and pairs.shuffled[i] in text
  assert "run@300                    82.4%" in text and "random init (its step 0)   61.6%" in text
  assert "chance" in text and "50.0%" in text

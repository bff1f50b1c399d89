"""Packed rows (several texts per row, one segment id each) embed every text as it is alone."""

import jax
import numpy as np

from crossbert_jax.core import config as config_lib
from crossbert_jax.data import corpus, tokenizer as tokenizer_lib
from crossbert_jax.evaluation import embedder
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.training import program, sharding


def _encoder():
  c = config_lib.get_config("crossbert", "tiny")
  c.model.embed_dim, c.model.num_heads, c.model.num_layers, c.model.mlp_dim, c.model.vocab_size = 32, 2, 2, 64, 512
  mesh = sharding.make_mesh(c.mesh, devices=[jax.devices()[0]])
  return EncoderSpec.from_config(c.model), program.TrainProgram(c, mesh).init_state().params["encoder"]


def test_pack_rows_fill_rows_within_length_and_slots():
  lengths = np.random.default_rng(0).integers(2, 40, 500)
  rows = embedder.pack_rows(lengths, 64, 8)
  assert sorted(i for r in rows for i in r) == list(range(500))
  assert all(lengths[r].sum() <= 64 and len(r) <= 8 for r in rows)
  assert len(rows) < 0.6 * 500  # Several texts per row on average.


def test_packed_embeddings_equal_one_text_per_row(spm_model):
  spec, params = _encoder()
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  docs = corpus.builtin_documents()[:400]
  rng = np.random.default_rng(0)
  # Short and long texts (some over the pack length, so both paths run), singles and pairs.
  texts = [" ".join(d.split()[:int(n)]) or "x" for d, n in zip(docs[:200], rng.integers(1, 60, 200))]
  pairs = [" ".join(d.split()[:int(n)]) or "y" for d, n in zip(docs[200:], rng.integers(1, 30, 200))]
  for options in (embedder.Options(max_length=64), embedder.Options(max_length=64, pooling="cls"),
                  embedder.Options(max_length=64, layers=(1, 2))):
    packed = embedder.JaxEmbedder(spec, params, tok, options, pack_length=32)
    alone = embedder.JaxEmbedder(spec, params, tok, options, pack_length=0)
    for b in (None, pairs):
      x, y = packed.embed(texts, b), alone.embed(texts, b)
      assert x.shape == (200, 32) and np.abs(y).max() > 0.1
      np.testing.assert_allclose(x, y, atol=2e-5, err_msg=f"{options} pairs={b is not None}")


def test_rows_sharded_over_all_devices_equal_one_device(spm_model):
  """The default embedder splits every batch over all local devices (8 fake CPU devices in the suite);
  its embeddings equal those of the same embedder on one device."""
  spec, params = _encoder()
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  docs = corpus.builtin_documents()[:300]
  texts = [" ".join(d.split()[:n]) or "x" for d, n in zip(docs, np.random.default_rng(1).integers(1, 90, 300))]
  options = embedder.Options(max_length=64)
  sharded = embedder.JaxEmbedder(spec, params, tok, options, pack_length=32, tokens_per_batch=256)
  single = embedder.JaxEmbedder(spec, params, tok, options, pack_length=32, tokens_per_batch=256,
                                devices=jax.devices()[:1])
  assert sharded._n == len(jax.local_devices()) > 1 and single._n == 1
  np.testing.assert_allclose(sharded.embed(texts), single.embed(texts), atol=2e-5)


def test_long_buckets_on_cpu_keep_their_attention_scores_under_the_budget():
  """tiny (4 heads) embeds 2 rows of 512 tokens a batch, small (8 heads) 1: 4 x 4 MiB and 8 MiB of
  float32 scores; at 256 tokens tiny's 16-row token budget is capped at 8 rows."""
  def rows(variant, length):
    spec = EncoderSpec.from_config(config_lib.get_config("crossbert", variant).model)
    e = embedder.JaxEmbedder.__new__(embedder.JaxEmbedder)  # Only the sizing: no params needed.
    e.spec, e.tokens_per_batch = spec, embedder.TOKENS_PER_BATCH
    return e._long_rows(length)  # pylint: disable=protected-access

  assert jax.default_backend() == "cpu"
  assert (rows("tiny", 512), rows("small", 512), rows("tiny", 256), rows("tiny", 32)) == (2, 1, 8, 128)

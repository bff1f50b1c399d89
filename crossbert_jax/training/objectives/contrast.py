"""The contrastive stage (objective=contrast): the encoder's pooled embeddings under InfoNCE.

A batch (data/contrast_feed.py) holds T texts per example, each tokenised as `[CLS] ids [SEP]` and
padded to data.seq_len: tokens / segment_ids / positions B x T x L and text_ids B x T (data/pairs.text_ids).
recipe=pairs: T = 2 (anchor, positive) or 3 (+ hard negative); recipe=simcse: T = 1, the text embedded
twice under two dropout masks (its two rows in one pass draw independent masks). The rows of an
example stay on the device that holds it: B x T x L -> (B * T) x L keeps the batch sharding.
The loss is `contrastive.info_nce` over the global batch (its candidates are gathered to every
device), pooled by contrast.pooling; with contrast.chunk_size > 0 the gradient is GradCache's
(`contrastive_cache.py`). The params are {"encoder"} (+ "log_temperature" with learn_temperature);
the export keeps the encoder (ModernBertModel, with the run's Pooling and a Normalize module).
Shape letters: B batch, T texts per example, L length, M = B * T rows, D width.
"""

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives as specs
from crossbert_jax.data.special_ids import SpecialIds
from crossbert_jax.model import inference
from crossbert_jax.model.encoder import Encoder, EncoderSpec
from crossbert_jax.training import flops, objectives
from crossbert_jax.training.objectives import contrastive, contrastive_cache, losses

Array = jax.Array
TEXT_KEYS = ("tokens", "segment_ids", "positions")


class ContrastStats(NamedTuple):
  """Summed over the batch's examples, as LossStats (the step divides every field by num_targets)."""
  num_targets: Array  # Examples (anchors).
  num_correct: Array  # Anchors whose own positive scored highest.
  positive_cosine: Array
  negative_cosine: Array
  temperature: Array


class ContrastModel(nn.Module):
  """The encoder (hidden states B x L x D) and, with `learn_temperature`, the log-temperature param."""
  spec: EncoderSpec
  learn_temperature: bool = False
  temperature: float = 0.05

  @nn.compact
  def __call__(self, tokens_BxL: Array, positions_BxL: Array, segment_ids_BxL: Array) -> Array:
    if self.learn_temperature:
      init = lambda key: contrastive.init_log_temperature(self.temperature)
      self.param("log_temperature", nn.with_logical_partitioning(init, ()))
    return Encoder(self.spec, name="encoder")(tokens_BxL, positions_BxL, segment_ids_BxL)


def texts_per_example(c: plan_lib.Settings) -> int:
  """T of a batch: 1 (simcse), 2 (anchor, positive) or 3 (+ hard negative)."""
  k = c.contrast
  return 1 if k.recipe == "simcse" else 3 if k.hard_negatives else 2


def rows_embedded(c: plan_lib.Settings) -> int:
  """Texts embedded per example: SimCSE embeds its one text twice."""
  return 2 if c.contrast.recipe == "simcse" else texts_per_example(c)


class ContrastObjective:
  """The contrastive stage's training half (`objectives.Objective`)."""

  spec = specs.CONTRAST

  def build_model(self, c: plan_lib.Settings) -> ContrastModel:
    return ContrastModel(EncoderSpec.from_config(c.model), c.contrast.learn_temperature, c.contrast.temperature)

  def init_inputs(self, c: plan_lib.Settings, batch: losses.Batch) -> tuple:
    return ()

  def batch_shapes(self, c: plan_lib.Settings) -> dict[str, tuple[int, ...]]:
    """The global batch's arrays (all int32) and their shapes."""
    b, t, seq_len = c.train.batch_size, texts_per_example(c), c.data.seq_len
    return {**{k: (b, t, seq_len) for k in TEXT_KEYS}, "text_ids": (b, t)}

  def _parts(self, c: plan_lib.Settings, model: ContrastModel):
    """(embed_fn, the rows of a batch, loss of the M x D embeddings and params) of the step."""
    k, dropout = c.contrast, c.model.dropout > 0

    def embed(params, rows, key):
      rngs = {"dropout": key} if dropout and key is not None else {}
      hidden_MxLxD = model.apply({"params": params}, rows["tokens"], rows["positions"], rows["segment_ids"], rngs=rngs)
      return inference.pool(hidden_MxLxD, rows["segment_ids"], k.pooling)

    def rows_of(batch):
      texts = {name: batch[name] for name in TEXT_KEYS}
      if k.recipe == "simcse":  # Each text twice, side by side: (anchor, positive) of one example.
        texts = {name: jnp.concatenate([a, a], axis=1) for name, a in texts.items()}
      return {name: a.reshape((-1, a.shape[-1])) for name, a in texts.items()}

    def loss_of(batch):
      ids_BxT = batch["text_ids"]
      b = ids_BxT.shape[0]
      positive_ids = ids_BxT[:, 0] if k.recipe == "simcse" else ids_BxT[:, 1]

      def loss(emb_MxD, params):
        e_BxTxD = emb_MxD.reshape((b, -1, emb_MxD.shape[-1]))
        temperature = (contrastive.temperature_of(params["log_temperature"])
                       if k.learn_temperature else jnp.float32(k.temperature))
        negatives = e_BxTxD[:, 2:] if e_BxTxD.shape[1] > 2 else None
        value, m = contrastive.info_nce(e_BxTxD[:, 0], e_BxTxD[:, 1], negatives, temperature=temperature,
                                        symmetric=k.symmetric, positive_ids_B=positive_ids,
                                        negative_ids=ids_BxT[:, 2:] if negatives is not None else None)
        n = jnp.float32(b)
        stats = ContrastStats(n, m.accuracy * n, m.positive_cosine * n, m.negative_cosine * n, temperature * n)
        return value * n, stats

      return loss

    return embed, rows_of, loss_of

  def make_loss_fn(self, c: plan_lib.Settings, model: ContrastModel, replacement_vocab: int | None,
                   specials: SpecialIds) -> objectives.LossFn:
    del replacement_vocab, specials  # Nothing is masked or replaced.
    embed, rows_of, loss_of = self._parts(c, model)
    chunk = c.contrast.chunk_size

    def contrast_loss(params, batch, key):
      rows = rows_of(batch)
      if chunk:  # As GradCache's forward (the same chunks and keys), so the save's check is the step's loss.
        emb_MxD = contrastive_cache.embed_chunked(embed, params, rows, chunk, key)
      else:
        emb_MxD = embed(params, rows, key)
      return loss_of(batch)(emb_MxD, params)

    return contrast_loss

  def make_grad_fn(self, c: plan_lib.Settings, model: ContrastModel, replacement_vocab: int | None,
                   specials: SpecialIds):
    """(params, batch, key) -> ((summed loss, stats), grads): GradCache's with contrast.chunk_size, else plain."""
    loss_fn = self.make_loss_fn(c, model, replacement_vocab, specials)
    if not c.contrast.chunk_size:
      return jax.value_and_grad(loss_fn, has_aux=True)
    embed, rows_of, loss_of = self._parts(c, model)

    def cached(params, batch, key):
      return contrastive_cache.cached_value_and_grad(embed, loss_of(batch), params, rows_of(batch),
                                                     c.contrast.chunk_size, key, loss_reads_params=True)

    return cached

  def encoder_shape(self, c: plan_lib.Settings) -> tuple[int, int, int]:
    return rows_embedded(c), c.data.seq_len, 0

  def forward_flops(self, c: plan_lib.Settings) -> dict[str, float]:
    # Every text is one full encoder pass; the loss's B x C cosines are negligible beside it. GradCache's second
    # forward is recomputation (as remat's), not counted.
    return {
        "encoder": rows_embedded(c) * flops.encoder_forward_flops(c.model, c.data.seq_len), "reconstructor": 0.0,
        "head": 0.0}


objectives.register(ContrastObjective())

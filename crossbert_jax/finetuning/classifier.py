"""The sequence classifier: our encoder with the head of transformers' `ModernBertForSequenceClassification`.

Param tree {"encoder", "head": {"dense", "norm"}, "classifier": {"kernel", "bias"}}, one tensor per HF tensor
(`model.*`, `head.dense.weight`, `head.norm.weight`, `classifier.weight`, `classifier.bias`): pooling (the
[CLS] state, or the mean over non-pad tokens) -> head (dense without bias, exact GELU, LayerNorm without bias)
-> classifier (dense with bias) -> logits (num_labels; 1 for regression). Init as transformers' `_init_weights`:
head.dense normal(init_std / sqrt(2 N)), classifier normal(D ** -0.5), bias 0 (truncated at 2 std here, 3 there).
Shape letters: B batch, L length, D embed, C labels.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from crossbert_jax.model import inference, layers
from crossbert_jax.model.encoder import Encoder, EncoderSpec

Array = jax.Array
POOLINGS = ("mean", "cls")


@dataclasses.dataclass(frozen=True)
class HeadSpec:
  """The classification head: labels (1: regression) and the pooling (transformers' classifier_pooling)."""
  num_labels: int
  pooling: str = "mean"


class SequenceClassifier(nn.Module):
  """Encoder -> pool -> head -> classifier: float32 logits BxC."""
  encoder_spec: EncoderSpec
  head_spec: HeadSpec

  @nn.compact
  def __call__(self, tokens_BxL: Array, positions_BxL: Array, segment_ids_BxL: Array) -> Array:
    s, h = self.encoder_spec, self.head_spec
    hidden_BxLxD = Encoder(s, name="encoder")(tokens_BxL, positions_BxL, segment_ids_BxL)
    pooled_BxD = inference.pool(hidden_BxLxD, segment_ids_BxL, h.pooling).astype(s.compute_dtype)
    pooled_BxD = nn.with_logical_constraint(pooled_BxD, ("batch", "embed"))
    x_BxD = ClassifierHead(s, name="head")(pooled_BxD)
    return Classifier(h.num_labels, s.embed_dim ** -0.5, name="classifier")(x_BxD)


class ClassifierHead(nn.Module):
  """ModernBertPredictionHead: dense (no bias) -> exact GELU -> LayerNorm (no bias)."""
  spec: EncoderSpec

  @nn.compact
  def __call__(self, x_BxD: Array) -> Array:
    s = self.spec
    std = s.init_std / math.sqrt(2.0 * s.num_layers)
    h_BxD = layers.Dense((s.embed_dim,), ("embed", "mlp"), std, dtype=s.compute_dtype, name="dense")(x_BxD)
    return layers.layer_norm(s.norm_eps, s.compute_dtype, "norm")(nn.gelu(h_BxD, approximate=False))


class Classifier(nn.Module):
  """The output layer: kernel DxC and bias C, float32 logits."""
  num_labels: int
  std: float

  @nn.compact
  def __call__(self, x_BxD: Array) -> Array:
    kernel_DxC = self.param("kernel", layers.init_normal(self.std, ("embed", None)), (x_BxD.shape[-1], self.num_labels),
                            jnp.float32)
    bias_C = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (None,)), (self.num_labels,),
                        jnp.float32)
    logits_BxC = jnp.einsum("bd,dc->bc", x_BxD, kernel_DxC.astype(x_BxD.dtype), preferred_element_type=jnp.float32)
    return logits_BxC + bias_C[None, :]


def abstract_params(encoder_spec: EncoderSpec, head: HeadSpec) -> dict:
  """The classifier's params as shapes and dtypes (nothing allocated)."""
  model = SequenceClassifier(encoder_spec, head)
  ones = jnp.ones((1, 8), jnp.int32)
  return nn.unbox(jax.eval_shape(lambda k: model.init(k, ones, jnp.zeros_like(ones), ones)["params"],
                                 jax.random.key(0)))

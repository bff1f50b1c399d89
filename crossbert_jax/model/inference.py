"""Running a trained encoder on text: tokenise, pad, encode, pool.

The layout matches Hugging Face `ModernBertModel` + sentence-transformers pooling: a text is
`[CLS] ids [SEP]`, a pair `[CLS] a [SEP] b [SEP]`; the embedding is the mean of the final hidden
states over the non-pad tokens, CLS and SEP included (`pooling_mode_mean_tokens`), or the first
(CLS) state (`pooling_mode_cls_token`).
Shape letters: B batch, L length, D embed, N layers + 1.
"""

from typing import Callable

import jax
import jax.numpy as jnp

from crossbert_jax.data.text_rows import pad_batch, tokenize  # noqa: F401 - re-exported (tokenise, pad).
from crossbert_jax.model.encoder import Encoder, EncoderSpec

Array = jax.Array


def mean_pool(hidden_BxLxD: Array, segment_ids_BxL: Array) -> Array:
  """Mean over non-pad tokens, in float32."""
  w_BxL = (segment_ids_BxL > 0).astype(jnp.float32)
  summed_BxD = jnp.einsum("bld,bl->bd", hidden_BxLxD.astype(jnp.float32), w_BxL)
  return summed_BxD / jnp.maximum(w_BxL.sum(-1, keepdims=True), 1.0)


def cls_pool(hidden_BxLxD: Array) -> Array:
  """The first ([CLS]) state of each row, in float32."""
  return hidden_BxLxD[:, 0].astype(jnp.float32)


POOLINGS = ("mean", "cls")


def pool(hidden_BxLxD: Array, segment_ids_BxL: Array, pooling: str) -> Array:
  """BxD float32 embeddings by `pooling` (one of POOLINGS), as sentence-transformers' Pooling module."""
  if pooling == "cls":
    return cls_pool(hidden_BxLxD)
  if pooling == "mean":
    return mean_pool(hidden_BxLxD, segment_ids_BxL)
  raise ValueError(f"pooling={pooling!r}: use one of {POOLINGS}")


def make_encode_fn(spec: EncoderSpec, all_layers: bool = False) -> Callable[..., Array]:
  """jitted (encoder_params, tokens, positions, segment_ids) -> BxLxD final hidden states.

  With all_layers, returns NxBxLxD: the embedding output, then each block (the last one after
  the final norm, i.e. the model's output).
  """
  model = Encoder(spec)

  def fn(encoder_params, tokens_BxL, positions_BxL, segment_ids_BxL):
    out = model.apply({"params": encoder_params}, tokens_BxL, positions_BxL, segment_ids_BxL,
                      return_all_layers=all_layers)
    if not all_layers:
      return out
    final_BxLxD, layers = out
    return jnp.stack(layers[:-1] + [final_BxLxD])

  return jax.jit(fn)

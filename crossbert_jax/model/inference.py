"""Running a trained encoder on text: tokenise, pad, encode, pool.

The layout matches Hugging Face `ModernBertModel` + sentence-transformers pooling: a text is
`[CLS] ids [SEP]`, a pair `[CLS] a [SEP] b [SEP]`; the embedding is the mean of the final hidden
states over the non-pad tokens, CLS and SEP included (`pooling_mode_mean_tokens`), or the first
(CLS) state (`pooling_mode_cls_token`).
Shape letters: B batch, L length, D embed, N layers + 1.
"""

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.data.special_ids import SENTENCEPIECE
from crossbert_jax.model.encoder import Encoder, EncoderSpec

Array = jax.Array


def tokenize(tok: tokenizer_lib.AnyTokenizer, texts: Sequence[str], pairs: Sequence[str] | None = None,
             max_length: int = 512) -> list[list[int]]:
  """Token ids with specials, truncated to max_length (a pair trims the longer side first)."""
  firsts = tok.encode_batch(list(texts))
  seconds = tok.encode_batch(list(pairs)) if pairs is not None else None
  cls, sep = tok.special_ids.cls, tok.special_ids.sep
  out = []
  for i, a in enumerate(firsts):
    if seconds is None:
      out.append([cls] + a[:max_length - 2] + [sep])
      continue
    b = seconds[i]
    budget = max_length - 3
    while len(a) + len(b) > budget:
      if len(a) >= len(b):
        a = a[:-1]
      else:
        b = b[:-1]
    out.append([cls] + a + [sep] + b + [sep])
  return out


def pad_batch(seqs: Sequence[Sequence[int]], length: int, pad_id: int = SENTENCEPIECE.pad) -> dict[str, np.ndarray]:
  """int32 tokens / segment_ids (1 real, 0 pad) / positions, each [len(seqs), length]."""
  b = len(seqs)
  tokens = np.full((b, length), pad_id, np.int32)
  segment_ids = np.zeros((b, length), np.int32)
  positions = np.zeros((b, length), np.int32)
  for i, s in enumerate(seqs):
    n = min(len(s), length)
    tokens[i, :n] = s[:n]
    segment_ids[i, :n] = 1
    positions[i, :n] = np.arange(n)
  return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions}


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

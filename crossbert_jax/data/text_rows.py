"""Texts as rows of their own: `[CLS] ids [SEP]` (a pair `[CLS] a [SEP] b [SEP]`), truncated and padded.

The layout of Hugging Face `ModernBertModel`'s inputs, which the evaluation embedder, the export's
check (model/inference.py re-exports both functions) and the contrastive stage's batches
(data/contrast_feed.py) share. Shape letters: B rows, L length.
"""

from typing import Sequence

import numpy as np

from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.data.special_ids import SENTENCEPIECE


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

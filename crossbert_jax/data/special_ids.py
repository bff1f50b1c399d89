"""The special token ids of a tokenizer: what packing, masking, inference and export read.

SentencePiece models made here put [PAD] [UNK] [CLS] [SEP] [MASK] at 0-4 (`SENTENCEPIECE`); a
Hugging Face tokenizer puts them where its file says (ModernBERT: 50280-50284, among other
special tokens at both ends of its vocabulary). `reserved` holds every special id: none is ever a
prediction target (with masking.exclude_special) nor a random replacement.
"""

from typing import NamedTuple

import numpy as np


class SpecialIds(NamedTuple):
  """The role ids and the reserved set (sorted, holding the roles); hashable, so a jit-static value."""
  pad: int
  unk: int
  cls: int
  sep: int
  mask: int
  reserved: tuple[int, ...]

  @classmethod
  def of(cls, pad: int, unk: int, cls_: int, sep: int, mask: int, others: tuple[int, ...] = ()) -> "SpecialIds":
    """The roles plus `others` (more special ids) as one value; `unk` < 0: the tokenizer has none."""
    roles = (pad, unk, cls_, sep, mask)
    return cls(pad, unk, cls_, sep, mask, tuple(sorted({int(i) for i in (*roles, *others) if i >= 0})))

  @property
  def is_sentencepiece_layout(self) -> bool:
    """The layout of SentencePiece models made here: roles 0-4, nothing else reserved."""
    return self == SENTENCEPIECE

  def target_exclusions(self) -> tuple[int, ...]:
    """Ids that are never prediction targets (masking.exclude_special).

    The SentencePiece layout keeps [CLS] and [SEP] alone, so runs trained before resume on the
    same step program; any other layout excludes every reserved id.
    """
    return (self.cls, self.sep) if self.is_sentencepiece_layout else self.reserved

  def replacement_range(self, vocab_end: int) -> tuple[int, int] | np.ndarray:
    """The ids BERT's random replacements draw from, below `vocab_end`, reserved ids left out.

    A contiguous run as (first, end) (SentencePiece: (5, V); ModernBERT-like: the ids below the
    first special), else the sorted int32 array of every regular id.
    """
    regular = np.setdiff1d(np.arange(vocab_end, dtype=np.int32), np.asarray(self.reserved, np.int32))
    if not len(regular):
      raise ValueError(f"no regular ids below {vocab_end}: every id is reserved")
    if regular[-1] - regular[0] + 1 == len(regular):
      return int(regular[0]), int(regular[-1]) + 1
    return regular


SENTENCEPIECE = SpecialIds.of(0, 1, 2, 3, 4)

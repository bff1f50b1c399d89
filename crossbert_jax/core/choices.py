"""The config's closed choices, each declared once as a str Enum (a member equals its string).

The config keeps plain strings (ml_collections, checkpoints of older runs); validation, flags and
code compare against these members, so a choice's spelling lives here alone.
"""

import enum

from crossbert_jax.core.errors import config_error


class TextUnit(str, enum.Enum):
  """What one document is in a plain-text file (data.text_unit, a mixture source's text_unit)."""
  LINE = "line"
  PARAGRAPH = "paragraph"  # Blank-line separated.
  FILE = "file"


class Remat(str, enum.Enum):
  """model.remat: what the backward pass recomputes."""
  NONE = "none"
  FULL = "full"
  DOTS = "dots"
  AUTO = "auto"  # The least of none / dots / full whose compiled step fits (training/memory.py).


class Dtype(str, enum.Enum):
  """model.dtype: the compute dtype (params stay float32)."""
  FLOAT32 = "float32"
  BFLOAT16 = "bfloat16"


class Attention(str, enum.Enum):
  """model.attention: the attention kernel (model/attention.py)."""
  AUTO = "auto"
  XLA = "xla"
  CHUNKED = "chunked"
  SPLASH = "splash"
  GPU_FLASH = "gpu_flash"
  CUDNN = "cudnn"


class Decay(str, enum.Enum):
  """train.decay: the learning-rate schedule after warmup."""
  COSINE = "cosine"
  LINEAR = "linear"
  WSD = "wsd"


class DecayShape(str, enum.Enum):
  """train.decay_shape: the WSD decay's shape."""
  LINEAR = "linear"
  ONE_MINUS_SQRT = "1-sqrt"


class EvalSplits(str, enum.Enum):
  """eval.splits: which test split(s) a probe reports."""
  FIRST = "first"
  ALL = "all"


class Pooling(str, enum.Enum):
  """contrast.pooling: how a text's hidden states become its embedding (the export's Pooling module)."""
  MEAN = "mean"  # Over the non-pad tokens, CLS and SEP included.
  CLS = "cls"


class Padding(str, enum.Enum):
  """contrast.padding: the length a contrastive batch's texts are padded to."""
  MAX = "max"  # data.seq_len, every batch.
  BATCH = "batch"  # The shortest of contrast_feed.pad_lengths that holds the batch's longest text.


class Recipe(str, enum.Enum):
  """contrast.recipe: where the contrastive stage's positives come from."""
  SIMCSE = "simcse"  # Each text of a corpus against itself under another dropout mask.
  PAIRS = "pairs"  # (anchor, positive[, negative]) rows of a pair file.


def values(choice: type[enum.Enum]) -> list[str]:
  """The strings a key of this choice accepts, in declaration order (for flags and messages)."""
  return [member.value for member in choice]


def check(key: str, value: object, choice: type[enum.Enum]) -> None:
  """A config_error naming `key` and the accepted strings unless `value` is one of them."""
  if value not in values(choice):
    raise config_error(key, f"{value!r}: use one of {', '.join(values(choice))}")

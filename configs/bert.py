r"""Flat BERT baseline: the same encoder, 80/10/10 corruption, MLM head on the masked positions.

Variants: tiny (CPU tests, minutes), small (benchmark shape), base (~ModernBERT-base), large, from_hf and
from_hf_cpu (continued pretraining of an import: docs/continued_pretraining.md).
Launch:
  python -m crossbert_jax.train --config=configs/bert.py:tiny --workdir=runs/bert_tiny \
      --config.data.tokenizer=runs/tok/spm.model
  python -m crossbert_jax.train --config=configs/bert.py:base --workdir=gs://bucket/bert_base \
      --config.masking.ratio=0.3 --config.data.path='gs://bucket/corpus/*.arrayrecord'
Defaults: masking ratio 0.15 (the paper's comparison also runs 0.30).
"""

from crossbert_jax.core import config as config_lib


def from_hf():
  """Continued MLM pretraining of an imported Hugging Face model, as configs/crossbert.py:from_hf; an
  imported ModernBertForMaskedLM keeps its MLM head."""
  c = config_lib.get_config("mlm", "base")
  c.train.shape_from_init = True
  c.train.learning_rate = 1e-4  # The encoder is trained already: a lower peak than from scratch.
  return c


def from_hf_cpu():
  """from_hf for a trial on a CPU, as configs/crossbert.py:from_hf_cpu."""
  return config_lib.on_cpu(from_hf())


def get_config(variant: str = "tiny"):
  if variant == "from_hf":
    return from_hf()
  if variant == "from_hf_cpu":
    return from_hf_cpu()
  return config_lib.get_config("mlm", variant)

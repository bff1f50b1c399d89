r"""Flat BERT baseline: the same encoder, 80/10/10 corruption, MLM head on the masked positions.

Variants: tiny (CPU tests, minutes), small (benchmark shape), base (~ModernBERT-base), large.
Launch:
  python -m crossbert_jax.train --config=configs/bert.py:tiny --workdir=runs/bert_tiny \
      --config.data.tokenizer=runs/tok/spm.model
  python -m crossbert_jax.train --config=configs/bert.py:base --workdir=gs://bucket/bert_base \
      --config.masking.ratio=0.3 --config.data.path='gs://bucket/corpus/*.arrayrecord'
Defaults: masking ratio 0.15 (the paper's comparison also runs 0.30).
"""

from crossbert_jax.core import config as config_lib


def get_config(variant: str = "tiny"):
  return config_lib.get_config("mlm", variant)

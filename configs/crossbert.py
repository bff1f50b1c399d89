r"""CrossBERT: encoder on the visible tokens, reconstructor for the masked ones (DESIGN §2).

Variants: tiny (CPU tests, minutes), small (benchmark shape), base (~ModernBERT-base), large.
Launch:
  python -m crossbert_jax.train --config=configs/crossbert.py:tiny --workdir=runs/cb_tiny \
      --config.data.tokenizer=runs/tok/spm.model
  python -m crossbert_jax.train --config=configs/crossbert.py:base --workdir=gs://bucket/cb_base \
      --config.data.path='gs://bucket/corpus/*.arrayrecord' --config.data.tokenizer=gs://bucket/spm.model
Defaults: complementary masking, K = 2 views at ratio 0.5.
"""

from crossbert_jax.core import config as config_lib


def get_config(variant: str = "tiny"):
  return config_lib.get_config("crossbert", variant)

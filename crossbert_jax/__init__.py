"""crossbert_jax: pretrain CrossBERT (and flat BERT) text encoders in JAX/Flax, evaluate them frozen,
export them to Hugging Face.

The packages' layers and each module's concern: docs/layout.md (the ranks are checked by
tests/unit/test_layout.py); the path of the plan and of a batch: docs/architecture.md.
"""

__version__ = "0.1.0"

"""crossbert_jax: pretrain CrossBERT (and flat BERT) text encoders in JAX/Flax."""

__version__ = "0.1.0"

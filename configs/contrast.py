r"""The contrastive stage (objective=contrast): a pretrained encoder -> a sentence-embedding model.

Variants: tiny_pairs and tiny_simcse (CPU, a few minutes), base_pairs and base_simcse (one accelerator).
The model's shape and tokenizer come from contrast.init_from (a pretraining run's workdir or an
`export import` folder), so one variant serves any source of its size.
Launch:
  python -m crossbert_jax.contrast --config=configs/contrast.py:tiny_pairs --workdir=runs/emb \
      --config.contrast.init_from=runs/cb --config.data.path=runs/pairs.jsonl
  python -m crossbert_jax.contrast --config=configs/contrast.py:tiny_simcse --workdir=runs/simcse \
      --config.contrast.init_from=runs/cb --config.data.path=builtin
Sources of the recipes (docs/embedding.md): SimCSE (Gao et al. 2021: dropout 0.1, temperature 0.05,
batch 64, lr 3e-5, 1M sentences, L = 32) and ModernBERT's train_st.py (MS MARCO triplets, batch 512,
a cached MultipleNegativesRankingLoss: scale 20 = temperature 0.05, lr 8e-5, warmup 5%, one epoch).
"""

from crossbert_jax.core import config as config_lib


def _common(variant: str, recipe: str):
  c = config_lib.get_config("contrast", variant)
  c.contrast.recipe = recipe
  c.train.decay = "linear"  # sentence-transformers' default schedule: linear warmup, linear decay.
  c.train.final_lr_ratio = 0.0
  c.train.weight_decay = 0.01
  c.masking.exclude_special = True  # Unused: nothing is masked.
  return c


def _tiny(recipe: str):
  """The CPU size: 200 steps of 32 rows at L = 32."""
  c = _common("tiny", recipe)
  c.data.seq_len = 32
  c.train.batch_size = 32
  c.train.steps = 200
  c.train.warmup_steps = 20
  c.train.learning_rate = 3e-4
  c.checkpoint.every_steps = 100
  c.metrics.log_every = 10
  return c


def tiny_pairs():
  """200 steps of 32 (anchor, positive, hard negative) triplets at L = 32, e.g. SNLI's (docs/embedding.md)."""
  c = _tiny("pairs")
  c.contrast.hard_negatives = True
  return c


def tiny_simcse():
  """200 steps of SimCSE on 32 documents per step of data.path (the built-in corpus by default), L = 32."""
  c = _tiny("simcse")
  c.model.dropout = 0.1
  c.data.text_unit = "line"
  return c


def base_pairs():
  """ModernBERT's train_st.py: one epoch of 1.25M MS MARCO triplets at batch 512 (2,442 steps), lr 8e-5,
  5% warmup, GradCache over chunks of 64 texts (1,536 texts a step), L <= 256 padded per batch as theirs, bf16."""
  c = _common("base", "pairs")
  c.contrast.hard_negatives = True
  c.contrast.chunk_size = 64
  c.contrast.padding = "batch"
  c.data.seq_len = 256
  c.train.batch_size = 512
  c.train.steps = 2442
  c.train.warmup_steps = 122
  c.train.learning_rate = 8e-5
  c.checkpoint.every_steps = 500
  return c


def base_simcse():
  """SimCSE's unsupervised recipe: 1M sentences once at batch 64 (15,625 steps), lr 3e-5, L = 32, dropout 0.1."""
  c = _common("base", "simcse")
  c.model.dropout = 0.1
  c.data.text_unit = "line"
  c.data.seq_len = 32
  c.train.batch_size = 64
  c.train.steps = 15_625
  c.train.warmup_steps = 0
  c.train.learning_rate = 3e-5
  c.checkpoint.every_steps = 2000
  return c


_VARIANTS = {"tiny_pairs": tiny_pairs, "tiny_simcse": tiny_simcse, "base_pairs": base_pairs, "base_simcse": base_simcse}


def get_config(variant: str = "tiny_pairs"):
  if variant not in _VARIANTS:
    from crossbert_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
    raise UserError(
        f"config variant {variant!r}: use one of {', '.join(_VARIANTS)} (e.g. configs/contrast.py:tiny_pairs)")
  return _VARIANTS[variant]()

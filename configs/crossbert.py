r"""CrossBERT: encoder on the visible tokens, reconstructor for the masked ones.

Variants: tiny (CPU tests, minutes), small (benchmark shape), base (~ModernBERT-base), large,
from_hf / from_hf_cpu (continued pretraining of an import: docs/continued_pretraining.md), and
two phased recipes (docs/training.md, "Phases"): base_recipe (ModernBERT's schedule at our
scale) and tiny_recipe (the same on CPU: 70 s on 2 idle cores).
Launch:
  python -m crossbert_jax.train --config=configs/crossbert.py:tiny --workdir=runs/cb_tiny \
      --config.data.tokenizer=runs/tok/spm.model
  python -m crossbert_jax.train --config=configs/crossbert.py:base --workdir=gs://bucket/cb_base \
      --config.data.path='gs://bucket/corpus/*.arrayrecord' --config.data.tokenizer=gs://bucket/spm.model
  python -m crossbert_jax.compile --config=configs/crossbert.py:base_recipe --topology=v5p:4x4x8
Defaults: complementary masking, K = 2 views at ratio 0.5.
"""

from crossbert_jax.core import config as config_lib


def base_recipe():
  """ModernBERT-base's schedule at our scale (~105B tokens): a long 1,024-token phase whose batch
  ramps from 128 to 512 sequences over its first 3B tokens, then 10k steps of 8,192-token context
  extension (128 sequences: 1M tokens per step, one per chip of a v5p-256) with the global RoPE
  theta raised from 10k to 160k, a lower peak and the WSD decay (its last 9,500 steps), reading
  other documents (its own shuffle seed)."""
  c = config_lib.get_config("crossbert", "base")
  c.model.global_every = 3  # ModernBERT: a global layer every third, the others local (128 tokens).
  c.train.steps = 190_000
  c.train.batch_size = 512
  c.train.warmup_steps = 3000
  c.train.decay = "wsd"
  c.train.decay_fraction = 0.05  # The last 9,500 steps: inside the context extension.
  c.train.batch_ramp.start = 128
  c.train.batch_ramp.tokens = 3_000_000_000
  c.train.batch_ramp.stages = 3  # 128, 256, 384 sequences, then 512.
  c.train.phases = (
      {"steps": 180_000, "data.seq_len": 1024, "model.rope_theta": 10_000.0},
      {
          "data.seq_len": 8192, "train.batch_size": 128, "model.rope_theta": 160_000.0, "train.learning_rate": 3e-4,
          "data.shuffle_seed": 1},
  )
  return c


def tiny_recipe():
  """base_recipe on CPU: 160 steps at L=64 (a batch ramp: 8 sequences for the first 20 steps, then 16),
  then 40 steps at L=128 with a larger RoPE theta and the WSD decay, on a two-source mixture."""
  c = config_lib.get_config("crossbert", "tiny")
  c.train.steps = 200
  c.train.warmup_steps = 20
  c.train.decay = "wsd"
  c.train.decay_fraction = 0.1  # The last 20 steps.
  c.checkpoint.every_steps = 50
  c.metrics.log_every = 10
  c.train.batch_ramp.start = 8
  c.train.batch_ramp.steps = 20
  c.train.batch_ramp.stages = 1  # One stair: each distinct batch x length compiles its own step.
  c.train.phases = (
      {"steps": 160, "data.seq_len": 64, "model.rope_theta": 10_000.0},
      {"data.seq_len": 128, "train.batch_size": 8, "model.rope_theta": 160_000.0, "data.shuffle_seed": 1},
  )
  # Two sources, 70:30 by documents, in both phases: the built-in corpus and the shared WikiText-2
  # (../shared/data, as the experiments/ specs; a fresh clone without it: drop the second source).
  c.data.mixture = ({"path": "builtin",
                     "weight": 0.7}, {"path": "../shared/data/wikitext-2/valid.txt", "weight": 0.3, "name": "wikitext"})
  return c


def from_hf():
  """Continued pretraining of an imported Hugging Face model (docs/continued_pretraining.md): pass
  --config.train.init_from=IMP (from `export import`); the model shape comes from IMP's config.json
  and the tokenizer, unless data.tokenizer is set, from IMP. The reconstructor starts fresh."""
  c = config_lib.get_config("crossbert", "base")
  c.train.shape_from_init = True
  c.train.learning_rate = 1e-4  # The encoder is trained already: a lower peak than from scratch.
  return c


def from_hf_cpu():
  """from_hf for a trial on a CPU (a tiny import, or a few steps of a real one): float32, no remat,
  batch 8 x 128 tokens, 10 warmup steps of 100 (core/config.CPU_TRIAL)."""
  return config_lib.on_cpu(from_hf())


_RECIPES = {"base_recipe": base_recipe, "tiny_recipe": tiny_recipe, "from_hf": from_hf, "from_hf_cpu": from_hf_cpu}


def get_config(variant: str = "tiny"):
  if variant in _RECIPES:
    return _RECIPES[variant]()
  return config_lib.get_config("crossbert", variant)

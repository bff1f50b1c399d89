"""Training objectives behind one seam: `loss_fn(params, batch, key) -> (summed loss, stats)`.

Each objective is one module registered by name (core/objectives.py): crossbert.py (encoder on the
visible tokens of K complementary views, a reconstructor predicts the rest) and mlm.py (the flat
BERT baseline). Adding one: a module with an `Objective` that calls `register`, and a configs/*.py.
"""

from typing import Any

import flax.linen as nn
import jax
import ml_collections

from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds
from crossbert_jax.training.objectives.losses import (  # noqa: F401 - the shared loss parts, re-exported.
    Batch, LossStats, _token_losses, chunked_cross_entropy, dummy_batch, replacement_vocab_size, targetable)
from crossbert_jax.core.objectives import LossFn, Objective, get, names, register  # noqa: F401


def build_model(c: ml_collections.ConfigDict) -> nn.Module:
  """The model for `c.objective`."""
  return get(c.objective).build_model(c)


def make_loss_fn(c: ml_collections.ConfigDict, replacement_vocab: int | None = None,
                 specials: SpecialIds = SENTENCEPIECE) -> LossFn:
  """The loss function for `c.objective` (params, batch, key) -> (summed loss, stats).

  `replacement_vocab`: where BERT's random replacement ids end (`replacement_vocab_size`, from
  the run's tokenizer); shape-only callers leave it None and get model.vocab_size. `specials`:
  the tokenizer's special ids (never targets, never random replacements, [MASK]).
  """
  objective = get(c.objective)
  return objective.make_loss_fn(c, objective.build_model(c), replacement_vocab, specials)


def init_params(c: ml_collections.ConfigDict, key: jax.Array, batch_size: int = 1) -> Any:
  """Initialises the (boxed, logically partitioned) params of `c.objective`'s model."""
  objective = get(c.objective)
  batch = dummy_batch(batch_size, c.data.seq_len)
  return objective.build_model(c).init(key, batch["tokens"], batch["positions"], batch["segment_ids"],
                                       *objective.init_inputs(c, batch))["params"]

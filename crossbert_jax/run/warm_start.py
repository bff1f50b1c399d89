"""`train.init_from`: a fresh run whose encoder (and MLM head) start from an imported HF model.

The imported model's config must share the encoder's shape and positional keys with the run's
(`IMPORT_KEYS`); the params are copied onto the fresh state's shardings, everything else (the
reconstructor, the optimizer state) stays freshly initialised.
"""

import jax
import ml_collections
import numpy as np

from crossbert_jax.core.errors import UserError
from crossbert_jax.hf import import_config
from crossbert_jax.training.program import TrainState

# Model keys an imported encoder must share with the run's config.
IMPORT_KEYS = import_config.SHAPE_KEYS


def from_imported(c: ml_collections.ConfigDict, state: TrainState) -> TrainState:
  """The fresh `state` with its encoder (and MLM head) replaced by `c.train.init_from`'s params."""
  from crossbert_jax.hf import convert  # Local: pulls in the Hugging Face conversion code.

  imported_cfg, imported = convert.load_imported(c.train.init_from)
  for k in IMPORT_KEYS:
    if imported_cfg.model[k] != c.model[k]:
      raise UserError(f"config train.init_from={c.train.init_from} has model.{k}={imported_cfg.model[k]!r} but "
                      f"the config says {c.model[k]!r}; set --config.model.{k}={imported_cfg.model[k]!r}")
  params = dict(state.params)
  for part in ("encoder", "head"):
    if part in imported and part in params:
      params[part] = jax.tree.map(lambda new, old: jax.device_put(np.asarray(new, old.dtype), old.sharding),
                                  imported[part], params[part])
  return state.replace(params=params)

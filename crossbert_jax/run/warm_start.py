"""`train.init_from`: a fresh run whose encoder (and MLM head) start from an imported HF model or a run.

The source is an `export import` folder, or a training run's workdir (the params of its newest
readable checkpoint, `load.load_run`: the contrastive stage starts from a pretraining run this way).
Its config must share the encoder's shape and positional keys with the run's (`IMPORT_KEYS`), the
run's tokenizer must be the source's (its embedding rows are that tokenizer's ids), and an objective
with an MLM head needs the source's head; the params are copied onto the fresh state's shardings,
everything else (a reconstructor, the optimizer state) stays freshly initialised.
"""

import jax
import numpy as np
from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.hf import import_config
from crossbert_jax.run import checkpoint, load, resume
from crossbert_jax.training.program import TrainState

# Model keys an imported encoder must share with the run's config.
IMPORT_KEYS = import_config.SHAPE_KEYS
# Embedding rows an import may hold past its tokenizer's ids (vocabularies padded for the MXU), checked when
# the import has no tokenizer to compare with.
MAX_PADDING_ROWS = 256


def from_imported(c: plan_lib.Settings, state: TrainState, tok: tokenizer_lib.AnyTokenizer) -> TrainState:
  """The fresh `state` with its encoder (and MLM head) replaced by `c.train.init_from`'s params."""
  key = import_config.init_key(c)
  if import_config.is_run(c.train.init_from):
    imported_cfg, imported, step = load.load_run(c.train.init_from)
    check_run_tokenizer(c, tok, step)
  else:
    from crossbert_jax.hf import convert  # Local: pulls in the Hugging Face conversion code.
    imported_cfg, imported = convert.load_imported(c.train.init_from)
    check_tokenizer(c, tok, imported_cfg.model.vocab_size)
  for k in IMPORT_KEYS:
    if imported_cfg.model[k] != c.model[k]:
      raise UserError(f"config {key}={c.train.init_from} has model.{k}={imported_cfg.model[k]!r} but "
                      f"the config says {c.model[k]!r}; set --config.model.{k}={imported_cfg.model[k]!r}")
  if objectives.get(c.objective).exports_mlm_head and "head" not in imported:
    raise UserError(f"config {key}={c.train.init_from} holds no MLM head (its model had none, e.g. a "
                    f"ModernBertModel), so {c.objective} would train a fresh head on the imported encoder: import a "
                    "ModernBertForMaskedLM, or continue this one with configs/crossbert.py:from_hf")
  params = dict(state.params)
  for part in ("encoder", "head"):
    if part in imported and part in params:
      params[part] = jax.tree.map(lambda new, old: jax.device_put(np.asarray(new, old.dtype), old.sharding),
                                  imported[part], params[part])
  return state.replace(params=params)


def check_run_tokenizer(c: plan_lib.Settings, tok: tokenizer_lib.AnyTokenizer, step: int) -> None:
  """Refuses a data.tokenizer that is not the one the source run's checkpoint `step` records."""
  ckpt = checkpoint.Checkpointer.reader(c.train.init_from, read_only=False)  # As load.load_run: no warnings.
  try:
    recorded = ckpt.saved_meta(step).tokenizer
  finally:
    ckpt.close()
  change = recorded and resume.tokenizer_change(recorded, resume.tokenizer_identity(c.data.tokenizer, tok),
                                                "data.tokenizer")
  if change:
    raise UserError(f"config {import_config.init_key(c)}={c.train.init_from} (step {step}) was trained with "
                    f"{change}: its embedding rows are that tokenizer's ids; leave data.tokenizer empty (the run's "
                    "is used) or set it to the run's")


def check_tokenizer(c: plan_lib.Settings, tok: tokenizer_lib.AnyTokenizer, rows: int) -> None:
  """Refuses a data.tokenizer that is not the import's: another file or other special ids than the
  tokenizer.json beside its params, or (an import without one) far fewer ids than its `rows` embedding rows."""
  folder = epath.Path(c.train.init_from)
  where = f"config train.init_from={folder}"
  if (folder / "tokenizer.json").is_file():
    theirs = resume.tokenizer_identity(str(folder), tokenizer_lib.Tokenizer.load(folder))
    change = resume.tokenizer_change(theirs, resume.tokenizer_identity(c.data.tokenizer, tok), "data.tokenizer")
    if change:
      raise UserError(f"{where} was trained with {change}: its embedding rows are that tokenizer's ids; leave "
                      f"data.tokenizer empty (the import's is used) or set it to {folder}")
  elif rows - tok.vocab_size > MAX_PADDING_ROWS:
    raise UserError(f"{where} has {rows} embedding rows but data.tokenizer={c.data.tokenizer} only {tok.vocab_size} "
                    "ids: it is not the tokenizer the model was trained with; set data.tokenizer to that one")

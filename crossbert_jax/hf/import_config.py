"""A run that continues an imported model: its shape and tokenizer come from the imported folder.

`export import` writes the folder (params, our config.json, the model's tokenizer files); with
`train.shape_from_init` (configs/*.py:from_hf) the run's `model.*` shape keys are that folder's,
and an empty `data.tokenizer` becomes the folder itself (its tokenizer.json).
"""

import json
import shutil

from etils import epath

from crossbert_jax.core import config as config_lib
from crossbert_jax.core.errors import UserError

# The tokenizer files a model folder may hold, copied by `export import`.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Reconstructor keys that default to the encoder's (core/config.py): they follow the import unless set.
FOLLOWING_KEYS = ("embed_dim", "num_heads", "mlp_dim")
# Model keys that fix the imported encoder's params (`run.warm_start` checks them again).
SHAPE_KEYS = ("vocab_size", "embed_dim", "num_heads", "num_layers", "mlp_dim", "global_every", "local_window",
              "rope_theta", "local_rope_theta", "norm_eps", "scan_layers")


def copy_tokenizer(hf: epath.Path, out: epath.Path) -> None:
  """Copies `hf`'s tokenizer files (those it has) into `out`."""
  for name in TOKENIZER_FILES:
    if (hf / name).is_file():
      if "://" in str(hf) or "://" in str(out):
        (out / name).write_bytes((hf / name).read_bytes())
      else:
        shutil.copyfile(hf / name, out / name)


def _imported_model(folder: epath.Path) -> dict:
  path = folder / "config.json"
  if not path.is_file():
    raise UserError(f"config train.init_from={folder} holds no config.json: make it with "
                    "`python -m crossbert_jax.export import --hf=DIR --output=DIR`")
  try:
    model = json.loads(path.read_text())["model"]
    return {k: model[k] for k in SHAPE_KEYS}
  except (ValueError, KeyError, TypeError):
    raise UserError(f"config train.init_from={folder}: its config.json is not one `export import` wrote; "
                    "re-run `python -m crossbert_jax.export import --hf=DIR --output=DIR`") from None


def resolve(c: config_lib.ConfigDict) -> config_lib.ConfigDict:
  """`c` with train.init_from's shape and (if unset) tokenizer when train.shape_from_init; else `c`.

  The fresh reconstructor's width, heads and MLP follow the imported encoder's where they equal the
  config's encoder values (their default); a value set apart from those stays.
  """
  if not c.train.shape_from_init:
    return c
  if not c.train.init_from:
    raise UserError("config train.shape_from_init is set but train.init_from is empty: pass "
                    "--config.train.init_from=IMP, a folder from `python -m crossbert_jax.export import`")
  folder = epath.Path(c.train.init_from)
  model = _imported_model(folder)
  out = c.copy_and_resolve_references()
  following = [k for k in FOLLOWING_KEYS if out.reconstructor[k] == out.model[k]]
  with out.unlocked():
    for k, v in model.items():
      out.model[k] = v
    for k in following:
      out.reconstructor[k] = out.model[k]
    if not out.data.tokenizer and (folder / "tokenizer.json").is_file():
      out.data.tokenizer = str(folder)
  out.lock()
  return out

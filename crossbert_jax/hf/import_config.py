"""A run that continues an imported model or another run: its shape and tokenizer come from that source.

`export import` writes the folder (params, our config.json, the model's tokenizer files); with
`train.shape_from_init` (configs/*.py:from_hf) the run's `model.*` shape keys are that folder's,
and an empty `data.tokenizer` becomes the folder itself (its tokenizer.json). The source may also be
a training run's workdir (its config.json; its tokenizer, `data.tokenizer`): the contrastive stage
starts from either. An objective naming its source in a key of its own (`ObjectiveSpec.init_from_key`,
`contrast.init_from`) gets train.init_from and shape_from_init from it here.
"""

import json
import shutil

from etils import epath

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import objectives
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib

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


def init_key(c) -> str:
  """The config key a user names the source with: the objective's own (contrast.init_from), else train.init_from."""
  return objectives.get(c.objective).init_from_key or "train.init_from"


def is_run(folder: str | epath.Path) -> bool:
  """Whether `folder` is a training run's workdir (a checkpoints/ folder beside its config.json)."""
  return (epath.Path(folder) / "checkpoints").is_dir()


def _source(folder: epath.Path, key: str) -> tuple[dict, dict]:
  """(shape keys, the whole saved config) of an import folder or a run's workdir; UserError for anything else."""
  path = folder / "config.json"
  run = is_run(folder)
  if run and not any(p.name.isdigit() for p in (folder / "checkpoints").iterdir()):
    raise UserError(f"config {key}={folder} is a run without a finished checkpoint yet: train it first, or give "
                    "another run")
  if not path.is_file():
    raise UserError(f"config {key}={folder} is neither a training run's workdir nor an imported model (no "
                    "config.json): give a run's --workdir, or make a folder with `python -m crossbert_jax.export "
                    "import --hf=DIR --output=DIR`")
  try:
    saved = json.loads(path.read_text())
    return {k: saved["model"][k] for k in SHAPE_KEYS}, saved
  except (ValueError, KeyError, TypeError):
    what = "a training run wrote" if run else "`export import` wrote"
    raise UserError(f"config {key}={folder}: its config.json is not one {what}; give a run's --workdir or "
                    "re-run `python -m crossbert_jax.export import --hf=DIR --output=DIR`") from None


def _with_objective_source(c: config_lib.ConfigDict) -> config_lib.ConfigDict:
  """`c` with train.init_from (and shape_from_init) from the objective's own source key, when it names one."""
  key = objectives.get(c.objective).init_from_key
  if not key:
    return c
  section, name = key.split(".")
  source = c[section][name]
  if not source or c.train.init_from not in ("", source):  # Empty, or another train.init_from: validation says so.
    return c
  out = c.copy_and_resolve_references()
  with out.unlocked():
    out.train.init_from, out.train.shape_from_init = source, True
  out.lock()
  return out


def resolve(c: config_lib.ConfigDict) -> config_lib.ConfigDict:
  """`c` with train.init_from's shape and (if unset) tokenizer when train.shape_from_init; else `c`.

  The fresh reconstructor's width, heads and MLP follow the imported encoder's where they equal the
  config's encoder values (their default); a value set apart from those stays. A run's tokenizer is
  its config's data.tokenizer (found as evaluation finds it: `tokenizer.resolve_for_run`).
  """
  c = _with_objective_source(c)
  if not c.train.shape_from_init:
    return c
  if not c.train.init_from:
    raise UserError("config train.shape_from_init is set but train.init_from is empty: pass "
                    "--config.train.init_from=IMP, a folder from `python -m crossbert_jax.export import`")
  folder = epath.Path(c.train.init_from)
  model, saved = _source(folder, init_key(c))
  out = c.copy_and_resolve_references()
  following = [k for k in FOLLOWING_KEYS if out.reconstructor[k] == out.model[k]]
  with out.unlocked():
    for k, v in model.items():
      out.model[k] = v
    for k in following:
      out.reconstructor[k] = out.model[k]
    if not out.data.tokenizer and is_run(folder):
      out.data.tokenizer = tokenizer_lib.resolve_for_run(saved.get("data", {}).get("tokenizer", ""), str(folder))
    elif not out.data.tokenizer and (folder / "tokenizer.json").is_file():
      out.data.tokenizer = str(folder)
  out.lock()
  return out

"""A sweep spec file read and checked: `load_spec(path)` returns the dict of its `get_spec()`, every key
and value checked (one UserError line naming the key); `scaling/plan.py` turns it into runs."""

import importlib.util
import math
import pathlib
from typing import Any

from crossbert_jax.core.errors import UserError

SPEC_KEYS = {
    "name", "variant", "data_path", "tokenizer_vocab_size", "common", "sizes", "objectives", "seeds", "probes",
    "warmup_fraction"}
SIZE_KEYS = {"embed_dim", "num_heads", "num_layers", "mlp_dim", "flops"}
# WSD branches; executors (scaling/placement.py); a contrastive stage after every point (scaling/plan.py).
SPEC_OPTIONAL_KEYS = {"wsd", "max_concurrent", "max_retries", "contrast"}
WSD_KEYS = {"decay_fraction", "shape"}
SIZE_OPTIONAL_KEYS = {"seeds", "hosts", "resources", "slice"}  # Own seeds; placement (scaling/placement.py).
OBJECTIVE_KEYS = {"objective", "ratio", "views", "reconstructor_width"}
PROBE_KEYS = {"count", "tasks", "data_dir", "max_examples"}
# The contrastive stage: configs/contrast.py's variant; its input (default: the spec's data_path) and config keys.
CONTRAST_KEYS = {"variant"}
CONTRAST_OPTIONAL_KEYS = {"data_path", "overrides"}
PHASE_KEYS = ("train.phases", "train.batch_ramp")  # Refused in `common`: the plan's runs have one shape.


def load_spec(path: str) -> dict[str, Any]:
  """The dict from `get_spec()` in the spec file, its keys and values checked."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise UserError(f"--spec={path} does not exist: pass a spec file such as experiments/gutenberg_cpu.py")
  if file.suffix != ".py":
    raise UserError(f"--spec={path} is not a .py file: a spec is a Python file defining get_spec()")
  module_spec = importlib.util.spec_from_file_location(f"_sweep_spec_{file.stem}", file)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:  # A user's file: report it in one line, whatever it raised.
    raise UserError(f"--spec={path} failed to load ({one_line(e)}); fix the file") from None
  if not callable(getattr(module, "get_spec", None)):
    raise UserError(f"--spec={path} defines no get_spec(): it must return the sweep dict")
  try:
    spec = module.get_spec()
  except Exception as e:  # noqa: BLE001 - the user's code.
    raise UserError(f"--spec={path}: get_spec() raised {one_line(e)}; fix the file") from None
  where = f"--spec={path}"
  _check_keys(spec, SPEC_KEYS, where, SPEC_KEYS | SPEC_OPTIONAL_KEYS)
  for key in ("sizes", "objectives"):
    if not isinstance(spec[key], dict) or not spec[key]:
      raise UserError(f"{where} {key}={spec[key]!r}: must be a non-empty dict of name -> settings")
  _check_seeds(spec["seeds"], f"{where} seeds")
  wsd = spec.get("wsd")
  if wsd is not None:
    _check_keys(wsd, WSD_KEYS, f"{where} wsd")
    if not (isinstance(wsd["decay_fraction"], (int, float)) and 0 < wsd["decay_fraction"] < 1):
      raise UserError(f"{where} wsd.decay_fraction={wsd['decay_fraction']!r}: must be in (0, 1), e.g. 0.2")
    if wsd["shape"] not in ("linear", "1-sqrt"):
      raise UserError(f"{where} wsd.shape={wsd['shape']!r}: use 'linear' or '1-sqrt'")
  for name, size in spec["sizes"].items():
    _check_keys(size, SIZE_KEYS, f"{where} sizes[{name!r}]", SIZE_KEYS | SIZE_OPTIONAL_KEYS)
    _check_flops(size["flops"], f"{where} sizes[{name!r}].flops", wsd is not None)
    if "seeds" in size:
      _check_seeds(size["seeds"], f"{where} sizes[{name!r}].seeds")
  for name, obj in spec["objectives"].items():
    _check_keys(obj, {"objective", "ratio", "views"}, f"{where} objectives[{name!r}]", OBJECTIVE_KEYS)
  _check_distinct(spec["sizes"], f"{where} sizes")
  _check_distinct(spec["objectives"], f"{where} objectives")
  _check_keys(spec["probes"], PROBE_KEYS, f"{where} probes")
  count = spec["probes"]["count"]
  if not isinstance(count, int) or isinstance(count, bool) or count < 0:
    raise UserError(f"{where} probes.count={count!r}: must be an integer >= 0 (0: no probes)")
  frac = spec["warmup_fraction"]
  if not (isinstance(frac, (int, float)) and 0 <= frac < 1):
    raise UserError(f"{where} warmup_fraction={frac!r}: must be in [0, 1)")
  if "contrast" in spec:
    _check_contrast(spec["contrast"], f"{where} contrast")
  if phased := sorted(k for k in spec.get("common") or {} if k.startswith(PHASE_KEYS)):
    # The planner turns a FLOPs budget into steps at one batch x length; phases change both.
    raise UserError(f"{where} common sets {phased[0]}: a sweep's runs have one shape (budgets are FLOPs at "
                    "one batch x length); set data.seq_len / train.batch_size in common instead")
  return spec


def one_line(e: BaseException) -> str:
  """An exception as one line (type and message, at most 300 characters)."""
  return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _check_contrast(contrast: Any, where: str) -> None:
  """The contrastive stage's keys: a configs/contrast.py variant, its input and config overrides."""
  _check_keys(contrast, CONTRAST_KEYS, where, CONTRAST_KEYS | CONTRAST_OPTIONAL_KEYS)
  if not isinstance(contrast["variant"], str) or not contrast["variant"]:
    raise UserError(f"{where}.variant={contrast['variant']!r}: name a variant of configs/contrast.py, e.g. "
                    "'tiny_simcse' or 'base_pairs'")
  if not isinstance(contrast.get("data_path", ""), str):
    raise UserError(f"{where}.data_path={contrast['data_path']!r}: give the input as a string (pair files, a corpus)")
  overrides = contrast.get("overrides", {})
  if not isinstance(overrides, dict) or not all(isinstance(k, str) for k in overrides):
    raise UserError(f"{where}.overrides={overrides!r}: must be a dict of config key -> value, e.g. "
                    "{'train.steps': 100}")
  if owned := sorted(k for k in overrides if k in ("contrast.init_from", "data.path", "train.seed")):
    raise UserError(f"{where}.overrides sets {owned[0]}: the sweep sets it (each point's run, contrast.data_path, "
                    "the point's seed); drop it")


def _check_seeds(seeds: Any, where: str) -> None:
  if not isinstance(seeds, (list, tuple)) or not seeds or not all(
      isinstance(s, int) and not isinstance(s, bool) for s in seeds):
    raise UserError(f"{where}={seeds!r}: must be a non-empty list of integer seeds, e.g. [0]")
  if twice := sorted({s for s in seeds if list(seeds).count(s) > 1}):
    raise UserError(f"{where}={seeds!r}: seed {twice[0]} is listed twice; list each seed once")


def _check_distinct(entries: dict, where: str) -> None:
  seen: dict[str, str] = {}  # Two names with the same settings would train the same runs twice.
  for name, settings in entries.items():
    key = repr(sorted(settings.items()))
    if key in seen:
      raise UserError(f"{where}[{name!r}] has the same settings as {where}[{seen[key]!r}]; drop one of them")
    seen[key] = name


def _check_flops(value: Any, where: str, wsd: bool) -> None:
  budgets = value if isinstance(value, (list, tuple)) else [value]
  if isinstance(value, (list, tuple)) and not wsd:
    raise UserError(f"{where}={value!r}: a list of budgets needs the spec's wsd key (decay branches); "
                    "give one number or add wsd=dict(decay_fraction=0.2, shape='1-sqrt')")
  if not budgets or not all(
      isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and b > 0 for b in budgets):
    raise UserError(f"{where}={value!r}: FLOPs budgets must be positive finite numbers")
  if list(budgets) != sorted(set(budgets)):
    raise UserError(f"{where}={value!r}: list the budgets in ascending order, each once")


def _check_keys(d: dict, required: set[str], where: str, allowed: set[str] | None = None) -> None:
  allowed = allowed or required
  if not isinstance(d, dict):
    raise UserError(f"{where} must be a dict with keys {sorted(required)}")
  missing, unknown = required - set(d), set(d) - allowed
  if missing or unknown:
    raise UserError(
        f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")

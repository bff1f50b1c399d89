"""A sweep spec (sizes x objectives x seeds, a FLOPs budget per size) turned into runs.

A spec is a Python file with `get_spec() -> dict` (see experiments/gutenberg_cpu.py). Every
objective of a size trains for the size's FLOPs budget: its steps are the budget over the
analytic training FLOPs per step (`training/flops.py`), rounded to a multiple of the probe count
so the last frozen probe lands on the last step. Runs are plain `python -m crossbert_jax.train`
commands with `--config.key=value` overrides, so they run here one after another or on a pod.
"""

import dataclasses
import importlib.util
import json
import pathlib
from typing import Any

from crossbert_jax.core import config as config_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.training import flops

SPEC_KEYS = {"name", "variant", "data_path", "tokenizer_vocab_size", "common", "sizes", "objectives", "seeds",
             "probes", "warmup_fraction"}
SIZE_KEYS = {"embed_dim", "num_heads", "num_layers", "mlp_dim", "flops"}
SIZE_OPTIONAL_KEYS = {"seeds"}  # A size's own seeds (default: the spec's), e.g. more seeds where runs are cheap.
OBJECTIVE_KEYS = {"objective", "ratio", "views", "reconstructor_width"}
PROBE_KEYS = {"count", "tasks", "data_dir", "max_examples"}
CONFIG_FILES = {"crossbert": "configs/crossbert.py", "mlm": "configs/bert.py"}
PLAN_FILE = "plan.json"
DONE_FILE = "sweep_done.json"


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of the ladder."""
  name: str  # <size>__<objective label>__s<seed>: the workdir's name under ROOT/runs.
  size: str
  label: str  # The objective's label in the spec (e.g. bert_r15, cb_r50_k2).
  seed: int
  objective: str  # "crossbert" | "mlm".
  overrides: dict[str, Any]  # Dotted config keys -> values (the --config.key=value flags).
  flops_budget: float
  flops_per_step: float
  steps: int
  tokens_per_step: int
  kind: str = "run"  # "run" | "stable" (a WSD trunk, not a point) | "branch" (a decay forked from a stable run).
  fork_from: str = ""  # A branch's stable run name.
  fork_step: int = 0  # The stable run's step a branch forks from.
  budget_index: int = 0  # Which of the size's `flops` budgets this run is (0 without WSD).

  @property
  def flops(self) -> float:
    return self.steps * self.flops_per_step


def load_spec(path: str) -> dict[str, Any]:
  """The dict from `get_spec()` in the spec file, its keys checked."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise UserError(f"--spec={path} does not exist: pass a spec file such as experiments/gutenberg_cpu.py")
  module_spec = importlib.util.spec_from_file_location(f"_sweep_spec_{file.stem}", file)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:  # A user's file: report it in one line, whatever it raised.
    raise UserError(f"--spec={path} failed to load ({type(e).__name__}: {e}); fix the file") from None
  if not hasattr(module, "get_spec"):
    raise UserError(f"--spec={path} defines no get_spec(): it must return the sweep dict")
  spec = module.get_spec()
  _check_keys(spec, SPEC_KEYS, f"--spec={path}")
  for name, size in spec["sizes"].items():
    _check_keys(size, SIZE_KEYS, f"--spec={path} sizes[{name!r}]", SIZE_KEYS | SIZE_OPTIONAL_KEYS)
  for name, obj in spec["objectives"].items():
    _check_keys(obj, {"objective", "ratio", "views"}, f"--spec={path} objectives[{name!r}]", OBJECTIVE_KEYS)
  _check_keys(spec["probes"], PROBE_KEYS, f"--spec={path} probes")
  return spec


def _check_keys(d: dict, required: set[str], where: str, allowed: set[str] | None = None) -> None:
  allowed = allowed or required
  if not isinstance(d, dict):
    raise UserError(f"{where} must be a dict with keys {sorted(required)}")
  missing, unknown = required - set(d), set(d) - allowed
  if missing or unknown:
    raise UserError(f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")


def _overrides(spec: dict, size: dict, obj: dict, seed: int) -> dict[str, Any]:
  """Every config key a run sets (besides train.steps and the schedule), in flag order."""
  out = dict(spec["common"])
  out.update({"data.path": spec["data_path"], "train.seed": seed, "masking.ratio": obj["ratio"],
              "masking.views": obj["views"]})
  for key in ("embed_dim", "num_heads", "num_layers", "mlp_dim"):
    out[f"model.{key}"] = size[key]
  if obj["objective"] == "crossbert":
    # The reconstructor follows the encoder's width (a fraction of it: a lighter decoder).
    w = obj.get("reconstructor_width", 1.0)
    out.update({"reconstructor.embed_dim": int(size["embed_dim"] * w),
                "reconstructor.num_heads": max(1, int(size["num_heads"] * w)),
                "reconstructor.mlp_dim": int(size["mlp_dim"] * w)})
  return out


def make_config(objective: str, variant: str, overrides: dict[str, Any]):
  """The run's full config: the variant with the overrides applied (keys checked)."""
  c = config_lib.get_config(objective, variant)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = c
    for p in parents:
      node = node[p] if p in node else None
      if node is None:
        break
    if node is None or leaf not in node:
      raise UserError(f"sweep spec: unknown config key {key!r} (see crossbert_jax/core/config.py)")
    node[leaf] = value
  return c


def plan(spec: dict, tokenizer_path: str) -> list[Run]:
  """Every run of the ladder: equal FLOPs per size, steps a multiple of the probe count."""
  runs, probes = [], spec["probes"]
  n_probes = max(1, probes["count"])
  for size_name, size in spec["sizes"].items():
    for label, obj in spec["objectives"].items():
      for seed in size.get("seeds", spec["seeds"]):
        overrides = _overrides(spec, size, obj, seed)
        overrides["data.tokenizer"] = tokenizer_path
        c = make_config(obj["objective"], spec["variant"], overrides)
        per_step = flops.train_flops_per_step(c)
        steps = n_probes * max(1, round(size["flops"] / (per_step * n_probes)))
        overrides.update({"train.steps": steps,
                          "train.warmup_steps": max(1, round(spec["warmup_fraction"] * steps)),
                          "eval.every_steps": steps // n_probes if probes["count"] else 0,
                          "eval.tasks": probes["tasks"], "eval.data_dir": probes["data_dir"],
                          "eval.max_examples": probes["max_examples"]})
        c = make_config(obj["objective"], spec["variant"], overrides)
        config_lib.validate(c)
        runs.append(Run(f"{size_name}__{label}__s{seed}", size_name, label, seed, obj["objective"], overrides,
                        float(size["flops"]), per_step, steps, c.train.batch_size * c.data.seq_len))
  return runs


def train_command(run: Run, spec: dict, workdir: str, python: str = "python") -> list[str]:
  """argv of `python -m crossbert_jax.train` for the run (from the repo root)."""
  flags = [f"--config.{k}={v}" for k, v in run.overrides.items()]
  return [python, "-m", "crossbert_jax.train", f"--config={CONFIG_FILES[run.objective]}:{spec['variant']}",
          f"--workdir={workdir}", "--config.metrics.progress_bar=False", *flags]


def save_plan(root: pathlib.Path, spec: dict, runs: list[Run]) -> None:
  """ROOT/plan.json: the spec and every run, what the report reads."""
  root.mkdir(parents=True, exist_ok=True)
  (root / PLAN_FILE).write_text(json.dumps({"spec": spec, "runs": [dataclasses.asdict(r) for r in runs]}, indent=1))


def load_plan(root: pathlib.Path) -> tuple[dict, list[Run]]:
  """(spec, runs) from ROOT/plan.json."""
  path = root / PLAN_FILE
  if not path.is_file():
    raise UserError(f"--root={root} holds no {PLAN_FILE}: run `python -m crossbert_jax.sweep --root={root}` first")
  saved = json.loads(path.read_text())
  return saved["spec"], [Run(**r) for r in saved["runs"]]


def is_done(run_dir: pathlib.Path) -> bool:
  """True once the sweep recorded the run as finished (its training exited 0 at its last step)."""
  return (run_dir / DONE_FILE).is_file()

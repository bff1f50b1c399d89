"""A sweep spec (sizes x objectives x seeds, a FLOPs budget per size) turned into runs.

A spec is a Python file with `get_spec() -> dict` (see experiments/gutenberg_cpu.py), read and
checked by `scaling/spec.load_spec`. Every
objective of a size trains for the size's FLOPs budget: its steps are the budget over the
analytic training FLOPs per step (`training/flops.py`), rounded to a multiple of the probe count
so the last frozen probe lands on the last step. Runs are plain `python -m crossbert_jax.train`
commands with `--config.key=value` overrides, so they run here one after another or on a pod.

With a `wsd` key a size's `flops` may be an ascending list of budgets: each (size, objective,
seed) trains ONE stable run (`<run>__stable`, stopped at the largest budget's decay start, keeping
a checkpoint at every budget's decay start) and one decay branch per budget (`<run>__T<steps>`,
forked from it; bitwise a straight WSD run, tests/integration/test_fork.py).

With a `contrast` key every point (a plain run or a decay branch) is followed by a contrastive run
(`<point>__contrast`, kind "contrast": `python -m crossbert_jax.contrast` with configs/contrast.py's
variant, contrast.init_from = the point's workdir, the spec's probes over its steps), so the report
can compare the objectives after the stage that MTEB-style embeddings need. See docs/scaling_sweeps.md.
"""

import dataclasses
import hashlib
import importlib.util
import json
import pathlib
from typing import Any

from crossbert_jax.core import config as config_lib, objectives
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import objective_keys
from crossbert_jax.scaling.spec import one_line
from crossbert_jax.training import flops, optimizer

PLAN_FILE = "plan.json"
DONE_FILE = "sweep_done.json"


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of the ladder."""
  name: str  # <size>__<objective label>__s<seed>[__stable | __T<steps>]: the workdir's name under ROOT/runs.
  size: str
  label: str  # The objective's label in the spec (e.g. bert_r15, cb_r50_k2).
  seed: int
  objective: str  # "crossbert" | "mlm".
  overrides: dict[str, Any]  # Dotted config keys -> values (the --config.key=value flags).
  flops_budget: float
  flops_per_step: float
  steps: int
  tokens_per_step: int
  # "run" (independent) | "stable" (a WSD stable run; not a point) | "branch" (a decay branch) | "contrast" (the
  # contrastive stage of a point; not a point of the pretraining curves).
  kind: str = "run"
  fork_from: str = ""  # A branch's stable run, a contrastive run's point (its name under ROOT/runs).
  fork_step: int = 0  # The stable run's step a branch starts from.
  budget_index: int = 0  # Which of the size's budgets (ascending) a branch (or a stable run's last) is.
  variant: str = ""  # Its config file's variant; "" is the spec's (a contrastive run: the spec's contrast.variant).

  @property
  def flops(self) -> float:
    """The training FLOPs behind the run's model (a branch: the shared stable prefix included)."""
    return self.steps * self.flops_per_step

  @property
  def end_step(self) -> int:
    """The step its training stops at: a stable run stops at its last decay start."""
    return self.overrides.get("train.stop_at_step", 0) or self.steps

  @property
  def cost_flops(self) -> float:
    """The FLOPs this run itself trains (a branch: only its steps after the fork)."""
    return (self.end_step - self.fork_step) * self.flops_per_step


def _overrides(spec: dict, size: dict, obj: dict, seed: int) -> dict[str, Any]:
  """Every config key a run sets (besides train.steps and the schedule), in flag order."""
  out = dict(spec["common"])
  out.update({
      "data.path": spec["data_path"], "train.seed": seed, "masking.ratio": obj["ratio"], "masking.views": obj["views"]})
  for key in ("embed_dim", "num_heads", "num_layers", "mlp_dim"):
    out[f"model.{key}"] = size[key]
  out.update(objective_keys.overrides(obj["objective"], size, obj))
  return out


def make_config(objective: str, variant: str, overrides: dict[str, Any]):
  """The run's full config: the variant (a size such as tiny, or a variant of the objective's config file such
  as configs/contrast.py's tiny_simcse) with the overrides applied (keys checked)."""
  c = config_lib.get_config(objective, variant) if variant in config_lib.VARIANTS else _file_config(objective, variant)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = c
    for p in parents:  # A key through a leaf ("train.steps.x") names no section: unknown too.
      node = node[p] if hasattr(node, "keys") and p in node else None
      if node is None:
        break
    if not hasattr(node, "keys") or leaf not in node:
      raise UserError(f"sweep spec: unknown config key {key!r} (every key: crossbert_jax/core/sections.py)")
    node[leaf] = value
  return c


def _file_config(objective: str, variant: str):
  """`get_config(variant)` of the objective's config file (configs/*.py, from the repo root)."""
  file = objectives.get(objective).config_file
  module_spec = importlib.util.spec_from_file_location(f"_sweep_config_{pathlib.Path(file).stem}", file)
  if module_spec is None or not pathlib.Path(file).is_file():
    raise UserError(f"sweep spec: {file} not found; run the sweep from the repo root")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant)  # An unknown variant is its own UserError, naming the variants.


def run_config(run: "Run", spec: dict):
  """The full config a run trains with (its own variant, else the spec's)."""
  return make_config(run.objective, run.variant or spec["variant"], run.overrides)


def budgets(size: dict) -> list[float]:
  """A size's FLOPs budgets, ascending (one unless the spec has `wsd`)."""
  return [float(b) for b in size["flops"]] if isinstance(size["flops"], (list, tuple)) else [float(size["flops"])]


def plan(spec: dict, tokenizer_path: str) -> list[Run]:
  """Every run of the ladder: equal FLOPs per size, steps a multiple of the probe count."""
  runs, probes, wsd = [], spec["probes"], spec.get("wsd")
  n_probes = max(1, probes["count"])
  for size_name, size in spec["sizes"].items():
    for label, obj in spec["objectives"].items():
      for seed in size.get("seeds", spec["seeds"]):
        base = _overrides(spec, size, obj, seed)
        base["data.tokenizer"] = tokenizer_path
        per_step = flops.train_flops_per_step(make_config(obj["objective"], spec["variant"], base))
        name = f"{size_name}__{label}__s{seed}"
        steps = [n_probes * max(1, round(b / (per_step * n_probes))) for b in budgets(size)]
        probe_keys = lambda t: {
            "eval.every_steps": t // n_probes if probes["count"] else 0, "eval.tasks": probes["tasks"],
            "eval.data_dir": probes["data_dir"], "eval.max_examples": probes["max_examples"]}
        make = lambda name, overrides, budget, t, **kw: _run(name, size_name, label, seed, obj, spec, overrides, budget,
                                                             per_step, t, **kw)
        if wsd is None:
          t = steps[0]
          overrides = {
              **base, "train.steps": t, "train.warmup_steps": max(1, round(spec["warmup_fraction"] * t)),
              **probe_keys(t)}
          runs.append(make(name, overrides, budgets(size)[0], t))
          continue
        runs.extend(_wsd_runs(name, steps, budgets(size), base, spec, wsd, probe_keys, make))
  return _with_contrast(runs, spec) if "contrast" in spec else runs


def _with_contrast(runs: list[Run], spec: dict) -> list[Run]:
  """`runs` with each point followed by its contrastive run (module doc)."""
  stage, probes = spec["contrast"], spec["probes"]
  out = []
  for run in runs:
    out.append(run)
    if run.kind == "stable":
      continue
    overrides = {
        **stage.get("overrides", {}), "train.seed": run.seed, "data.path": stage.get("data_path") or spec["data_path"]}
    for key in ("embed_dim", "num_heads", "num_layers", "mlp_dim", "vocab_size"):  # The point's shape (its FLOPs).
      overrides.setdefault(f"model.{key}", run.overrides.get(f"model.{key}", None))
    overrides = {k: v for k, v in overrides.items() if v is not None}
    c = make_config("contrast", stage["variant"], overrides)
    if c.contrast.recipe == "pairs" and not stage.get("data_path"):
      raise UserError("sweep spec contrast: the pairs recipe reads pair files; give contrast.data_path (the spec's "
                      "data_path is the pretraining corpus)")
    t, n = c.train.steps, max(1, probes["count"])
    overrides.update({
        "eval.every_steps": max(1, t // n) if probes["count"] else 0, "eval.tasks": probes["tasks"],
        "eval.data_dir": probes["data_dir"], "eval.max_examples": probes["max_examples"]})
    c = make_config("contrast", stage["variant"], overrides)
    per_step = flops.train_flops_per_step(c)
    out.append(
        Run(f"{run.name}__contrast", run.size, run.label, run.seed, "contrast", overrides, t * per_step, per_step, t,
            c.train.batch_size * c.data.seq_len, kind="contrast", fork_from=run.name, budget_index=run.budget_index,
            variant=stage["variant"]))
  return out


def _wsd_runs(name, steps, budget_list, base, spec, wsd, probe_keys, make) -> list[Run]:
  """The stable run of (size, objective, seed) and its decay branches, one per budget."""
  if len(set(steps)) != len(steps):
    raise UserError(f"sweep spec: the budgets {budget_list} of {name} round to the same steps {steps}; "
                    "space them further apart")
  f = wsd["decay_fraction"]
  starts = [optimizer.wsd_decay_start(t, f) for t in steps]
  warmup = max(1, round(spec["warmup_fraction"] * steps[0]))  # One absolute warmup for every budget.
  if warmup > starts[0] or starts[0] < 1:
    raise UserError(f"sweep spec: {name}'s smallest budget ({steps[0]} steps) decays from step {starts[0]}, "
                    f"before or within its {warmup} warmup steps; raise its FLOPs or lower warmup_fraction")
  schedule = {
      "train.decay": "wsd", "train.decay_fraction": f, "train.decay_shape": wsd["shape"], "train.warmup_steps": warmup}
  stable = f"{name}__stable"
  out = [
      make(
          stable, {
              **base, **schedule, "train.steps": steps[-1], "train.stop_at_step": starts[-1],
              "checkpoint.keep_steps": tuple(starts), "eval.every_steps": 0}, budget_list[-1], steps[-1], kind="stable",
          budget_index=len(steps) - 1)]
  for i, (t, start) in enumerate(zip(steps, starts)):
    out.append(
        make(f"{name}__T{t}", {**base, **schedule, "train.steps": t, **probe_keys(t)}, budget_list[i], t, kind="branch",
             fork_from=stable, fork_step=start, budget_index=i))
  return out


def _run(name, size_name, label, seed, obj, spec, overrides, budget, per_step, steps, **kw) -> Run:
  c = make_config(obj["objective"], spec["variant"], overrides)
  plan_lib.build(c)  # Refuses a run the trainer would refuse, before the sweep starts.
  return Run(name, size_name, label, seed, obj["objective"], overrides, budget, per_step, steps,
             c.train.batch_size * c.data.seq_len, **kw)


def total_cost(runs: list[Run]) -> tuple[float, float]:
  """(FLOPs the plan trains, FLOPs its points would cost as independent runs from scratch)."""
  return sum(r.cost_flops for r in runs), sum(r.flops for r in runs if r.kind != "stable")


COMPILATION_CACHE = "compilation_cache"  # ROOT/compilation_cache: shared by the sweep's runs.


def train_command(run: Run, spec: dict, workdir: str, python: str = "python") -> list[str]:
  """argv of `python -m crossbert_jax.train` for the run (a contrastive run: `crossbert_jax.contrast`, from its
  point's workdir) from the repo root, in `workdir` = ROOT/runs/NAME.

  All runs share one compilation cache, ROOT/compilation_cache: the runs of a size compile the same
  init, loss check and probe embedding (and, across seeds, the same step), so each compiles once.
  """
  flags = [f"--config.{k}={_as_flag(v)}" for k, v in run.overrides.items()]
  runs_dir = str(pathlib.PurePath(workdir).parent) if "://" not in workdir else workdir.rstrip("/").rsplit("/", 1)[0]
  root = str(pathlib.PurePath(runs_dir).parent) if "://" not in runs_dir else runs_dir.rsplit("/", 1)[0]
  if run.kind == "branch":  # The stable run is the branch's sibling under ROOT/runs.
    flags.append(f"--config.train.fork_from={runs_dir}/{run.fork_from}:{run.fork_step}")
  if run.kind == "contrast":  # The shape comes from the point's run (its model.* keys only counted its FLOPs).
    flags = [f for f in flags if not f.startswith("--config.model.")]
    flags.append(f"--config.contrast.init_from={runs_dir}/{run.fork_from}")
  module = "crossbert_jax.contrast" if run.kind == "contrast" else "crossbert_jax.train"
  return [
      python, "-m", module, f"--config={objectives.get(run.objective).config_file}:{run.variant or spec['variant']}",
      f"--workdir={workdir}", f"--compilation_cache={root}/{COMPILATION_CACHE}", "--config.metrics.progress_bar=False",
      f"--config.metrics.wandb_group={pathlib.PurePath(root).name or root}", *flags]


def _resolved(run: Run) -> dict:
  """A run as plan_hash sees it: every field, the config overrides but the tokenizer's path (it names the root)."""
  r = dataclasses.asdict(run)
  r["overrides"] = {k: v for k, v in r["overrides"].items() if k != "data.tokenizer"}
  if not r["variant"]:
    del r["variant"]  # Plans saved before runs had their own variant keep their hash.
  return r


def plan_hash(runs: list[Run]) -> str:
  """The identity of a resolved plan: a sha256 over every run's name, kind, steps and config overrides
  (but the tokenizer's path, which names the root: a moved root keeps its identity)."""
  return hashlib.sha256(json.dumps([_resolved(r) for r in runs], sort_keys=True, default=str).encode()).hexdigest()


def read_json(path: pathlib.Path, what: str) -> Any:
  """A state file's JSON; a damaged one is one line naming it."""
  try:
    return json.loads(path.read_text())
  except (ValueError, UnicodeDecodeError) as e:
    raise UserError(f"{path} ({what}) is damaged ({one_line(e)}); restore it or delete it to "
                    "let the sweep rewrite it") from None


def _as_flag(value: Any) -> Any:
  """A value as a flag takes it: plan.json turns tuples (checkpoint.keep_steps, mesh.rules) into lists."""
  return tuple(_as_flag(v) for v in value) if isinstance(value, (list, tuple)) else value


def save_plan(root: pathlib.Path, spec: dict, runs: list[Run], spec_file: str = "") -> int:
  """ROOT/plan.json (the spec and every run); returns how many runs it added to the root's plan.

  A root's plan may only grow (more seeds, a new objective or size); `check_plan` refuses the rest.
  """
  added = check_plan(root, spec, runs, spec_file)
  if added == 0 and (root / PLAN_FILE).exists():  # The same runs: the file stays as it is.
    return 0
  root.mkdir(parents=True, exist_ok=True)
  outputs.write_atomic(
      root / PLAN_FILE,
      json.dumps(
          {
              "spec": spec, "spec_file": spec_file, "plan_hash": plan_hash(runs), "runs": [
                  dataclasses.asdict(r) for r in runs]}, indent=1))
  return added


def _budget_change(old_spec: dict, spec: dict) -> str:
  """" (size S: the root's budgets, this command's)" for the first size whose FLOPs differ, else ""."""
  fmt = lambda size: ", ".join(f"{b:.3g}" for b in budgets(size))
  changed = [(n, old_spec["sizes"][n], s)
             for n, s in spec["sizes"].items()
             if n in old_spec.get("sizes", {}) and budgets(old_spec["sizes"][n]) != budgets(s)]
  return (f" (size {changed[0][0]!r}: the root's FLOPs budgets {fmt(changed[0][1])}, this command's "
          f"{fmt(changed[0][2])}; --flops_scale multiplies the spec's)" if changed else "")


def check_plan(root: pathlib.Path, spec: dict, runs: list[Run], spec_file: str = "") -> int:
  """Runs `runs` adds to the root's plan (0: none yet, or the same); UserError if it changes or drops one."""
  if root.exists() and not root.is_dir():
    raise UserError(f"--root={root} is a file: give a folder for the sweep")
  path, new = root / PLAN_FILE, plan_hash(runs)
  added = 0
  if path.exists():
    saved = read_json(path, "the sweep's plan")
    old_runs = [Run(**r) for r in saved["runs"]]
    old = saved.get("plan_hash") or plan_hash(old_runs)
    if old == new:
      return 0
    key = lambda run: json.dumps(_resolved(run), sort_keys=True, default=str)
    ours = {key(r) for r in runs}
    if not all(key(r) in ours for r in old_runs):
      old_spec = f"{saved['spec'].get('name')!r}" + (f" from {saved['spec_file']}" if saved.get("spec_file") else "")
      raise UserError(f"--root={root} holds the plan of spec {old_spec} (plan {old[:12]}, {len(old_runs)} runs); "
                      f"--spec={spec_file or '?'} (spec {spec.get('name')!r}, plan {new[:12]}, {len(runs)} runs) "
                      f"changes or drops some of its runs{_budget_change(saved['spec'], spec)}: use a new --root, "
                      "or rerun with the root's spec and --flops_scale (a plan may only add runs, e.g. seeds)")
    added = len(runs) - len(old_runs)
  return added


def load_plan(root: pathlib.Path) -> tuple[dict, list[Run]]:
  """(spec, runs) from ROOT/plan.json (files written before the WSD fields load with their defaults)."""
  path = root / PLAN_FILE
  if not path.is_file():
    raise UserError(f"--root={root} holds no {PLAN_FILE}: run `python -m crossbert_jax.sweep --root={root}` first")
  saved = read_json(path, "the sweep's plan")
  try:
    return saved["spec"], [Run(**r) for r in saved["runs"]]
  except (KeyError, TypeError) as e:
    raise UserError(f"{path} (the sweep's plan) is damaged ({one_line(e)}); restore it from the sweep") from None


def is_done(run_dir: pathlib.Path) -> bool:
  """True once the sweep recorded the run as finished (its training exited 0 at its last step)."""
  path = run_dir / DONE_FILE
  if not path.is_file():
    return False
  read_json(path, "the run's done record")
  return True

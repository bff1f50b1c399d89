"""The accelerator check's `curves` step: does each fast path train like the dense reference?

For BERT r=0.15 and CrossBERT r=0.5 K=1, `small` (L=256, bf16 compute) with ModernBERT's layer pattern
(global every 3rd layer, window 128) trains CURVE_STEPS steps on the built-in text in this process, once per path of
PATHS: the reference (`model.attention=xla`: dense scores, float32 vocabulary head), the reference with
another seed (its distance from the reference is the noise: other init, masks and data order), and each
lever alone (the `gpu_flash` kernels, `cudnn`, the bf16 head). Every path but `seed` shares the
reference's init, masks and data, so only the kernels' numerics differ.

Per path: the logged loss every LOG_EVERY steps and `late_loss`, the mean over the last quarter of the
steps; `gap` = |late_loss - reference's|. A path `tracks` the reference when its gap is at most
max(2 x the seed's gap, GAP_FLOOR): a kernel's numerics may move the curve, but by less than a change of
seed does. On a CPU (`--dry_run`, tiny shapes) the GPU backends run the chunked kernel and the step
checks the plumbing only.
"""

import pathlib
import shutil
import time
from typing import Any, Callable

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.perf import benchmark
from crossbert_jax.run import metrics as metrics_lib
from crossbert_jax.run import trainer

CURVE_STEPS, LOG_EVERY = 200, 10
DRY_RUN_STEPS, DRY_RUN_LOG_EVERY = 8, 2
GAP_FLOOR = 0.02  # nats: below this two late losses are not told apart at this length.
MB = {"model.global_every": 3, "model.local_window": 128}
REFERENCE = {"model.attention": "xla", "model.head_dtype": "float32"}
# (path, config keys over the reference's).
PATHS = (
    ("reference", {}),
    ("seed", {"train.seed": 1}),
    ("gpu_flash", {"model.attention": "gpu_flash"}),
    ("cudnn", {"model.attention": "cudnn"}),
    ("head_bf16", {"model.head_dtype": "bfloat16"}),
)
OBJECTIVES = (("bert", "bert_r0.15"), ("crossbert", "cb_r0.5_k1"))  # (name, benchmark.CASES entry)
DRY_RUN_PATHS = ("reference", "cudnn")  # The plumbing in two tiny runs (10-14 s each on this CPU).


def curve_config(case: str, keys: dict[str, Any], tokenizer: pathlib.Path, dry_run: bool) -> plan_lib.RunPlan:
  """`small` (tiny in a dry run) with the case's objective, ModernBERT's pattern, the reference and `keys`."""
  edit = next(e for n, _, e in benchmark.CASES if n == case)
  c = config_lib.get_config("crossbert", "tiny" if dry_run else "small")
  c.unlock()
  edit(c)
  c.data.tokenizer = str(tokenizer)
  c.model.vocab_size = 1024  # The tokenizer's.
  c.model.dtype = "bfloat16"  # As the bench: cuDNN's attention takes bf16 only (float32 runs its XLA form).
  c.train.steps = DRY_RUN_STEPS if dry_run else CURVE_STEPS
  c.train.warmup_steps = 2 if dry_run else 20
  c.metrics.log_every = DRY_RUN_LOG_EVERY if dry_run else LOG_EVERY
  c.metrics.progress_bar = c.metrics.tensorboard = False
  c.checkpoint.every_steps = c.train.steps  # One save, at the end.
  c.checkpoint.async_save = False
  c.data.worker_count = 0  # Batches read in this process: the check parses no absl flags for grain's workers.
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1  # Data parallel over what there is (one GPU; the suite's 8 CPUs).
  c.lock()
  window = {"model.local_window": 16} if dry_run else {}  # tiny rows are 64 long.
  return plan_lib.with_keys(plan_lib.build(c), {**MB, **window, **REFERENCE, **keys})


def late_loss(rows: list[dict[str, Any]], steps: int) -> float:
  """The mean logged loss over the last quarter of the steps."""
  late = [r["loss"] for r in rows if "loss" in r and r["step"] > steps - steps // 4]
  return sum(late) / len(late)


def verdicts(paths: dict[str, dict[str, Any]]) -> None:
  """Each path's gap from the reference and whether it tracks it (in place)."""
  ref = paths["reference"]["late_loss"]
  noise = abs(paths["seed"]["late_loss"] - ref) if "seed" in paths else 0.0
  tolerance = max(2 * noise, GAP_FLOOR)
  for name, row in paths.items():
    row["gap"] = abs(row["late_loss"] - ref)
    if name not in ("reference", "seed"):
      row["tolerance"] = tolerance
      row["tracks"] = row["gap"] <= tolerance


def curves(dry_run: bool, work: pathlib.Path, make_tokenizer: Callable[[pathlib.Path], str | None],
           on_run: Callable[[dict[str, Any]], None] = lambda result: None) -> dict[str, Any]:
  """Every (objective, path) run of the step; `make_tokenizer(path)` writes the 1,024-piece tokenizer (None,
  or an error line); `on_run(result)` after each run (the check rewrites its JSON)."""
  tokenizer = work / "spm.model"
  if not tokenizer.is_file() and (error := make_tokenizer(tokenizer)):
    return {"passed": False, "error": "tokenizer: " + error}
  result: dict[str, Any] = {"steps": DRY_RUN_STEPS if dry_run else CURVE_STEPS, "objectives": {}}
  for objective, case in OBJECTIVES:
    paths = result["objectives"].setdefault(objective, {})
    for name, keys in PATHS:
      if dry_run and (objective != "bert" or name not in DRY_RUN_PATHS):
        continue
      c = curve_config(case, keys, tokenizer, dry_run)
      workdir = work / "curves" / f"{objective}_{name}"
      shutil.rmtree(workdir, ignore_errors=True)
      t0 = time.perf_counter()
      try:
        trainer.run(c, str(workdir))
      except Exception as e:  # noqa: BLE001 - a path that fails is recorded; the others run.
        paths[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        continue
      rows = metrics_lib.read_metrics(str(workdir))
      paths[name] = {
          "keys": keys, "seconds": time.perf_counter() - t0,
          "loss": [[r["step"], r["loss"]] for r in rows if "loss" in r], "late_loss": late_loss(rows, c.train.steps)}
      on_run(result)
    if "reference" in paths and "late_loss" in paths["reference"]:
      verdicts({n: r for n, r in paths.items() if "late_loss" in r})
  failed = [
      f"{o}/{n}" for o, paths in result["objectives"].items() for n, r in paths.items()
      if "error" in r or r.get("tracks") is False]
  return {**result, "passed": not failed, **({"failed": failed} if failed else {})}


def format_lines(report: dict[str, Any]) -> list[str]:
  """One line per run: late loss, gap, tolerance, verdict."""
  lines = []
  for objective, paths in report.get("objectives", {}).items():
    for name, r in paths.items():
      if "late_loss" not in r:
        lines.append(f"curves {objective:<9} {name:<10} {r.get('error', '')[:80]}")
        continue
      verdict = "" if "tracks" not in r else (
          f"tracks (<= {r['tolerance']:.3f})" if r["tracks"] else f"DOES NOT TRACK (> {r['tolerance']:.3f})")
      lines.append(f"curves {objective:<9} {name:<10} late loss {r['late_loss']:.4f}  gap {r['gap']:.4f}  {verdict}")
  return lines

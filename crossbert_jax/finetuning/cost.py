"""What the full recipe costs: analytic training FLOPs (training/flops.py's count) of every trial of the grid on
GLUE's train splits, and the hours that take on one accelerator at a stated MFU.

Every row is counted at one padded length (`length`: a stated assumption, the buckets make most GLUE rows 64 or
128 tokens); the dev passes (a forward per epoch) are left out: under 1% beside training on every task.
"""

from typing import Any

from crossbert_jax.finetuning import recipe
from crossbert_jax.training import flops

# GLUE's train rows (nyu-mll/glue), the recipe's epochs run over each.
TRAIN_ROWS = {
    "cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846, "mnli": 392702, "qnli": 104743, "rte": 2490}


def epoch_passes(grid: recipe.Grid) -> int:
  """Passes over a task's train split summed over the grid's trials (the default: 6 x 4 x 2 x 3 = 144)."""
  return sum(grid.epochs) * len(grid.learning_rates) * len(grid.weight_decays) * len(grid.seeds)


def recipe_flops(model_cfg: Any, grid: recipe.Grid = recipe.Grid(), length: int = 128) -> dict[str, float]:
  """{task: training FLOPs of all its trials}: 3 x the encoder's forward (the head's D x D is negligible)."""
  per_row = 3.0 * flops.encoder_forward_flops(model_cfg, length)
  return {task: per_row * rows * epoch_passes(grid) for task, rows in TRAIN_ROWS.items()}


def hours(total_flops: float, peak_tflops: float, mfu: float) -> float:
  return total_flops / (peak_tflops * 1e12 * mfu) / 3600

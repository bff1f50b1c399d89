"""ModernBERT's GLUE recipe as our defaults, the grid of trials, and each trial's name and argv.

The recipe (ModernBERT, Warner et al. 2024, arXiv 2412.13663, appendix on GLUE fine-tuning): batch 64,
AdamW, linear decay after a 10% linear warmup, sequences of at most 256 tokens, a grid of learning rate
{1e-5, 3e-5, 5e-5, 8e-5} x epochs {1, 2, 3} x weight decay, 3 seeds, the best dev score per task
reported with its seed spread; RTE, MRPC and STS-B start from the MNLI fine-tuned checkpoint.
Our choices where the appendix gives no value: weight decay {1e-6, 1e-5} in AdamW's decoupled form scaled
by the learning rate (optax / torch), betas (0.9, 0.98), eps 1e-6, no gradient clipping, no dropout
(ModernBERT's config has none), and the schedule of transformers' `get_linear_schedule_with_warmup`
(warmup steps = ceil(10% of the steps), starting at 0).

A trial is one point of the grid for one task and seed: its folder's name says which, and its argv (the
finetune command narrowed to that point) runs it alone, so any executor can dispatch it.
"""

import dataclasses
import math
from typing import Sequence

from crossbert_jax.core.errors import UserError

BATCH_SIZE = 64
MAX_LENGTH = 256
WARMUP_FRACTION = 0.1
LEARNING_RATES = (1e-5, 3e-5, 5e-5, 8e-5)
EPOCHS = (1, 2, 3)
WEIGHT_DECAYS = (1e-6, 1e-5)
SEEDS = 3
BETAS = (0.9, 0.98)
EPS = 1e-6
FROM_MNLI = ("rte", "mrpc", "stsb")  # Start from the best MNLI trial's encoder and head (a fresh classifier).


@dataclasses.dataclass(frozen=True)
class Grid:
  """The values tried per task: every combination, each with every seed."""
  learning_rates: tuple[float, ...] = LEARNING_RATES
  epochs: tuple[int, ...] = EPOCHS
  weight_decays: tuple[float, ...] = WEIGHT_DECAYS
  seeds: tuple[int, ...] = tuple(range(SEEDS))


@dataclasses.dataclass(frozen=True)
class Trial:
  """One fine-tuning run: a task, one point of the grid, one seed."""
  task: str
  learning_rate: float
  epochs: int
  weight_decay: float
  seed: int

  @property
  def name(self) -> str:
    return f"lr{self.learning_rate:g}-ep{self.epochs}-wd{self.weight_decay:g}-seed{self.seed}"

  @property
  def point(self) -> str:
    """The grid point without the seed: the seeds of one point are averaged."""
    return self.name.rsplit("-seed", 1)[0]


def _values(text: str, flag: str, kind: type) -> tuple:
  items = [t.strip() for t in str(text).split(",") if t.strip()]
  if not items:
    raise UserError(f"{flag}={text!r} gives no value: give one or more, comma-separated (e.g. {flag}=3e-5,5e-5)")
  try:
    values = tuple(kind(t) for t in items)
  except ValueError:
    raise UserError(f"{flag}={text!r}: each value must be a {kind.__name__} (comma-separated)") from None
  if any(not math.isfinite(v) or v < 0 for v in values):
    raise UserError(f"{flag}={text!r}: values must be finite and not negative")
  return tuple(dict.fromkeys(values))


def parse_grid(learning_rates: str, epochs: str, weight_decays: str, seeds: str) -> Grid:
  """The grid from the flags' comma-separated values; a flag with no value is refused in one line."""
  grid = Grid(_values(learning_rates, "--learning_rates", float), _values(epochs, "--epochs", int),
              _values(weight_decays, "--weight_decays", float), _values(seeds, "--seeds", int))
  if 0 in grid.epochs:
    raise UserError("--epochs: 0 trains nothing; give epochs of 1 or more")
  if 0.0 in grid.learning_rates:
    raise UserError("--learning_rates: 0 trains nothing; give positive learning rates")
  return grid


def trials(task: str, grid: Grid) -> list[Trial]:
  """Every trial of a task, in a fixed order (points, then seeds)."""
  return [
      Trial(task, lr, ep, wd, seed)
      for lr in grid.learning_rates
      for ep in grid.epochs
      for wd in grid.weight_decays
      for seed in grid.seeds]


def trial_argv(trial: Trial, common: Sequence[str], python: str = "python") -> list[str]:
  """The finetune command that runs this trial alone (`common`: its --workdir/--hf, --output_dir, --data_dir...)."""
  return [
      python, "-m", "crossbert_jax.finetune", f"--task={trial.task}", f"--learning_rates={trial.learning_rate:g}",
      f"--epochs={trial.epochs}", f"--weight_decays={trial.weight_decay:g}", f"--seeds={trial.seed}", *common]


def warmup_steps(total_steps: int) -> int:
  """transformers' TrainingArguments.get_warmup_steps: ceil(fraction x steps)."""
  return math.ceil(total_steps * WARMUP_FRACTION)

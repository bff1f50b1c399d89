r"""Turn a pretrained encoder into a sentence-embedding model: the contrastive stage.

  python -m crossbert_jax.contrast --config=configs/contrast.py:tiny_pairs --workdir=runs/emb \
      --config.contrast.init_from=runs/cb --config.data.path=pairs.jsonl [--config.key=value ...]

contrast.init_from: a pretraining run's workdir (its encoder; the reconstructor or MLM head is
dropped) or an `export import` folder of a ModernBERT; the model's shape and (unless data.tokenizer
is given) the tokenizer are the source's. data.path: pair files for recipe=pairs (.jsonl / .parquet
/ .tsv), any pretraining input for recipe=simcse. A run like any other: the train command's flags,
trainer, checkpoints, exact resume, SIGTERM (exit 75) and metrics (objective=contrast,
training/objectives/contrast.py); `export`, `evaluate` and `mteb_eval` read its workdir.
Exit status 0, 2 or 75 (crossbert_jax.core.errors). Manual: docs/embedding.md.
"""

import importlib

from absl import app

from crossbert_jax import train as train_command  # Its flags are this command's.
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError, exit_on_user_error, parse_flags_or_exit


def _check(c: plan_lib.RunPlan) -> None:
  if c.objective != "contrast":
    raise UserError(f"--config is an objective={c.objective} config: this command runs the contrastive stage, "
                    "e.g. --config=configs/contrast.py:tiny_pairs (pretrain with python -m crossbert_jax.train)")


def _define_flags() -> None:
  """Defines the flags afresh (tests/helpers.py run_main drops every command's flags before a call)."""
  importlib.reload(train_command)


@exit_on_user_error
def main(argv):
  train_command.train_main(argv, check=_check)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)

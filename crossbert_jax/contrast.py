r"""Turn a pretrained encoder into a sentence-embedding model: the contrastive stage.

  python -m crossbert_jax.contrast --config=configs/contrast.py:tiny_pairs --workdir=runs/emb \
      --config.contrast.init_from=runs/cb --config.data.path=pairs.jsonl [--config.key=value ...]

contrast.init_from: a pretraining run's workdir (its encoder; the reconstructor or MLM head is
dropped) or an `export import` folder of a ModernBERT; the model's shape and (unless data.tokenizer
is given) the tokenizer are the source's. data.path: pair files for recipe=pairs (.jsonl / .parquet
/ .tsv), any pretraining input for recipe=simcse. A run like any other: the train command's flags
(run/command.py), trainer, checkpoints, exact resume, SIGTERM (exit 75), metrics and probes
(objective=contrast, training/objectives/contrast.py); `export`, `evaluate` and `mteb_eval` read its
workdir. Exit status 0, 2 or 75 (crossbert_jax.core.errors). Manual: docs/embedding.md.
"""

import time

_STARTED = time.time()  # Before the imports: goodput counts them as start-up (run/goodput.py).

from absl import app  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from crossbert_jax.core import objectives  # noqa: E402
from crossbert_jax.core.errors import UserError, exit_on_user_error, parse_flags_or_exit  # noqa: E402
from crossbert_jax.evaluation import runner  # noqa: E402
from crossbert_jax.run import command, hooks as hooks_lib  # noqa: E402

FLAGS = command.define_flags(
    config_flags.DEFINE_config_file("config", None, "Config file and variant, e.g. configs/contrast.py:tiny_pairs."))


@exit_on_user_error
def main(argv):
  c = command.plan_of(FLAGS, argv)
  if c.spec is not objectives.CONTRAST:
    raise UserError(f"--config is an objective={c.objective} config: this command runs the contrastive stage, "
                    "e.g. --config=configs/contrast.py:tiny_pairs (pretrain with python -m crossbert_jax.train)")
  command.agreed(lambda: runner.check_probe_inputs(c), "the probe tasks (config eval.*)")
  command.run_and_report(c, FLAGS, _STARTED, [hooks_lib.Hook("probes", c.eval.every_steps, runner.probe_hook)])


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)

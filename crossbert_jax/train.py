r"""Pretrain CrossBERT or flat BERT on a device mesh.

  python -m crossbert_jax.train --config=configs/crossbert.py:tiny --workdir=runs/cb \
      --config.data.tokenizer=runs/tok/spm.model [--config.key=value ...]

Library: crossbert_jax.run.trainer.run, with the hooks of `standard_hooks` (the frozen probes every
eval.every_steps steps); the flags, the plan and the last line: run/command.py (shared with
`crossbert_jax.contrast`). Exit status 0, 2 or 75 (crossbert_jax.core.errors).
Manual: docs/training.md.
"""

import time

_STARTED = time.time()  # Before the imports: goodput counts them as start-up (run/goodput.py).

from absl import app  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from crossbert_jax.core.errors import exit_on_user_error, parse_flags_or_exit  # noqa: E402
from crossbert_jax.evaluation import runner  # noqa: E402
from crossbert_jax.run import command, hooks as hooks_lib  # noqa: E402

FLAGS = command.define_flags(
    config_flags.DEFINE_config_file("config", None, "Config file and variant, e.g. configs/crossbert.py:tiny."))


def check_probe_inputs(c) -> None:
  """A bad eval.tasks / eval.data_dir fails now, not at the first probe after training (process 0 scores
  the probes, so it alone reads the task data; every process learns the verdict)."""
  command.agreed(lambda: runner.check_probe_inputs(c), "the probe tasks (config eval.*)")


def standard_hooks(c) -> list[hooks_lib.Hook]:
  """The hooks a run of `c` adds after each step's metrics row: the frozen probes (eval.tasks) every
  eval.every_steps steps (0: never), scored into that step's row. Pass them to `run(..., hooks=...)`."""
  return [hooks_lib.Hook("probes", c.eval.every_steps, runner.probe_hook)]


@exit_on_user_error
def main(argv):
  c = command.plan_of(FLAGS, argv)
  check_probe_inputs(c)
  command.run_and_report(c, FLAGS, _STARTED, standard_hooks(c))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)

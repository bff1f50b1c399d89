r"""Scaling report: Markdown and PNG plots from a sweep directory.

  python -m crossbert_jax.report --root=runs/sweeps/gutenberg_cpu --output=docs/results/gutenberg_cpu

Reads ROOT/plan.json and each run's metrics; unfinished runs are included and marked partial.
Details: docs/scaling_sweeps.md.
"""

import pathlib

from absl import app, flags

from crossbert_jax.core.errors import UserError, exit_on_user_error, parse_flags_or_exit
from crossbert_jax.scaling import report

_ROOT = flags.DEFINE_string("root", None, "Sweep directory (python -m crossbert_jax.sweep --root=...).")
_OUTPUT = flags.DEFINE_string("output", None, "Folder for report.md and its PNGs, e.g. docs/results/gutenberg_cpu.")


@exit_on_user_error
def _main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; use --root=... --output=...")
  if not _ROOT.value or not _OUTPUT.value:
    raise UserError("--root and --output are required, e.g. --root=runs/sweeps/x --output=docs/results/x")
  print(f"wrote {report.write_report(pathlib.Path(_ROOT.value), pathlib.Path(_OUTPUT.value))}")


def main():
  app.run(_main, flags_parser=parse_flags_or_exit)


if __name__ == "__main__":
  main()

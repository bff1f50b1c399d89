r"""Write a sweep's scaling report: Markdown and PNG plots.

  python -m crossbert_jax.report --root=runs/sweeps/gutenberg_cpu --output=docs/results/gutenberg_cpu [--force]

Library: crossbert_jax.scaling.report. Manual: docs/scaling_sweeps.md.
"""

import pathlib

from absl import app, flags

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import exit_on_user_error, no_positional, parse_flags_or_exit, require
from crossbert_jax.scaling import report

REPORT_FILE = "report.md"  # What scaling.report.write_report writes next to its PNGs.
_ROOT = flags.DEFINE_string("root", None, "Sweep directory (python -m crossbert_jax.sweep --root=...).")
_OUTPUT = flags.DEFINE_string("output", None, "Folder for report.md and its PNGs, e.g. docs/results/gutenberg_cpu.")
_FORCE = flags.DEFINE_bool("force", False, "Replace the report.md (and PNGs) already in --output; other files "
                           "there are kept.")


@exit_on_user_error
def main(argv):
  no_positional(argv, "; use --root=... --output=...")
  require("root", "output", advice=", e.g. --root=runs/sweeps/x --output=docs/results/x")
  root, output = pathlib.Path(_ROOT.value), pathlib.Path(_OUTPUT.value)
  # Written beside --output and moved in at the end: a failure leaves the folder as it was.
  with outputs.staged_files(output, _FORCE.value, marker=REPORT_FILE, inputs={"--root": root}) as tmp:
    written = report.write_report(root, pathlib.Path(tmp))
  print(f"wrote {output / written.name}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)

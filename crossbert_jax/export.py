r"""Export a run to a Hugging Face folder, or import one.

  python -m crossbert_jax.export --workdir=RUN [--step=N] --output=DIR [--verify] [--force]
  python -m crossbert_jax.export --workdir=FINETUNED_TRIAL --output=DIR [--verify]  # A sequence classifier.
  python -m crossbert_jax.export import --hf=DIR --output=PARAMS_DIR [--scan_layers] [--force]

Library: crossbert_jax.hf.convert. Manual: docs/export.md.
"""

import sys
from typing import Sequence

from absl import app
from absl import flags
from absl import logging
from etils import epath

from crossbert_jax.core import objectives, outputs
from crossbert_jax.core.errors import exit_on_user_error, parse_flags_or_exit, require, unexpected_arguments
from crossbert_jax.hf import files as hf_files
from crossbert_jax.hf.convert import PARAMS_FILE, TOLERANCE, export, import_hf
from crossbert_jax.run import load, metrics


def _is_trial(workdir: str) -> bool:
  """A fine-tuned trial's folder (finetuning/trial.py writes trial.json there)."""
  return (epath.Path(workdir) / "trial.json").exists()


_SEE_USAGE = " (see the usage in `python -m crossbert_jax.export --help`)"


def export_run(workdir: str, output: str, step: int | None = None, tokenizer: str = "", do_verify: bool = False,
               force: bool = False) -> dict | None:
  """Exports a training run's checkpoint (latest, or `step`) to the HF folder `output`."""
  if _is_trial(workdir):  # A fine-tuned trial: a ModernBertForSequenceClassification folder.
    from crossbert_jax.finetuning import export as ft_export  # pylint: disable=g-import-not-at-top (training code)

    return ft_export.export_trial(workdir, output, do_verify, force)
  outputs.check_output_dir(output, force, inputs={"--workdir": workdir})  # Before the slow restore.
  config, params, step = load.load_run(workdir, step)
  tok = load.run_tokenizer(workdir, config, step, tokenizer)
  rows = metrics.read_metrics(workdir) if metrics.metrics_files(workdir) else None
  info = hf_files.run_summary(epath.Path(workdir), config, step, rows)
  return export(config, params, tok, output, do_verify=do_verify, force=force, info=info, workdir=workdir)


# -- CLI -------------------------------------------------------------------------------------


def _define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importers get no stray flags)."""
  if "hf" in flags.FLAGS:
    return
  flags.DEFINE_string("workdir", None, "export: the training run's workdir.")
  flags.DEFINE_integer("step", None, "export: checkpoint step (default: the latest).")
  flags.DEFINE_string("output", None, "export: HF folder to write; import: params folder to write.")
  flags.DEFINE_string(
      "tokenizer", "", "export: SentencePiece model or HF tokenizer.json / folder (default: the "
      "run's data.tokenizer).")
  flags.DEFINE_bool("verify", False, "export: check the folder against transformers and sentence-transformers.")
  flags.DEFINE_bool("force", False, "Overwrite a non-empty --output.")
  flags.DEFINE_string("hf", None, "import: a ModernBERT folder (config.json + model.safetensors).")
  flags.DEFINE_enum("objective", "crossbert", list(objectives.names()),
                    "import: objective of the written config (mlm also imports an MLM head).")
  flags.DEFINE_bool("scan_layers", False, "import: write params in the scan-over-layers layout.")


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI: export (default) or `import`."""
  f = flags.FLAGS
  logging.set_verbosity(logging.WARNING)  # Orbax restore chatter.
  command = argv[1] if len(argv) > 1 else "export"
  if len(argv) > 2 or command not in ("export", "import"):
    raise unexpected_arguments(argv[1:], ": use no command (export) or `import`")
  if command == "import":
    for name in ("hf", "output"):
      require(name, advice=_SEE_USAGE)
    out = import_hf(f.hf, f.output, f.objective, f.scan_layers, f.force)
    print(f"imported {f.hf} -> {out}/{PARAMS_FILE} + config.json")
  else:
    for name in ("workdir", "output"):
      require(name, advice=_SEE_USAGE)
    result = export_run(f.workdir, f.output, f.step, f.tokenizer, f.verify, f.force)
    print(f"exported {f.workdir} -> {f.output}")
    if result:
      tolerance = TOLERANCE
      if _is_trial(f.workdir):  # Imported by export_run already.
        from crossbert_jax.finetuning.export import TOLERANCE as tolerance  # pylint: disable=g-import-not-at-top
      print(" ".join(f"{k}={v:.2e}" for k, v in result.items()) + f" (tolerance {tolerance:g}): verified")
  sys.stdout.flush()


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

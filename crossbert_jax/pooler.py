r"""Train a pooler on a frozen encoder (the paper's "frozen" protocol) and export it.

  python -m crossbert_jax.pooler --workdir=runs/demo/crossbert \
      --pairs=../shared/data/senteval/downstream/SNLI --export=runs/demo/st_pooler

Library: crossbert_jax.evaluation.pooler. Manual: docs/evaluation.md.
"""

import os
import shutil
import time
from typing import Sequence

import numpy as np
from absl import app
from absl import flags
from absl import logging

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, exit_on_user_error, no_positional, parse_flags_or_exit
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import pooler as pooler_lib
from crossbert_jax.hf import convert
from crossbert_jax.hf import files as hf_files
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.run import load


def _define_flags() -> None:
  flags.DEFINE_string("workdir", "", "Training run workdir (its encoder stays frozen).")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_string("hf", "", "A local Hugging Face encoder folder instead of --workdir (mean pooler only).")
  flags.DEFINE_string(
      "tokenizer", "", "SentencePiece .model or HF tokenizer.json / folder for --workdir "
      "(default: the run's config).")
  flags.DEFINE_string(
      "pairs", "", "Training pairs: a SentEval NLI folder (e.g. .../senteval/downstream/SNLI: "
      "entailments as positives, contradictions as hard negatives) or a .tsv/.jsonl file.")
  flags.DEFINE_string("pairs_split", "dev", "Split of a SentEval NLI folder (SNLI here: dev; keep test for scoring).")
  flags.DEFINE_list("pairs_columns", ["anchor", "positive", "negative"], "Columns of a pairs file (2 or 3).")
  flags.DEFINE_enum(
      "kind", "mean", list(pooler_lib.KINDS), "mean: mean pooling + linear map; attention: a "
      "learned-query attention pooling + linear map (no sentence-transformers export).")
  flags.DEFINE_integer("out_dim", 0, "Pooler output width (0: the encoder's width).")
  flags.DEFINE_integer("steps", 300, "Training steps.")
  flags.DEFINE_integer("batch_size", 64, "Pairs per step (in-batch negatives).")
  flags.DEFINE_float("learning_rate", 1e-3, "Peak AdamW learning rate (10% warm-up, cosine decay).")
  flags.DEFINE_float("scale", 20.0, "Cosine logit scale (1 / temperature).")
  flags.DEFINE_bool("hard_negatives", True, "Use the third column (SNLI contradictions) as hard negatives.")
  flags.DEFINE_integer("max_length", 128, "Max tokens per sentence.")
  flags.DEFINE_integer("seed", 0, "Seed of the init and of the batch order.")
  flags.DEFINE_string("output", "", "Where the pooler goes (default: <workdir>/pooler).")
  flags.DEFINE_string("export", "", "Also write a sentence-transformers folder (encoder + Pooling + Dense) here.")
  flags.DEFINE_bool("force", False, "Overwrite an existing --output / --export.")


def _load_encoder(f, options: embedder_lib.Options):
  """(embedder, source metadata, (config, params, tokenizer) or None) of --workdir or --hf."""
  if bool(f.workdir) == bool(f.hf):
    raise UserError("pass exactly one of --workdir=RUN or --hf=DIR")
  if f.hf:
    emb = embedder_lib.HFEmbedder(f.hf, options)
    return emb, {"kind": "hf", "path": os.path.abspath(f.hf)}, None
  config, params, step = load.load_run(f.workdir, f.step)
  tok = load.run_tokenizer(f.workdir, config, step, f.tokenizer)
  identity = f"{os.path.abspath(f.workdir)}@{step}"  # As crossbert_jax.evaluate names the run.
  emb = embedder_lib.JaxEmbedder(EncoderSpec.from_config(config.model), params["encoder"], tok, options, identity)
  return emb, {"kind": "workdir", "path": os.path.abspath(f.workdir), "step": step}, (config, params, tok)


def _output_inputs(f) -> dict[str, str]:
  """The inputs no output of this command may be, contain or sit inside."""
  return {"--workdir": f.workdir, "--hf": f.hf, "--pairs": f.pairs}


def export_sentence_transformers(output: str, emb, pooler: pooler_lib.LoadedPooler, run, force: bool,
                                 inputs: dict[str, str] | None = None) -> float:
  """Writes encoder + Pooling + Dense as a sentence-transformers folder; returns the max abs diff.

  `inputs` ({flag: path}) are folders the export may not be, contain or sit inside
  (`core.outputs`); it never replaces a training run either, even with `force`.
  """
  from sentence_transformers import SentenceTransformer  # Local: torch.

  if pooler.kind != "mean":
    raise UserError("--export: sentence-transformers has no attention-pooling module; export a --kind=mean pooler")
  with outputs.staged_output_dir(output, force, flag="--export", inputs=inputs) as tmp:
    if run is not None:  # Our encoder: the HF export (weights, tokenizer, Transformer + Pooling), verified.
      config, params, tok = run
      convert.export(config, params, tok, tmp, do_verify=True)
      seq_len = config.data.seq_len
    else:  # A local HF folder: copied, with mean pooling as our HFEmbedder.
      shutil.copytree(emb_path(emb), tmp, dirs_exist_ok=True)
      seq_len = int(emb.model.config.max_position_embeddings)
      hf_files.sentence_transformers_files(tmp, int(emb.model.config.hidden_size), seq_len)
    dense = pooler.params["dense"]
    hf_files.dense_module_files(tmp, np.asarray(dense["kernel"]), np.asarray(dense["bias"]))
    sentences = list(convert.VERIFY_SENTENCES)
    st = SentenceTransformer(str(tmp), device="cpu")
    # Compared at the folder's own truncation (the run's sequence length), which may be below --max_length.
    same = embedder_lib.Options(max_length=min(st.max_seq_length or seq_len, emb.options.max_length))
    ours = (embedder_lib.JaxEmbedder(emb.spec, emb.params, emb.tok, same, emb.identity)
            if run is not None else embedder_lib.HFEmbedder(emb_path(emb), same))
    st.max_seq_length = same.max_length
    diff = float(
        np.abs(st.encode(sentences, convert_to_numpy=True) -
               pooler_lib.PoolerEmbedder(ours, pooler).embed(sentences)).max())
    if not diff <= convert.TOLERANCE:
      raise UserError(f"--export: SentenceTransformer differs from the JAX pooler by {diff:.2e} "
                      f"(> {convert.TOLERANCE:g}); the export does not match")
  return diff


def emb_path(emb) -> str:
  return emb.identity.removeprefix("hf:")


@exit_on_user_error
def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  no_positional(argv, "; every option is a --flag", joined=True)
  f = flags.FLAGS
  logging.set_verbosity(logging.WARNING)  # Orbax restore chatter.
  if not f.pairs:
    raise UserError("--pairs is empty: give a SentEval NLI folder (e.g. ../shared/data/senteval/downstream/SNLI) "
                    "or a .tsv/.jsonl file with anchor,positive[,negative] columns")
  if not f.output and not f.workdir:
    raise UserError("--output is empty: with --hf, say where the pooler goes")
  output = f.output or os.path.join(f.workdir, "pooler")
  # Every output is checked before the slow embedding: the pooler may sit inside the run (its
  # default) or the --hf folder, never in checkpoints/; --force never replaces a run or an input.
  pooler_dir = {"inputs": _output_inputs(f), "may_sit_inside": ("--workdir", "--hf"), "inside_run_ok": True}
  outputs.check_output_dir(output, f.force, **pooler_dir)
  export_inputs = {**_output_inputs(f), "--output": output}
  if f.export:
    outputs.check_output_dir(f.export, f.force, flag="--export", inputs=export_inputs)
    if f.kind != "mean":
      raise UserError("--export: sentence-transformers has no attention-pooling module; use --kind=mean")
  opts = pooler_lib.TrainOptions(f.kind, f.out_dim, f.steps, f.batch_size, f.learning_rate, f.scale, f.hard_negatives,
                                 f.seed)
  opts.check()
  if f.max_length < 2:
    raise UserError(f"--max_length={f.max_length}: sentences need at least 2 tokens (e.g. --max_length=128)")
  anchors, positives, negatives = pooler_lib.read_pairs(f.pairs, f.pairs_split, f.pairs_columns)
  emb, source, run = _load_encoder(f, embedder_lib.Options(max_length=f.max_length))
  texts, triples = pooler_lib.triples_from(anchors, positives, negatives if f.hard_negatives else None)
  start = time.perf_counter()
  features = pooler_lib.frozen_features(emb, f.kind, texts)
  print(
      f"embedded {len(texts)} sentences ({len(triples)} training rows) with the frozen encoder in "
      f"{time.perf_counter() - start:.1f}s", flush=True)
  start = time.perf_counter()
  params, losses = pooler_lib.train_pooler(features, triples, opts)
  seconds = time.perf_counter() - start
  meta = {
      "kind": f.kind, "identity": emb.identity, "source": source, "max_length": f.max_length,
      "in_dim": int(features.hidden_NxLxD.shape[-1]), "out_dim": int(params["dense"]["kernel"].shape[-1]), "train": {
          **opts.__dict__, "pairs": os.path.abspath(f.pairs), "pairs_split": f.pairs_split, "rows": len(triples),
          "sentences": len(texts)}, "loss_first": losses[0], "loss_last_10": float(np.mean(losses[-10:])),
      "train_seconds": seconds}
  with outputs.staged_output_dir(output, f.force, **pooler_dir) as tmp:
    pooler_lib.save_pooler(str(tmp), params, meta)
  print(
      f"trained the pooler in {seconds:.1f}s: loss {losses[0]:.4f} -> {meta['loss_last_10']:.4f} "
      f"(mean of the last 10 steps); wrote {output}", flush=True)
  if f.export:
    diff = export_sentence_transformers(f.export, emb, pooler_lib.load_pooler(output), run, f.force, export_inputs)
    print(
        f"exported {f.export} (sentence-transformers: Transformer, Pooling, Dense); "
        f"max abs diff vs JAX {diff:.2e} (tolerance {convert.TOLERANCE:g}): verified", flush=True)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags_or_exit)

r"""MTEB on our checkpoints: an encoder wrapper for the `mteb` package, and a CLI.

  python -m crossbert_jax.mteb_eval --workdir=runs/demo/crossbert --tasks=STSBenchmark,SciFact \
      --output_dir=runs/demo/mteb

MTEB downloads each task's data from the Hugging Face Hub, so this needs the internet. Offline,
score BEIR-format folders with `python -m crossbert_jax.evaluate --retrieval=DIR` instead.
"""

import os
import sys
from typing import Any, Sequence

import numpy as np
from absl import app
from absl import flags

from crossbert_jax import embedder as embedder_lib
from crossbert_jax.errors import UserError, exit_on_user_error, parse_flags_or_exit


def _texts(inputs: Any) -> list[str]:
  """Sentences from a list of strings or from mteb 2.x's DataLoader of {"text": [...]} batches."""
  if isinstance(inputs, str):
    return [inputs]
  items = list(inputs)
  if items and isinstance(items[0], dict):
    return [str(t) for batch in items for t in batch["text"]]
  return [str(t) for t in items]


class MtebEncoder:
  """Wraps an `Embedder` in mteb's EncoderProtocol: `encode(inputs, ...) -> NxD numpy`."""

  def __init__(self, emb: embedder_lib.Embedder, name: str = "crossbert_jax/local", normalize: bool = True):
    self.embedder, self.normalize, self.name = emb, normalize, name

  @property
  def mteb_model_meta(self):
    """mteb's ModelMeta for the results (imported here: mteb is slow to import)."""
    from mteb.models import ModelMeta

    return ModelMeta.create_empty({"name": self.name, "revision": "local"})

  def encode(self, inputs: Any, *, batch_size: int = 32, task_metadata: Any = None, hf_split: str | None = None,
             hf_subset: str | None = None, prompt_type: Any = None, **kwargs: Any) -> np.ndarray:
    """NxD float32 embeddings (unit length when normalize); batching is the embedder's own."""
    del batch_size, task_metadata, hf_split, hf_subset, prompt_type, kwargs
    out = self.embedder.embed(_texts(inputs))
    if self.normalize:
      out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out

  def similarity(self, embeddings1, embeddings2):
    """Cosine similarity matrix (as sentence-transformers)."""
    import torch

    a, b = (torch.nn.functional.normalize(torch.as_tensor(np.asarray(e)), dim=-1) for e in (embeddings1, embeddings2))
    return a @ b.T

  def similarity_pairwise(self, embeddings1, embeddings2):
    """Row-wise cosine similarity."""
    import torch

    a, b = (torch.nn.functional.normalize(torch.as_tensor(np.asarray(e)), dim=-1) for e in (embeddings1, embeddings2))
    return (a * b).sum(-1)


def _define_flags() -> None:
  flags.DEFINE_string("workdir", "", "Training run workdir.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
  flags.DEFINE_string("hf", "", "A local Hugging Face encoder folder instead of --workdir.")
  flags.DEFINE_string("tokenizer", "", "SentencePiece model (default: the run's config).")
  flags.DEFINE_string("tasks", "", "Comma-separated MTEB task names, e.g. STSBenchmark,SciFact.")
  flags.DEFINE_string("layers", "-1", "Layer(s) to pool (as crossbert_jax.evaluate).")
  flags.DEFINE_integer("max_length", 512, "Max tokens per text.")
  flags.DEFINE_bool("normalize", True, "Unit-length embeddings.")
  flags.DEFINE_string("output_dir", "mteb_results", "Where mteb writes its results.")


def main(argv: Sequence[str]) -> None:
  """CLI entry point."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {' '.join(argv[1:])}; every option is a --flag")
  f = flags.FLAGS
  names = [t.strip() for t in f.tasks.split(",") if t.strip()]
  if not names:
    raise UserError("--tasks is empty: name MTEB tasks, e.g. --tasks=STSBenchmark,SciFact")
  if bool(f.workdir) == bool(f.hf):
    raise UserError("pass exactly one of --workdir=RUN or --hf=DIR")
  import mteb  # Local: heavy.

  options = embedder_lib.Options(embedder_lib.parse_layers(f.layers), max_length=f.max_length)
  if f.workdir:
    from crossbert_jax import evaluate  # Local: pulls in the checkpoint stack.
    emb, label = evaluate.jax_model(f.workdir, f.step, options, f.tokenizer)
  else:
    emb, label = embedder_lib.HFEmbedder(f.hf, options, progress=True), os.path.basename(f.hf.rstrip("/"))
  try:
    tasks = mteb.get_tasks(tasks=names)
  except (KeyError, ValueError) as e:
    raise UserError(f"--tasks: {str(e).splitlines()[0]}; see mteb.get_tasks() for names") from None
  encoder = MtebEncoder(emb, name=f"crossbert_jax/{label}", normalize=f.normalize)
  try:
    result = mteb.evaluate(encoder, tasks, cache=mteb.ResultCache(f.output_dir))
  except (OSError, ConnectionError) as e:
    raise UserError(f"MTEB could not fetch its task data ({type(e).__name__}); it needs the internet "
                    "(Hugging Face Hub) - offline, use crossbert_jax.evaluate --retrieval=BEIR_DIR") from None
  for task_result in result.task_results:
    print(task_result.task_name, task_result.get_score(), flush=True)


def cli() -> None:
  """Console entry point."""
  _define_flags()
  app.run(exit_on_user_error(main), flags_parser=parse_flags_or_exit)


if __name__ == "__main__":
  cli()
  sys.exit(0)

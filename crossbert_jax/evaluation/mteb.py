"""MTEB through its own code: an encoder wrapper (`encode`, `similarity`) with a run's name and revision.

The tasks (by benchmark or name, local data or the Hub) are `mteb_tasks`, the per-task run with
resume `mteb_run`, the table `mteb_table`; the CLI is `crossbert_jax.mteb_eval`.
"""

from typing import Any

import numpy as np

from crossbert_jax.evaluation import embedder as embedder_lib


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
  def __init__(self, emb: embedder_lib.Embedder, name: str = "crossbert_jax/local", normalize: bool = True,
               revision: str = "local"):
    self.embedder, self.normalize, self.name, self.revision = emb, normalize, name, revision

  @property
  def mteb_model_meta(self):
    """mteb's ModelMeta for the results: results/<name>/<revision>/ (mteb is slow to import)."""
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    return ModelMeta.create_empty({
        "name": self.name, "revision": self.revision, "framework": ["JAX"],
        "similarity_fn_name": ScoringFunction.COSINE})

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

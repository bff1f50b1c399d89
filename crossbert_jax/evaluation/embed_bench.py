"""The embedder against sentence-transformers' `encode` of the same exported model, on the same texts.

Texts: a mix of short sentences and long documents (truncated to max_length tokens) from the
built-in corpus, shuffled with a fixed seed. Both sides embed the full list once untimed (compiles
every batch shape, warms torch), then once timed. Reported: texts/s each, the ratio (ours /
sentence-transformers), the max abs difference of the embeddings (mean pooling, not normalised),
and the device count our side split its batches over.
"""

import time
from typing import Any

import numpy as np

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus
from crossbert_jax.evaluation import embedder as embedder_lib


def bench_texts(n: int, long_fraction: float = 0.1, seed: int = 0) -> list[str]:
  """n texts: (1 - long_fraction) short sentences, long_fraction documents of ~600 words, shuffled."""
  docs = corpus.builtin_documents()
  sentences = [s.strip() for d in docs for s in d.replace("\n", " ").split(". ") if len(s.split()) >= 3]
  words = " ".join(docs).split()
  n_long = int(n * long_fraction)
  rng = np.random.default_rng(seed)
  starts = rng.integers(0, max(1, len(words) - 600), n_long)
  long_docs = [" ".join(words[s:s + 600]) for s in starts]
  short = [sentences[i] for i in rng.integers(0, len(sentences), n - n_long)]
  texts = short + long_docs
  return [texts[i] for i in rng.permutation(len(texts))]


def _timed(fn, texts):
  fn(texts)  # Untimed: compiles every shape / warms the threads.
  start = time.perf_counter()
  out = fn(texts)
  return out, time.perf_counter() - start


def compare(ours: embedder_lib.Embedder, hf_dir: str, texts: list[str], st_batch_size: int = 32) -> dict[str, Any]:
  """texts/s of `ours` and of sentence-transformers' encode of hf_dir, their ratio and max abs diff."""
  from sentence_transformers import SentenceTransformer  # Local: torch is heavy.

  try:
    st = SentenceTransformer(hf_dir, device="cpu")
  except (OSError, ValueError) as e:
    raise UserError(f"--hf={hf_dir} is not a sentence-transformers folder ({str(e).splitlines()[0]}); export "
                    "the run with `python -m crossbert_jax.export`") from None
  st.max_seq_length = ours.options.max_length
  encode = lambda t: st.encode(t, batch_size=st_batch_size, convert_to_numpy=True, show_progress_bar=False)
  theirs_NxD, st_s = _timed(encode, texts)
  ours_NxD, our_s = _timed(ours.embed, texts)
  return {
      "texts": len(texts), "tokens": int(ours.tokens_seen // 2), "max_length": ours.options.max_length,
      "devices": getattr(ours, "_n", 1),
      "ours_texts_per_s": len(texts) / our_s, "st_texts_per_s": len(texts) / st_s,
      "ratio": st_s / our_s, "max_abs_diff": float(np.abs(ours_NxD - theirs_NxD).max()),
      "ours_s": our_s, "st_s": st_s,
  }


def table_rows(r: dict[str, Any], label: str) -> str:
  """Markdown rows for docs/benchmarks.md."""
  return (f"| {label} | crossbert_jax embedder ({r['devices']} device(s)) | {r['texts']} | "
          f"{r['ours_texts_per_s']:.1f} | {r['ratio']:.2f}x | {r['max_abs_diff']:.1e} |\n"
          f"| {label} | sentence-transformers encode | {r['texts']} | {r['st_texts_per_s']:.1f} | 1.00x | - |\n")

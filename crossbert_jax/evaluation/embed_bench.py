"""The embedder against sentence-transformers' `encode` of the same exported model, on the same texts.

Texts: a mix of short sentences and long documents (truncated to max_length tokens) from the
built-in corpus, shuffled with a fixed seed. Both sides embed the full list once untimed (compiles
every batch shape, warms torch), then once timed. Reported: texts/s each, the ratio (ours /
sentence-transformers), the max abs difference of the embeddings (mean pooling, not normalised; our
side in the run's dtype), and the device count our side split its batches over. Before any timing,
`check_parity` refuses an export that is not the run's: the first PARITY_TEXTS texts embedded in
float32 by both sides must agree within PARITY_TOLERANCE.
"""

import dataclasses
import time
from typing import Any

import numpy as np

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus
from crossbert_jax.evaluation import embedder as embedder_lib

# The run's own export embeds as the run does to float32 rounding: max |diff| measured 4.8e-7 (tiny, 200
# texts up to 512 tokens) and 1.1e-6 (small, docs/benchmarks.md); another run's export of the same shape
# differs by about 1 (1.3 for tiny with another seed). The bound is `export --verify`'s (hf/convert.py).
PARITY_TOLERANCE = 1e-4
PARITY_TEXTS = 64  # Of the benchmark's texts (sentences and long documents), embedded by both sides untimed.


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


def load_st(hf_dir: str, max_length: int):
  """sentence-transformers' model of `hf_dir` on the CPU, truncating at `max_length` tokens."""
  import transformers  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer  # Local: torch is heavy.

  transformers.utils.logging.disable_progress_bar()  # Its "Loading weights" bar: stderr stays ours.
  try:
    st = SentenceTransformer(hf_dir, device="cpu")
  except (OSError, ValueError) as e:
    raise UserError(f"--hf={hf_dir} is not a sentence-transformers folder ({str(e).splitlines()[0]}); export "
                    "the run with `python -m crossbert_jax.export`") from None
  st.max_seq_length = max_length
  return st


def _encode(st, texts: list[str], batch_size: int) -> np.ndarray:
  return st.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)


def check_parity(ours: embedder_lib.JaxEmbedder, st, hf_dir: str, texts: list[str]) -> float:
  """Max |difference| of `ours`'s embeddings of `texts` (in float32) and `st`'s, the export in `hf_dir`.

  UserError when it exceeds PARITY_TOLERANCE (or the widths differ): `hf_dir` is not this run's export,
  and timing the two would compare different models.
  """
  fp32 = dataclasses.replace(ours.spec, dtype="float32", remat="none")
  ours_NxD = embedder_lib.JaxEmbedder(fp32, ours.params, ours.tok, ours.options).embed(texts)
  theirs_NxD = _encode(st, texts, 32)
  fix = "pass the run's own export (python -m crossbert_jax.export --workdir=RUN --output=DIR)"
  if ours_NxD.shape != theirs_NxD.shape:
    raise UserError(f"--hf={hf_dir} embeds into {theirs_NxD.shape[1]} dims, --workdir into {ours_NxD.shape[1]}: "
                    f"another model; {fix}")
  diff = float(np.abs(ours_NxD - theirs_NxD).max())
  if not diff <= PARITY_TOLERANCE:
    raise UserError(f"--hf={hf_dir} is not this run's export: its embeddings of {len(texts)} texts differ from "
                    f"--workdir's by up to {diff:.2g} (float32; the same model stays within {PARITY_TOLERANCE:g}); "
                    f"{fix}")
  return diff


def compare(ours: embedder_lib.Embedder, st, texts: list[str], st_batch_size: int = 32) -> dict[str, Any]:
  """texts/s of `ours` and of sentence-transformers' encode (`st`, from `load_st`), their ratio and max abs diff."""
  theirs_NxD, st_s = _timed(lambda t: _encode(st, t, st_batch_size), texts)
  ours_NxD, our_s = _timed(ours.embed, texts)
  return {
      "texts": len(texts),
      "tokens": int(ours.tokens_seen // 2),
      "max_length": ours.options.max_length,
      "devices": getattr(ours, "_n", 1),
      "ours_texts_per_s": len(texts) / our_s,
      "st_texts_per_s": len(texts) / st_s,
      "ratio": st_s / our_s,
      "max_abs_diff": float(np.abs(ours_NxD - theirs_NxD).max()),
      "ours_s": our_s,
      "st_s": st_s,}


def table_rows(r: dict[str, Any], label: str) -> str:
  """Markdown rows for docs/benchmarks.md."""
  return (f"| {label} | crossbert_jax embedder ({r['devices']} device(s)) | {r['texts']} | "
          f"{r['ours_texts_per_s']:.1f} | {r['ratio']:.2f}x | {r['max_abs_diff']:.1e} |\n"
          f"| {label} | sentence-transformers encode | {r['texts']} | {r['st_texts_per_s']:.1f} | 1.00x | - |\n")

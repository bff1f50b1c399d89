"""A probing task built from the built-in corpus: which of two sentences with the same words is real.

Each pair is a docstring sentence and its words in a seeded random order. Pairs whose two sides do
not tokenise to the same multiset of pieces (or do not fit `max_length`) are dropped, so a
bag-of-words embedding cannot tell the sides apart: whatever a probe finds is word order. The
probe is the frozen protocol of `probes.linear_probe` (standardised features, C chosen on a
validation split of the fit pairs) on the difference of the two mean-pooled embeddings, each pair
in a seeded random orientation (label 1: the real sentence first); that is, a linear score of the
embedding that must rank the real sentence above its shuffle. It is fitted on one part of the
pairs and scored on the others (accuracy; chance is 50%).
Shape letters: N pairs, D embed.
"""

import dataclasses
import re
from typing import Sequence

import numpy as np

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import probes

MIN_WORDS, MAX_WORDS = 8, 24
NUM_PAIRS = 3000
TEST_FRACTION = 1 / 3
MIN_PAIRS = 100
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclasses.dataclass(frozen=True)
class Pairs:
  """Real sentences, the same words shuffled, each pair's orientation and whether it is scored."""
  real: list[str]
  shuffled: list[str]
  real_first_N: np.ndarray  # bool: the probe sees embed(real) - embed(shuffled), label 1.
  test_N: np.ndarray  # bool: scored; the probe is fitted on the others.

  def __len__(self) -> int:
    return len(self.real)


def sentences(documents: Sequence[str]) -> list[str]:
  """Every distinct sentence of MIN_WORDS..MAX_WORDS words, in corpus order (paragraphs are lines)."""
  out = (s for d in documents for line in d.split("\n") for s in _SENTENCE_END.split(line))
  return list(dict.fromkeys(s for s in out if MIN_WORDS <= len(s.split()) <= MAX_WORDS))


def shuffle_words(sentence: str, rng: np.random.Generator) -> str | None:
  """The words of `sentence` in a random order that differs from it (None if none found in 10 draws)."""
  words = sentence.split()
  for _ in range(10):
    out = " ".join(words[i] for i in rng.permutation(len(words)))
    if out != " ".join(words):
      return out
  return None


def make_pairs(documents: Sequence[str], tok: tokenizer_lib.AnyTokenizer, max_length: int, *,
               num_pairs: int = NUM_PAIRS, seed: int = 0) -> Pairs:
  """Up to `num_pairs` pairs from a seeded sample of `documents`' sentences (deterministic)."""
  pool = sentences(documents)
  rng = np.random.default_rng(seed)
  candidates = [pool[i] for i in rng.permutation(len(pool))[:2 * num_pairs]]  # Room for those dropped below.
  shuffled = [shuffle_words(s, np.random.default_rng([seed, i])) for i, s in enumerate(candidates)]
  keep = [i for i, s in enumerate(shuffled) if s is not None]
  ids_a = tok.encode_batch([candidates[i] for i in keep])
  ids_b = tok.encode_batch([shuffled[i] for i in keep])
  keep = [i for i, a, b in zip(keep, ids_a, ids_b) if len(a) + 2 <= max_length and sorted(a) == sorted(b)]
  keep = keep[:num_pairs]
  if len(keep) < MIN_PAIRS:
    raise UserError(f"word order: only {len(keep)} sampled sentences fit {max_length} tokens and tokenise to the "
                    f"same pieces with their words shuffled (the probe needs {MIN_PAIRS}); a tokenizer whose "
                    "pieces depend on a word's position cannot be probed this way")
  n = len(keep)
  test_N = np.zeros(n, bool)
  test_N[rng.permutation(n)[:round(n * TEST_FRACTION)]] = True
  return Pairs([candidates[i] for i in keep], [shuffled[i] for i in keep], rng.random(n) < 0.5, test_N)


def pair_features(pairs: Pairs, real_NxD: np.ndarray, shuffled_NxD: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(first - second embedding, label 1 where the real sentence is first), in each pair's orientation."""
  first = pairs.real_first_N[:, None]
  x_NxD = np.where(first, real_NxD - shuffled_NxD, shuffled_NxD - real_NxD)
  return x_NxD, pairs.real_first_N.astype(np.int64)


def score(emb: embedder_lib.Embedder, pairs: Pairs, seed: int = 0) -> dict[str, float]:
  """{"accuracy": on the test pairs, "C": the chosen inverse regularisation} of `emb`'s frozen embeddings."""
  both = emb.embed(pairs.real + pairs.shuffled)
  x_NxD, y_N = pair_features(pairs, both[:len(pairs)], both[len(pairs):])
  test = pairs.test_N
  (pred,), c = probes.linear_probe(x_NxD[~test], y_N[~test], [x_NxD[test]], True, "accuracy", seed)
  return {"accuracy": probes.accuracy(y_N[test], pred), "C": c}


def report(pairs: Pairs, accuracies: dict[str, float]) -> str:
  """The lines `evaluate --word_order` prints: the task, one example (the first scored pair), a row per model."""
  i = int(np.flatnonzero(pairs.test_N)[0])
  n_test = int(pairs.test_N.sum())
  width = max(len(k) for k in accuracies)
  rows = [f"  {label:<{width}}  {100 * acc:5.1f}%" for label, acc in accuracies.items()]
  return "\n".join([
      "word order: can a linear probe on the frozen mean-pooled embeddings tell a real sentence from the same",
      f"words shuffled? Fitted on {len(pairs) - n_test:,} pairs of built-in docstring sentences, scored on "
      f"{n_test:,} others.",
      f"  e.g. real:     {pairs.real[i]}",
      f"       shuffled: {pairs.shuffled[i]}",
      *rows,
      f"  {'chance':<{width}}   50.0%  (both sides have the same tokens: a bag of words cannot do better)",])

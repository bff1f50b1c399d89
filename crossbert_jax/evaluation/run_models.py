"""A training run's checkpoint as an evaluation model: `jax_model` (the embedder the evaluate and mteb_eval
commands score) and `word_order_report` (the built-in word-order probe against the same encoder at init).

The checkpoint is read by the commands (`run/load.load_for_evaluation`: run/ is above evaluation/, which
imports no checkpoint code) and handed here as `loaded` = (config, params, tokenizer, step).
"""

import dataclasses
from typing import Any

from etils import epath

from crossbert_jax.data import corpus
from crossbert_jax.evaluation import columns
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import word_order
from crossbert_jax.model.encoder import EncoderSpec


def label(workdir: str, step: int) -> str:
  """A run's column label: its folder's name @ step."""
  return f"{epath.Path(columns.absolute(workdir)).name}@{step}"


def jax_model(workdir: str, loaded: tuple[Any, Any, Any, int], options: embedder_lib.Options, progress: bool = True,
              pooling_given: bool = False) -> tuple[embedder_lib.JaxEmbedder, str]:
  """(embedder, label) for a training run's checkpoint, `loaded` from it. A contrastive run is pooled as it
  was trained (contrast.pooling, as its export's Pooling module) unless the command's --pooling was given
  (`pooling_given`)."""
  config, params, tok, step = loaded
  if "contrast" in config.keys() and not pooling_given:
    options = dataclasses.replace(options, pooling=config.contrast.pooling)
  spec = EncoderSpec.from_config(config.model)
  identity = f"{columns.absolute(workdir)}@{step}"
  return embedder_lib.JaxEmbedder(spec, params["encoder"], tok, options, identity, progress), label(workdir, step)


def word_order_report(workdir: str, loaded: tuple[Any, Any, Any, int], init_encoder: Any, seed: int = 0) -> str:
  """The built-in word-order probe (evaluation/word_order.py) of a run's checkpoint and of the same
  encoder at its random init (`init_encoder`), on the same pairs, as printed lines."""
  config, params, tok, step = loaded
  spec = EncoderSpec.from_config(config.model)
  options = embedder_lib.Options(max_length=config.data.seq_len)  # Sentences as long as it was trained on.
  pairs = word_order.make_pairs(corpus.builtin_documents(), tok, options.max_length, seed=seed)
  from_scratch = not (config.train.init_from or config.train.fork_from)
  models = {
      label(workdir, step): params["encoder"], "random init" + (" (its step 0)" if from_scratch else ""): init_encoder}
  accuracies = {
      name: word_order.score(embedder_lib.JaxEmbedder(spec, p, tok, options), pairs, seed)["accuracy"]
      for name, p in models.items()}
  return word_order.report(pairs, accuracies)

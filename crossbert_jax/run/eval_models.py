"""A training run's checkpoint as an evaluation model: `jax_model` (the embedder the evaluate and mteb_eval
commands score) and `word_order_report` (the built-in word-order probe against the same encoder at init).

Here in run/ rather than in evaluation/: it restores checkpoints with run/load.py, and evaluation/ (a lower
layer) may not import run/. The rest of choosing the models and their columns is evaluation/columns.py.
"""

from etils import epath

from crossbert_jax.data import corpus
from crossbert_jax.evaluation import columns
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import word_order
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.run import load


def _checkpoint(workdir: str, step: int | None, tokenizer_path: str):
  """(config, params, its checked tokenizer, step, label: the run folder's name @ step) of a run's checkpoint."""
  config, params, step = load.load_run(workdir, step)
  tok = load.run_tokenizer(workdir, config, step, tokenizer_path)
  return config, params, tok, step, f"{epath.Path(columns.absolute(workdir)).name}@{step}"


def jax_model(workdir: str, step: int | None, options: embedder_lib.Options, tokenizer_path: str = "",
              progress: bool = True) -> tuple[embedder_lib.JaxEmbedder, str]:
  """(embedder, label) for a training run's checkpoint."""
  config, params, tok, step, label = _checkpoint(workdir, step, tokenizer_path)
  spec = EncoderSpec.from_config(config.model)
  identity = f"{columns.absolute(workdir)}@{step}"
  return embedder_lib.JaxEmbedder(spec, params["encoder"], tok, options, identity, progress), label


def word_order_report(workdir: str, step: int | None = None, tokenizer_path: str = "", seed: int = 0) -> str:
  """The built-in word-order probe (evaluation/word_order.py) of a run's checkpoint and of the same
  encoder at its random init, on the same pairs, as printed lines."""
  config, params, tok, _, label = _checkpoint(workdir, step, tokenizer_path)
  spec = EncoderSpec.from_config(config.model)
  options = embedder_lib.Options(max_length=config.data.seq_len)  # Sentences as long as it was trained on.
  pairs = word_order.make_pairs(corpus.builtin_documents(), tok, options.max_length, seed=seed)
  from_scratch = not (config.train.init_from or config.train.fork_from)
  models = {label: params["encoder"],
            "random init" + (" (its step 0)" if from_scratch else ""): load.init_params(config)["encoder"]}
  accuracies = {label: word_order.score(embedder_lib.JaxEmbedder(spec, p, tok, options), pairs, seed)["accuracy"]
                for label, p in models.items()}
  return word_order.report(pairs, accuracies)

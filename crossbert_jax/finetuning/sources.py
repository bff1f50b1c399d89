"""The encoder a fine-tuning starts from: a training run's checkpoint (--workdir) or a ModernBERT folder (--hf).

A `Source` carries what every trial needs: a column label, the encoder's spec and params (numpy, host), the
tokenizer and its path, and, from a `ModernBertForSequenceClassification` folder, its head and classifier
(so a trial can start from exactly the weights transformers' Trainer starts from). A folder that is a
fine-tuned trial, or not a run, is refused in one line.
"""

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.evaluation import columns
from crossbert_jax.hf import convert
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.run import load

TRIAL_FILE = "trial.json"  # A fine-tuned trial's folder holds it (finetuning/trial.py).


@dataclasses.dataclass(frozen=True)
class Source:
  """An encoder to fine-tune, loaded."""
  kind: str  # "workdir" or "hf"
  path: str  # Absolute.
  label: str  # The table's column.
  identity: str  # path@step (a run) or path (a folder).
  spec: EncoderSpec
  params: dict[str, Any]  # {"encoder"[, "head", "classifier"]}: numpy.
  tokenizer: tokenizer_lib.AnyTokenizer
  tokenizer_path: str
  seq_len: int  # The length it was trained at (the export's max_position_embeddings).

  @property
  def key(self) -> str:
    """A folder name for its trials: the label made path-safe plus a digest of its identity."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.label)
    return f"{safe}-{hashlib.sha256(self.identity.encode()).hexdigest()[:8]}"


def _spec(model_cfg: Any) -> EncoderSpec:
  """The encoder's spec for fine-tuning: the run's numerics, without remat (a 256-token batch of 64 needs none)."""
  spec = EncoderSpec.from_config(model_cfg)
  return dataclasses.replace(spec, remat="none")


def from_workdir(workdir: str, tokenizer: str = "") -> Source:
  """A pretraining run's latest readable checkpoint."""
  if (epath.Path(workdir) / TRIAL_FILE).exists():
    raise UserError(f"--workdir {workdir} is a fine-tuned trial, not a pretraining run: give the run it started "
                    "from, or export the trial with `python -m crossbert_jax.export --workdir=...`")
  config, params, tok, step = load.load_for_evaluation(workdir, None, tokenizer)
  encoder = convert.flatten(params["encoder"])
  path = columns.absolute(workdir)
  return Source("workdir", path, f"{epath.Path(path).name}@{step}", f"{path}@{step}", _spec(config.model),
                {"encoder": convert.unflatten(encoder)}, tok, tok.source, config.data.seq_len)


def from_hf(folder: str) -> Source:
  """A ModernBERT folder: the encoder (ModernBertModel / ForMaskedLM / ForSequenceClassification) and, from a
  sequence classifier, its head and classifier too."""
  if not epath.Path(folder).is_dir():
    raise UserError(f"--hf {folder} is not a folder: give a ModernBERT model folder (config.json, model.safetensors)")
  config, params = convert.read_hf(folder)
  tok = tokenizer_lib.Tokenizer.load(folder)
  path = columns.absolute(folder)
  out = {"encoder": params["encoder"]}
  out.update(_hf_head(epath.Path(folder)))
  return Source("hf", path, epath.Path(path).name, path, _spec(config.model), out, tok, path, config.data.seq_len)


def _hf_head(folder: epath.Path) -> dict[str, Any]:
  """{"head", "classifier"} of a ModernBertForSequenceClassification folder ({} for any other)."""
  hf = json.loads((folder / "config.json").read_text())
  if "ModernBertForSequenceClassification" not in (hf.get("architectures") or []):
    return {}
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  t = safetensors.numpy.load_file(str(folder / "model.safetensors"))
  need = ("head.dense.weight", "head.norm.weight", "classifier.weight", "classifier.bias")
  if any(n not in t for n in need):
    raise UserError(f"--hf {folder}: a ModernBertForSequenceClassification without {need}: re-save it")
  f32 = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))
  return {
      "head": {"dense": {"kernel": f32(t["head.dense.weight"].T)}, "norm": {"scale": f32(t["head.norm.weight"])}},
      "classifier": {"kernel": f32(t["classifier.weight"].T), "bias": f32(t["classifier.bias"])}}


def distinct_labels(srcs: list[Source]) -> list[Source]:
  """Each source with its own column label: `label (path)` where an earlier one has the same (two runs
  whose folders share a name)."""
  out: list[Source] = []
  for src in srcs:
    out.append(dataclasses.replace(src, label=columns.column_label(src.label, src.path, [s.label for s in out])))
  return out

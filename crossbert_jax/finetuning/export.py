"""A fine-tuned trial as a Hugging Face `ModernBertForSequenceClassification` folder, verified in transformers.

Tensors: the encoder through hf/mapping.py's table under `model.`, then `head.dense.weight`,
`head.norm.weight`, `classifier.weight` and `classifier.bias` (torch Linear weights: our kernels transposed).
config.json: the encoder's ModernBertConfig with num_labels, problem_type, classifier_pooling and GLUE's label
names. `verify` loads the folder in transformers (torch, float32) and compares its logits with ours on GLUE-like
pairs: at most TOLERANCE apart.
"""

import json
from typing import Any

import numpy as np
import safetensors.numpy
from etils import epath

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.data.special_ids import SpecialIds
from crossbert_jax.evaluation import glue
from crossbert_jax.finetuning import batches as batches_lib
from crossbert_jax.finetuning import trial as trial_lib
from crossbert_jax.finetuning.classifier import HeadSpec, SequenceClassifier, abstract_params
from crossbert_jax.hf import convert
from crossbert_jax.hf import files as hf_files
from crossbert_jax.hf import mapping as hf_mapping
from crossbert_jax.model import inference
from crossbert_jax.model.encoder import EncoderSpec

TOLERANCE = 1e-5
LABELS = {
    "cola": ("unacceptable", "acceptable"), "sst2": ("negative", "positive"), "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"), "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"), "rte": ("entailment", "not_entailment"), "stsb":
        ("score",)}  # nyu-mll/glue's ClassLabel names.
VERIFY_PAIRS = (
    ("The cat sat on the mat.", "A cat is sitting on a mat."),
    ("It was the best of times, it was the worst of times, it was the age of wisdom.", "Times were mixed."),
    ("Call me Ishmael.", "My name is not Ishmael, and I never went to sea on a whaler in my whole life."),
    ("She ordered a café crème at the naïve little bistro. 😀", "Nobody ordered anything."),
)


def is_trial(folder: str | epath.Path) -> bool:
  return (epath.Path(folder) / trial_lib.TRIAL_FILE).exists()


def load_trial(folder: str | epath.Path) -> tuple[dict[str, Any], EncoderSpec, HeadSpec, dict, Any]:
  """(trial.json, encoder spec (float32), head, params (numpy), tokenizer) of a finished trial."""
  folder = epath.Path(folder)
  info = json.loads((folder / trial_lib.TRIAL_FILE).read_text())
  if not (folder / trial_lib.RESULT_FILE).exists():
    raise UserError(f"--workdir {folder} is a trial that has not finished: rerun its finetune command first")
  spec = EncoderSpec(**{**info["encoder"], "dtype": "float32", "remat": "none"})
  head = HeadSpec(**info["head"])
  params = trial_lib.read_params(folder, abstract_params(spec, head))
  tok = tokenizer_lib.Tokenizer.load(info["source"]["tokenizer"])
  return info, spec, head, params, tok


def tensors(params: dict, spec: EncoderSpec) -> dict[str, np.ndarray]:
  """The HF state dict of ModernBertForSequenceClassification."""
  out = hf_mapping.to_hf(convert.flatten({"encoder": params["encoder"]}), spec)
  out = {hf_mapping.MLM_ENCODER_PREFIX + k: v for k, v in out.items()}
  t = lambda x: np.ascontiguousarray(np.asarray(x, np.float32).T)
  out["head.dense.weight"] = t(params["head"]["dense"]["kernel"])
  out["head.norm.weight"] = np.asarray(params["head"]["norm"]["scale"], np.float32)
  out["classifier.weight"] = t(params["classifier"]["kernel"])
  out["classifier.bias"] = np.asarray(params["classifier"]["bias"], np.float32)
  return out


def hf_config(spec: EncoderSpec, head: HeadSpec, task: str, seq_len: int, specials: SpecialIds) -> dict:
  from transformers import ModernBertConfig  # pylint: disable=g-import-not-at-top  (no torch needed)

  model = {k: getattr(spec, k) for k in spec.__dataclass_fields__}
  out = ModernBertConfig(**hf_mapping.to_hf_config(model, seq_len, specials)).to_dict()
  out.update(hf_mapping.legacy_config_keys(model))
  labels = LABELS[task]
  out.update(architectures=["ModernBertForSequenceClassification"], dtype="float32", classifier_pooling=head.pooling,
             classifier_dropout=0.0, id2label={str(i): l for i, l in enumerate(labels)},
             label2id={l: i for i, l in enumerate(labels)}, finetuning_task=task,
             problem_type="regression" if head.num_labels == 1 else "single_label_classification")
  return out


def our_logits(spec: EncoderSpec, head: HeadSpec, params: dict, batch: dict[str, np.ndarray]) -> np.ndarray:
  """Our float32 logits BxC of a padded batch (jitted: eager flax runs op by op)."""
  import jax  # pylint: disable=g-import-not-at-top

  apply = jax.jit(SequenceClassifier(spec, head).apply)
  return np.asarray(apply({"params": params}, batch["tokens"], batch["positions"], batch["segment_ids"]))


def verify(folder: epath.Path, spec: EncoderSpec, head: HeadSpec, params: dict, tok, seq_len: int) -> dict:
  """transformers' logits of the folder against ours on VERIFY_PAIRS (and their first sides alone)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  firsts, seconds = [a for a, _ in VERIFY_PAIRS], [b for _, b in VERIFY_PAIRS]
  model = transformers.ModernBertForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).eval()
  worst = 0.0
  for pairs in (seconds, None):
    ids = inference.tokenize(tok, firsts, pairs, seq_len)
    batch = inference.pad_batch(ids, max(map(len, ids)), tok.special_ids.pad)
    ours = our_logits(spec, head, params, batch)
    with torch.no_grad():
      theirs = model(input_ids=torch.from_numpy(batch["tokens"].astype(np.int64)),
                     attention_mask=torch.from_numpy(batch["segment_ids"].astype(np.int64))).logits.numpy()
    worst = max(worst, float(np.abs(ours - theirs).max()))
  if not worst <= TOLERANCE:
    raise UserError(f"verify: ModernBertForSequenceClassification logits differ from JAX by {worst:.2e} "
                    f"(> {TOLERANCE:g}); the export does not match this classifier")
  return {"logits_max_abs_diff": worst}


def export_trial(workdir: str, output: str, do_verify: bool = False, force: bool = False) -> dict | None:
  """Writes the trial in `workdir` as a ModernBertForSequenceClassification folder `output` (atomically)."""
  outputs.check_output_dir(output, force, inputs={"--workdir": workdir})
  info, spec, head, params, tok = load_trial(workdir)
  task, seq_len = info["trial"]["task"], info["source"]["seq_len"]
  result = None
  with outputs.staged_output_dir(output, force, inputs={"--workdir": workdir}) as tmp:
    st = tensors(params, spec)
    (tmp / "model.safetensors").write_bytes(safetensors.numpy.save(st, metadata={"format": "pt"}))
    hf_files.write_json(tmp / "config.json", hf_config(spec, head, task, seq_len, tok.special_ids))
    hf_files.write_tokenizer(tmp, tok, seq_len)
    dev = json.loads((epath.Path(workdir) / trial_lib.RESULT_FILE).read_text())["dev"]
    scores = ", ".join(f"{glue.ROW_TITLES[r]} {100 * glue.row_score(m):.1f}" for r, m in dev.items())
    (tmp / "README.md"
    ).write_text(f"# {glue.ROW_TITLES.get(task, task)} classifier\n\nFine-tuned with `python -m crossbert_jax.finetune` "
                 f"from {info['source']['identity']} ({info['start']}): {info['trial']}. Dev: {scores}.\n")
    if do_verify:
      result = verify(tmp, spec, head, params, tok, min(seq_len, batches_lib.buckets(info["max_length"])[-1]))
  return result

"""Hugging Face conversion of a CrossBERT encoder: export, verify against transformers, import.

Export writes a folder that `transformers.AutoModel` and `sentence_transformers.SentenceTransformer`
load with no custom code; the weights go through `hf.mapping`'s table and are written from numpy
(export itself needs no torch; `verify` does). Import writes `params.safetensors` (keys are our
param paths, e.g. `encoder/layers_1/attn/Wqkv/kernel`) plus our full `config.json`; read it back
with `load_imported` (what `train.init_from` uses). Every output is written to a temporary sibling
folder and renamed at the end. The CLI is `crossbert_jax.export`.
Shape letters: B batch, L length, D embed, V vocab.
"""

import json
from typing import Any, Sequence

from etils import epath
import jax
import numpy as np
import safetensors.numpy

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives
from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.hf import files as hf_files
from crossbert_jax.hf import import_config
from crossbert_jax.hf import mapping as hf_mapping
from crossbert_jax.model import inference
from crossbert_jax.model.encoder import EncoderSpec

TOLERANCE = 1e-4
PARAMS_FILE = "params.safetensors"
# Real sentences of varied lengths (so the batch pads), with accents and an emoji.
VERIFY_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
    "of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "Call me Ishmael.",
    "Four score and seven years ago our fathers brought forth on this continent a new nation.",
    "She ordered a café crème and a croissant at the naïve little bistro. 😀",
    "Hello!",
    "All happy families are alike; each unhappy family is unhappy in its own way.",
    "The sun rose slowly over the quiet hills, and the river shone like silver in the morning light.",
)

# -- numpy views of our params ---------------------------------------------------------------


def flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
  """Nested param dicts -> {'a/b/c': numpy array}."""
  out = {}
  for k, v in tree.items():
    path = f"{prefix}{k}"
    if isinstance(v, dict) or hasattr(v, "items"):
      out.update(flatten(v, path + "/"))
    else:
      out[path] = np.asarray(jax.device_get(v))
  return out


def unflatten(flat: dict[str, np.ndarray]) -> dict:
  """{'a/b/c': array} -> nested dicts."""
  tree: dict = {}
  for path, x in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = x
  return tree


def inference_spec(model_cfg: Any) -> EncoderSpec:
  """The encoder spec for fp32 inference (compute dtype and remat do not change the params)."""
  spec = EncoderSpec.from_config(model_cfg)
  return EncoderSpec(**{**spec.__dict__, "dtype": "float32", "remat": "none"})


def _tokenizer_kind(tok: tokenizer_lib.AnyTokenizer) -> str:
  return "SentencePiece" if isinstance(tok, tokenizer_lib.Tokenizer) else "Hugging Face tokenizer.json"


def write_hf(out: epath.Path, config: plan_lib.Settings, params: Any, tok: tokenizer_lib.AnyTokenizer,
             info: dict | None = None) -> None:
  """Writes the HF folder contents into `out` (an existing, empty folder)."""
  spec = inference_spec(config.model)
  with_head = objectives.get(config.objective).exports_mlm_head
  flat = {k: v for k, v in flatten(params).items() if k.startswith(("encoder/", "head/"))}
  tensors = hf_mapping.to_hf(flat, spec, with_head=with_head)
  (out / "model.safetensors").write_bytes(safetensors.numpy.save(tensors, metadata={"format": "pt"}))
  hf_files.write_json(out / "config.json", hf_files.hf_config(config, tok.special_ids))
  hf_files.write_tokenizer(out, tok, config.data.seq_len)
  hf_files.sentence_transformers_files(out, spec.embed_dim, config.data.seq_len, *hf_files.sentence_embedding(config))
  info = info or {"step": None, "tokens_seen": None, "loss": None, "results": None}
  (out / "README.md").write_text(hf_files.model_card(config, info, info.get("verify"), _tokenizer_kind(tok)))


def verify(folder: epath.Path, config: plan_lib.Settings, params: Any, tok: tokenizer_lib.Tokenizer,
           sentences: Sequence[str] = VERIFY_SENTENCES) -> dict:
  """Loads `folder` in transformers / sentence-transformers (torch CPU fp32) and compares with JAX.

  Returns the measured numbers; raises UserError (one line) on any mismatch.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top

  spec = inference_spec(config.model)
  seq_len = config.data.seq_len
  ids = inference.tokenize(tok, sentences, max_length=seq_len)
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
  hf_ids = [hf_tok(s, truncation=True, max_length=seq_len)["input_ids"] for s in sentences]
  for s, a, b in zip(sentences, ids, hf_ids):
    if a != b:
      raise UserError(f"verify: tokenizer ids differ on {s[:40]!r}: ours {a[:12]}..., HF {b[:12]}...")

  length = max(len(x) for x in ids)
  batch = inference.pad_batch(ids, length, tok.special_ids.pad)
  ours_BxLxD = np.asarray(
      inference.make_encode_fn(spec)(params["encoder"], batch["tokens"], batch["positions"], batch["segment_ids"]))
  valid_BxL = batch["segment_ids"] > 0

  with_head = objectives.get(config.objective).exports_mlm_head
  arch = getattr(transformers, hf_files.hf_config(config)["architectures"][0])
  model = arch.from_pretrained(str(folder), dtype=torch.float32).eval()
  with torch.no_grad():
    enc = hf_tok(list(sentences), padding=True, truncation=True, max_length=seq_len, return_tensors="pt")
    if with_head:
      out = model(**enc)
      hidden = model.model(**enc).last_hidden_state.numpy()
    else:
      hidden = model(**enc).last_hidden_state.numpy()
  hidden_diff = float(np.abs(hidden - ours_BxLxD)[valid_BxL].max())
  result = {"hidden_max_abs_diff": hidden_diff}
  if not hidden_diff <= TOLERANCE:
    raise UserError(f"verify: transformers last_hidden_state differs from JAX by {hidden_diff:.2e} "
                    f"(> {TOLERANCE:g}); the export does not match this encoder")
  if with_head:
    logits = np.asarray(mlm_logits(config, params, ours_BxLxD))
    logit_diff = float(np.abs(out.logits.numpy() - logits)[valid_BxL].max())
    result["mlm_logits_max_abs_diff"] = logit_diff
    if not logit_diff <= TOLERANCE:
      raise UserError(f"verify: ModernBertForMaskedLM logits differ from JAX by {logit_diff:.2e} (> {TOLERANCE:g})")

  pooling, normalize = hf_files.sentence_embedding(config)
  ours_BxD = np.asarray(inference.pool(ours_BxLxD, batch["segment_ids"], pooling))
  if normalize:
    ours_BxD = ours_BxD / np.maximum(np.linalg.norm(ours_BxD, axis=-1, keepdims=True), 1e-12)
  st = SentenceTransformer(str(folder), device="cpu")
  st_BxD = st.encode(list(sentences), batch_size=len(sentences), convert_to_numpy=True)
  st_diff = float(np.abs(st_BxD - ours_BxD).max())
  result["sentence_max_abs_diff"] = st_diff
  if not st_diff <= TOLERANCE:
    what = f"{pooling}-pooled{', normalised' if normalize else ''}"
    raise UserError(f"verify: SentenceTransformer.encode differs from the JAX {what} embedding "
                    f"by {st_diff:.2e} (> {TOLERANCE:g})")
  return result


def mlm_logits(config: plan_lib.Settings, params: Any, hidden_BxLxD: Any) -> jax.Array:
  """Logits BxLxV of the flat-BERT MLM head on encoder outputs (fp32)."""
  from crossbert_jax.model.models import MlmHead  # pylint: disable=g-import-not-at-top

  spec = inference_spec(config.model)
  embedding_VxD = params["encoder"]["embeddings"]["tok_embeddings"]["embedding"]
  return MlmHead(spec).apply({"params": params["head"]}, hidden_BxLxD, embedding_VxD)


def export(config: plan_lib.Settings, params: Any, tok: tokenizer_lib.Tokenizer, output: str | epath.Path, *,
           do_verify: bool = False, force: bool = False, info: dict | None = None,
           workdir: str | epath.Path | None = None) -> dict | None:
  """Writes the HF folder `output` (atomically); with do_verify, checks it before the rename.

  `workdir`: the run exported, which `output` must not be, sit inside, or contain
  (`core.outputs.check_output_dir`, which also keeps it out of any training run).
  """
  if tok.vocab_size > config.model.vocab_size:
    raise UserError(f"tokenizer has {tok.vocab_size} pieces but model.vocab_size={config.model.vocab_size}: "
                    "pass the run's own tokenizer with --tokenizer")
  output = epath.Path(output)
  result = None
  with outputs.staged_output_dir(output, force, inputs={"--workdir": workdir}) as tmp:
    write_hf(tmp, config, params, tok, info)
    if do_verify:
      result = verify(tmp, config, params, tok)
      card_info = {**(info or {"step": None, "tokens_seen": None, "loss": None, "results": None}), "verify": result}
      (tmp / "README.md").write_text(hf_files.model_card(config, card_info, result, _tokenizer_kind(tok)))
  return result


# -- import ----------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": "bfloat16"}


def _load_float_tensors(data: bytes, source: str) -> dict[str, np.ndarray]:
  """float32 arrays of a safetensors file (BF16 too, which safetensors.numpy cannot read)."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top

  n = int.from_bytes(data[:8], "little")
  damaged = UserError(f"{source}: model.safetensors is truncated or damaged ({len(data)} bytes); "
                      "re-download or re-save the model folder")
  try:
    header = json.loads(data[8:8 + n]) if len(data) >= 8 and 8 + n <= len(data) else None
  except (ValueError, UnicodeDecodeError):
    header = None
  if not isinstance(header, dict):
    raise damaged
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      begin, end = info["data_offsets"]
      if not 0 <= begin <= end <= len(data) - 8 - n:
        raise damaged
    except (KeyError, TypeError, ValueError):
      raise damaged from None
    dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
    if dtype is None:
      raise UserError(f"{source}: tensor {name} has dtype {info.get('dtype')}; expected float weights")
    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    try:
      x = np.frombuffer(data[8 + n + begin:8 + n + end], dtype=dtype).reshape(info["shape"])
    except (KeyError, TypeError, ValueError):
      raise damaged from None
    out[name] = x if x.dtype == np.float32 else x.astype(np.float32)
  return out


def _read_hf_config(path: epath.Path, source: str) -> dict:
  """config.json as a dict; not JSON, not an object or a required key missing: one UserError."""
  try:
    hf = json.loads(path.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise UserError(f"{source}: config.json is not valid JSON ({' '.join(str(e).split())[:120]}); "
                    "re-save or re-download the model folder") from None
  if not isinstance(hf, dict):
    raise UserError(f"{source}: config.json holds a {type(hf).__name__}, not a ModernBERT config object")
  return hf


def _model_values(hf: dict, source: str) -> dict:
  try:
    return hf_mapping.from_hf_config(hf, source)
  except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
    what = f"lacks {e}" if isinstance(e, KeyError) else f"has a bad value ({e})"
    raise UserError(f"{source}: config.json {what}; it is not a complete ModernBERT config") from None


def read_hf(folder: str | epath.Path, objective: str = "crossbert", scan_layers: bool = False,
            keep_head: bool = False) -> tuple[plan_lib.RunPlan, dict]:
  """(our config, params {'encoder': ...[, 'head': ...]}) from a ModernBERT safetensors folder.

  The MLM head is read for an objective that exports one (mlm), and with `keep_head` whenever the
  folder has one.
  """
  folder = epath.Path(folder)
  source = f"--hf {folder}"
  for name in ("config.json", "model.safetensors"):
    if not (folder / name).is_file():
      raise UserError(f"{source} holds no {name}: point --hf at a ModernBERT model folder")
  hf = _read_hf_config(folder / "config.json", source)
  tensors = _load_float_tensors((folder / "model.safetensors").read_bytes(), source)
  prefix = hf_mapping.MLM_ENCODER_PREFIX
  has_prefix = any(k.startswith(prefix) for k in tensors)
  with_head = objectives.get(objective).exports_mlm_head or (keep_head and has_prefix and
                                                             "head.dense.weight" in tensors)
  if with_head and "head.dense.weight" not in tensors:
    raise UserError(f"{source} holds no MLM head (head.dense.weight): import it with --objective=crossbert")
  if has_prefix and not with_head:
    tensors = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
  values = config_lib.get_config(objective, "base").to_dict()
  # The model's own numerics, not the pod defaults of `base` (bf16, remat): a run that starts
  # from it (train.init_from) sets its compute settings in its own config.
  values["model"].update(_model_values(hf, source), scan_layers=scan_layers, dtype="float32", remat="none")
  values["data"]["seq_len"] = int(hf.get("max_position_embeddings", values["data"]["seq_len"]))
  config = plan_lib.of_saved(values)
  spec = EncoderSpec.from_config(config.model)
  flat = hf_mapping.from_hf(tensors, spec, with_head=with_head, source=source)
  return config, unflatten(flat)


def import_hf(hf: str, output: str, objective: str = "crossbert", scan_layers: bool = False,
              force: bool = False) -> epath.Path:
  """Writes `output`/params.safetensors (our param paths) + `output`/config.json (our config).

  An MLM head in `hf` is kept (a BERT run starting from it keeps it; CrossBERT's reconstructor
  starts fresh), and the folder's tokenizer files are copied beside (a run's default tokenizer).
  """
  outputs.check_output_dir(output, force, inputs={"--hf": hf})  # Before the slow read.
  config, params = read_hf(hf, objective, scan_layers, keep_head=True)
  output = epath.Path(output)
  with outputs.staged_output_dir(output, force, inputs={"--hf": hf}) as tmp:
    (tmp / PARAMS_FILE).write_bytes(safetensors.numpy.save(flatten(params)))
    hf_files.write_json(tmp / "config.json", config.to_dict())
    import_config.copy_tokenizer(epath.Path(hf), tmp)
  return output


def load_imported(folder: str | epath.Path) -> tuple[plan_lib.RunPlan, dict]:
  """(config, params) written by `import_hf`: params as nested numpy dicts ('encoder'[, 'head'])."""
  folder = epath.Path(folder)
  if not (folder / PARAMS_FILE).is_file() or not (folder / "config.json").is_file():
    raise UserError(f"{folder} holds no {PARAMS_FILE} + config.json: make it with "
                    "`python -m crossbert_jax.export import --hf=DIR --output=DIR`")
  config = plan_lib.of_saved(json.loads((folder / "config.json").read_text()))
  return config, unflatten(safetensors.numpy.load((folder / PARAMS_FILE).read_bytes()))

"""The non-weight files of an exported Hugging Face folder.

config.json (`ModernBertConfig`), the tokenizer (our SentencePiece model converted offline with
transformers' converter), the sentence-transformers module files (mean pooling, and a Dense
module for a trained pooler) and the model card. `export.py` writes them next to model.safetensors.
"""

import inspect
import json
from typing import Any

from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections
from crossbert_jax.data import hf_tokenizer as hf_tokenizer_lib
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds
from crossbert_jax.hf import mapping as hf_mapping
from crossbert_jax.core import objectives
from crossbert_jax.core.errors import UserError


def write_json(path: epath.Path, obj: Any) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


# -- tokenizer -------------------------------------------------------------------------------


def hf_tokenizer(tok: tokenizer_lib.Tokenizer):
  """Our SentencePiece model as a `tokenizers.Tokenizer` that adds [CLS] ... [SEP] (offline)."""
  from tokenizers import AddedToken, processors  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf  # pylint: disable=g-import-not-at-top

  if "legacy" not in inspect.signature(SpmConverter.build_tokenizer_from_spm_proto).parameters:
    # Before 5.24 the converter skips SentencePiece's whitespace rules and BPE merges: ids would differ.
    raise UserError(f"transformers {transformers.__version__} converts SentencePiece models inexactly: install "
                    "transformers==5.24.0 (requirements.txt) to export")
  proto = import_protobuf().ModelProto()
  proto.ParseFromString(tok.serialized_proto)
  vocab = [(p.piece, p.score) for p in proto.pieces]
  if proto.trainer_spec.model_type == 2:  # BPE: merges are rebuilt from the piece scores.
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
  # legacy=True reproduces SentencePiece's dummy prefix exactly (also before a leading "▁").
  fast = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, legacy=True)
  fast.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in tokenizer_lib.SPECIAL_PIECES])
  cls, sep = tokenizer_lib.CLS, tokenizer_lib.SEP
  fast.post_processor = processors.TemplateProcessing(
      single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, tokenizer_lib.CLS_ID),
                                                                                     (sep, tokenizer_lib.SEP_ID)])
  return fast


def special_tokens_map() -> dict[str, str]:
  return {
      "pad_token": tokenizer_lib.PAD, "unk_token": tokenizer_lib.UNK, "cls_token": tokenizer_lib.CLS,
      "sep_token": tokenizer_lib.SEP, "mask_token": tokenizer_lib.MASK}


def write_tokenizer(out: epath.Path, tok: tokenizer_lib.AnyTokenizer, seq_len: int) -> None:
  """tokenizer.json (ours converted, or a Hugging Face tokenizer's own vocabulary) and its config files."""
  if isinstance(tok, tokenizer_lib.Tokenizer):
    (out / "tokenizer.json").write_text(hf_tokenizer(tok).to_str(pretty=True))
    pieces, roles = dict(enumerate(tokenizer_lib.SPECIAL_PIECES)), special_tokens_map()
  else:
    (out / "tokenizer.json").write_text(tok.to_hf_json())
    pieces, roles = hf_tokenizer_lib.reserved_tokens(tok), hf_tokenizer_lib.special_tokens_map(tok)
  added = {
      str(i): {
          "content": p, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
          "special": True} for i, p in pieces.items()}
  write_json(
      out / "tokenizer_config.json", {
          "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": seq_len, "padding_side": "right",
          "truncation_side": "right", "clean_up_tokenization_spaces": False, "model_input_names": [
              "input_ids", "attention_mask"], "added_tokens_decoder": added, **roles})
  write_json(out / "special_tokens_map.json", roles)


def sentence_embedding(config: plan_lib.Settings) -> tuple[str, bool]:
  """(pooling, normalised) of the run's sentence embedding: a contrastive run's contrast.pooling with a
  Normalize module (its loss compares unit vectors); any other run's mean, unnormalised."""
  if "contrast" in config.keys():
    return config.contrast.pooling, True
  return "mean", False


def sentence_transformers_files(out: epath.Path, embed_dim: int, seq_len: int, pooling: str = "mean",
                                normalize: bool = False) -> None:
  """modules.json and its modules: Transformer, Pooling (`pooling`: mean | cls), and with `normalize` a
  Normalize module (unit-length embeddings)."""
  # The classic module names load in sentence-transformers 2.x to 6.x.
  modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
  if normalize:
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (out / "2_Normalize").mkdir(parents=True, exist_ok=True)
  write_json(out / "modules.json", modules)
  write_json(
      out / "1_Pooling" / "config.json", {
          "word_embedding_dimension": embed_dim, "pooling_mode_cls_token": pooling == "cls",
          "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
          "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
          "pooling_mode_lasttoken": False, "include_prompt": True})
  write_json(out / "sentence_bert_config.json", {"max_seq_length": seq_len, "do_lower_case": False})
  write_json(out / "config_sentence_transformers.json",
             {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})


def dense_module_files(out: epath.Path, kernel_DxE: Any, bias_E: Any) -> None:
  """Appends a sentence-transformers Dense module (no activation) after the folder's Pooling."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  modules = [m for m in json.loads((out / "modules.json").read_text()) if not m["type"].endswith(".Dense")]
  idx = len(modules)
  modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_Dense", "type": "sentence_transformers.models.Dense"})
  write_json(out / "modules.json", modules)
  kernel_DxE = np.asarray(kernel_DxE, np.float32)
  write_json(
      out / f"{idx}_Dense" / "config.json", {
          "in_features": kernel_DxE.shape[0], "out_features": kernel_DxE.shape[1], "bias": True,
          "activation_function": "torch.nn.modules.linear.Identity"})
  tensors = {"linear.weight": np.ascontiguousarray(kernel_DxE.T), "linear.bias": np.asarray(bias_E, np.float32)}
  (out / f"{idx}_Dense" / "model.safetensors").write_bytes(safetensors.numpy.save(tensors, metadata={"format": "pt"}))


def hf_config(config: plan_lib.Settings, specials: SpecialIds = SENTENCEPIECE) -> dict:
  """config.json contents for `config` (ModernBertModel, or ModernBertForMaskedLM for an objective that
  exports its MLM head)."""
  from transformers import ModernBertConfig  # pylint: disable=g-import-not-at-top  (no torch needed)

  with_head = objectives.get(config.objective).exports_mlm_head
  out = ModernBertConfig(**hf_mapping.to_hf_config(config.model, config.data.seq_len, specials)).to_dict()
  out.update(hf_mapping.legacy_config_keys(config.model))
  out["architectures"] = ["ModernBertForMaskedLM" if with_head else "ModernBertModel"]
  out["dtype"] = "float32"
  return out


EVAL_RESULTS = "eval_results.json"  # `evaluate` records each run's own scores here, in its workdir.


def run_summary(workdir: epath.Path | None, config: plan_lib.Settings, step: int,
                metrics_rows: list[dict] | None = None) -> dict:
  """Step, tokens seen, loss and results of a run for the model card (`metrics_rows`: read_metrics)."""
  info = {"step": step, "tokens_seen": None, "loss": None, "results": None}
  if workdir is None:
    return info
  if metrics_rows:
    rows = [r for r in metrics_rows if r.get("step", 0) <= step]
    if rows:
      info["tokens_seen"] = rows[-1].get("tokens_seen")
      info["loss"] = rows[-1].get("loss")
    probes = {k: v for r in rows for k, v in r.items() if k.startswith("probe/")}
    info["results"] = probes or None
  for name in ("results.json", EVAL_RESULTS):
    if (workdir / name).exists():
      info["results"] = json.loads((workdir / name).read_text())
  return info


def _data(data_cfg: sections.Data) -> str:
  """`data.path`, or the mixture's sources with their weights."""
  if not data_cfg.mixture:
    return f"`{data_cfg.path}`"
  return "a mixture of " + ", ".join(f"`{src['path']}` (weight {src['weight']:g})" for src in data_cfg.mixture)


def _evaluation_table(record: dict, step: int) -> list[str]:
  """`evaluate`'s scores of this run (frozen probes, x100), and what they were measured on."""
  settings = record["settings"]
  subset = f", at most {settings['max_examples']} examples per split" if settings.get("max_examples") else ""
  at = f"step {record['step']}" + ("" if record["step"] == step else f" (this export is step {step})")
  lines = [
      f"Frozen probes (`python -m crossbert_jax.evaluate`) at {at}: mean-pooled layer(s) "
      f"{settings.get('layers')}, max length {settings.get('max_length')}{subset}. Scores x100.", "",
      "| score | value |", "|---|---:|"]
  return lines + [f"| {k} | {100 * v:.1f} |" for k, v in record["scores"].items()]


def model_card(config: plan_lib.Settings, info: dict, verify: dict | None,
               tokenizer_kind: str = "SentencePiece") -> str:
  m = config.model
  objective = objectives.get(config.objective)
  kind = objective.card_title
  layout = "all global" if m.global_every == 1 else \
      f"global every {m.global_every} layers, local window {m.local_window}"
  tokens = "unknown" if info["tokens_seen"] is None else f"{int(info['tokens_seen']):,}"
  lines = [
      "---",
      "library_name: transformers",
      "pipeline_tag: feature-extraction",
      "tags: [modernbert, sentence-transformers, crossbert_jax]",
      "---",
      "",
      f"# {kind}",
      "",
      "Pretrained with `crossbert_jax` and exported to Hugging Face "
      "`ModernBertModel` format (no custom code).",
      "",
      "## Architecture",
      "",
      f"- ModernBERT layout: {m.num_layers} layers, width {m.embed_dim}, {m.num_heads} heads, "
      f"GeGLU MLP {m.mlp_dim}, vocabulary {m.vocab_size}",
      f"- Attention: {layout}; RoPE theta {m.rope_theta:g} (global), {m.local_rope_theta:g} (local)",
      f"- Trained sequence length {config.data.seq_len}; embeddings: mean over non-pad tokens",
      "",
      "## Training",
      "",
      # An objective with its own input stream (the contrastive stage) masks nothing.
      f"- Objective: `{config.objective}`" + ("" if objective.feed else f", masking ratio {config.masking.ratio}") +
      objective.card_training(config),
      f"- Data: {_data(config.data)} (tokenizer: {tokenizer_kind}, {m.vocab_size} pieces)",
      f"- Steps: {info['step']}; batch {config.train.batch_size} x {config.data.seq_len}; tokens seen: {tokens}",]
  if info["loss"] is not None:
    lines.append(f"- Final training loss: {info['loss']:.4f}")
  lines += ["", "## Evaluation", ""]
  results = info["results"]
  if results and {"step", "settings", "scores"} <= set(results):  # `evaluate`'s record: a table.
    lines += _evaluation_table(results, info["step"])
  elif results:
    lines += ["```json", json.dumps(results, indent=2), "```"]
  else:
    lines.append("No evaluation results were recorded with this run.")
  if verify:
    lines += [
        "", "## Export check", "",
        f"- transformers `last_hidden_state` vs JAX: max abs diff {verify['hidden_max_abs_diff']:.2e}",
        f"- sentence-transformers embedding vs JAX: max abs diff {verify['sentence_max_abs_diff']:.2e}",
        "- tokenizer ids identical on the check sentences"]
  lines += [
      "", "## Usage", "", "```python", "from sentence_transformers import SentenceTransformer",
      "model = SentenceTransformer('PATH')", "emb = model.encode(['A sentence.', 'Another one.'])", "```", ""]
  return "\n".join(lines)

"""Our param tree <-> Hugging Face ModernBERT names, and our config <-> `ModernBertConfig`.

One declarative table (`RULES`), read in both directions: each rule names our param path
(relative to the model's params, `{i}` = layer index), the HF tensor name, and a pair of
transform hooks (to_hf, from_hf). Layer rules expand `{i}` over layers generically; the
scan-over-layers layout is unstacked/stacked generically before/after the table is applied.
All arrays are numpy; every transform is a transpose/reshape, so a round trip is bitwise.
Shape letters: V vocab, D embed, H heads, K head dim, F mlp hidden, N layers.
"""

import dataclasses
from typing import Callable, Mapping

import numpy as np

from crossbert_jax.core.errors import UserError
from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds
from crossbert_jax.model.encoder import EncoderSpec

Transform = Callable[[np.ndarray, EncoderSpec], np.ndarray]
SCAN_PREFIX = "encoder/layers/block/"  # nn.scan over layers 1..N-1 (leading axis = layer - 1).


def _identity(x: np.ndarray, _: EncoderSpec) -> np.ndarray:
  return x


def _transpose(x: np.ndarray, _: EncoderSpec) -> np.ndarray:
  return np.ascontiguousarray(x.T)


# Our kernels are [in..., out...]; torch Linear weights are [out, in] with the out dims fused.
def _qkv_to_hf(k_Dx3xHxK: np.ndarray, s: EncoderSpec) -> np.ndarray:
  return np.ascontiguousarray(k_Dx3xHxK.reshape(s.embed_dim, 3 * s.embed_dim).T)  # [3D, D]


def _qkv_from_hf(w_3DxD: np.ndarray, s: EncoderSpec) -> np.ndarray:
  return np.ascontiguousarray(w_3DxD.T.reshape(s.embed_dim, 3, s.num_heads, s.head_dim))


def _attn_out_to_hf(k_HxKxD: np.ndarray, s: EncoderSpec) -> np.ndarray:
  return np.ascontiguousarray(k_HxKxD.reshape(s.embed_dim, s.embed_dim).T)  # [D, H*K]


def _attn_out_from_hf(w_DxD: np.ndarray, s: EncoderSpec) -> np.ndarray:
  return np.ascontiguousarray(w_DxD.T.reshape(s.num_heads, s.head_dim, s.embed_dim))


def _wi_to_hf(k_Dx2xF: np.ndarray, s: EncoderSpec) -> np.ndarray:
  return np.ascontiguousarray(k_Dx2xF.reshape(s.embed_dim, 2 * s.mlp_dim).T)  # [2F, D]: input, gate


def _wi_from_hf(w_2FxD: np.ndarray, s: EncoderSpec) -> np.ndarray:
  return np.ascontiguousarray(w_2FxD.T.reshape(s.embed_dim, 2, s.mlp_dim))


IDENTITY = (_identity, _identity)
TRANSPOSE = (_transpose, _transpose)
QKV = (_qkv_to_hf, _qkv_from_hf)
ATTN_OUT = (_attn_out_to_hf, _attn_out_from_hf)
WI = (_wi_to_hf, _wi_from_hf)


@dataclasses.dataclass(frozen=True)
class Rule:
  """One tensor: our path <-> HF name (`{i}`: layer index from `first_layer`), transform pair."""
  ours: str
  hf: str
  hooks: tuple[Transform, Transform]
  first_layer: int = 0  # attn_norm: layer 0 has none (ModernBERT's Identity).


# Encoder names are relative to `ModernBertModel`; `ModernBertForMaskedLM` prefixes "model.".
ENCODER_RULES = (
    Rule("encoder/embeddings/tok_embeddings/embedding", "embeddings.tok_embeddings.weight", IDENTITY),
    Rule("encoder/embeddings/norm/scale", "embeddings.norm.weight", IDENTITY),
    Rule("encoder/layers_{i}/attn_norm/scale", "layers.{i}.attn_norm.weight", IDENTITY, first_layer=1),
    Rule("encoder/layers_{i}/attn/Wqkv/kernel", "layers.{i}.attn.Wqkv.weight", QKV),
    Rule("encoder/layers_{i}/attn/Wo/kernel", "layers.{i}.attn.Wo.weight", ATTN_OUT),
    Rule("encoder/layers_{i}/mlp_norm/scale", "layers.{i}.mlp_norm.weight", IDENTITY),
    Rule("encoder/layers_{i}/mlp/Wi/kernel", "layers.{i}.mlp.Wi.weight", WI),
    Rule("encoder/layers_{i}/mlp/Wo/kernel", "layers.{i}.mlp.Wo.weight", TRANSPOSE),
    Rule("encoder/final_norm/scale", "final_norm.weight", IDENTITY),
)
# The flat-BERT MLM head (`ModernBertForMaskedLM`); decoder.weight is tied to the embedding.
HEAD_RULES = (
    Rule("head/dense/kernel", "head.dense.weight", TRANSPOSE),
    Rule("head/norm/scale", "head.norm.weight", IDENTITY),
    Rule("head/bias", "decoder.bias", IDENTITY),
)
MLM_ENCODER_PREFIX = "model."


def rules(with_head: bool) -> tuple[tuple[Rule, str], ...]:
  """(rule, HF name prefix) pairs: the encoder alone (`ModernBertModel`) or with the MLM head."""
  if not with_head:
    return tuple((r, "") for r in ENCODER_RULES)
  return tuple((r, MLM_ENCODER_PREFIX) for r in ENCODER_RULES) + tuple((r, "") for r in HEAD_RULES)


def _expand(rule: Rule, prefix: str, num_layers: int) -> list[tuple[str, str]]:
  if "{i}" not in rule.ours:
    return [(rule.ours, prefix + rule.hf)]
  return [(rule.ours.format(i=i), prefix + rule.hf.format(i=i)) for i in range(rule.first_layer, num_layers)]


# -- scan layout: generic (un)stacking of every leaf under layers/block -----------------------


def unstack_layers(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Scan layout (layers 1..N-1 stacked under encoder/layers/block) -> per-layer paths."""
  out = {}
  for path, x in flat.items():
    if not path.startswith(SCAN_PREFIX):
      out[path] = x
      continue
    rest = path[len(SCAN_PREFIX):]
    for j in range(x.shape[0]):
      out[f"encoder/layers_{j + 1}/{rest}"] = np.ascontiguousarray(x[j])
  return out


def stack_layers(flat: Mapping[str, np.ndarray], num_layers: int) -> dict[str, np.ndarray]:
  """Per-layer paths -> scan layout (layer 0 stays encoder/layers_0)."""
  out, stacked = {}, {}
  for path, x in flat.items():
    head, _, rest = path.partition("/layers_")
    if path.startswith("encoder/layers_") and not rest.startswith("0/"):
      layer, _, sub = rest.partition("/")
      stacked.setdefault(sub, {})[int(layer)] = x
    else:
      out[path] = x
  for sub, per_layer in stacked.items():
    out[SCAN_PREFIX + sub] = np.stack([per_layer[i] for i in range(1, num_layers)])
  return out


# -- the table, in both directions -----------------------------------------------------------


def to_hf(flat: Mapping[str, np.ndarray], spec: EncoderSpec, with_head: bool = False) -> dict[str, np.ndarray]:
  """Our flat params ('encoder/...' paths, either layout) -> HF state dict (numpy)."""
  flat = unstack_layers(flat)
  out = {}
  for rule, prefix in rules(with_head):
    for ours, hf in _expand(rule, prefix, spec.num_layers):
      if ours not in flat:
        raise UserError(f"params lack {ours}: the checkpoint does not match model.* of its config")
      out[hf] = rule.hooks[0](np.asarray(flat[ours]), spec)
  return out


def from_hf(tensors: Mapping[str, np.ndarray], spec: EncoderSpec, with_head: bool = False,
            source: str = "--hf") -> dict[str, np.ndarray]:
  """HF state dict (numpy) -> our flat params, in the layout `spec.scan_layers` asks for."""
  out = {}
  for rule, prefix in rules(with_head):
    for ours, hf in _expand(rule, prefix, spec.num_layers):
      if hf not in tensors:
        raise UserError(f"{source}: model.safetensors lacks tensor {hf!r}; is it a ModernBERT checkpoint?")
      out[ours] = rule.hooks[1](np.asarray(tensors[hf]), spec)
  return stack_layers(out, spec.num_layers) if spec.scan_layers else out


def hf_names(spec: EncoderSpec, with_head: bool = False) -> list[str]:
  """Every HF tensor name the table produces for `spec`."""
  return [hf for rule, prefix in rules(with_head) for _, hf in _expand(rule, prefix, spec.num_layers)]


# -- config ----------------------------------------------------------------------------------

# ModernBERT switches our encoder does not have: exported at these values, required on import.
FIXED_HF = {
    "hidden_activation": "gelu",  # Exact (erf) GELU in transformers' ACT2FN.
    "classifier_activation": "gelu",
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "classifier_bias": False,
    "decoder_bias": True,
    "tie_word_embeddings": True,}


def layer_types(num_layers: int, global_every: int) -> list[str]:
  """ModernBERT's `layer_types`: layer i is global iff i % global_every == 0 (as encoder.py)."""
  return ["full_attention" if i % global_every == 0 else "sliding_attention" for i in range(num_layers)]


def to_hf_config(model_cfg: Mapping, seq_len: int, specials: SpecialIds = SENTENCEPIECE) -> dict:
  """`ModernBertConfig` kwargs for our `config.model` (faithful attention layout and RoPE thetas)."""
  m = model_cfg
  return {
      "vocab_size": m["vocab_size"],
      "hidden_size": m["embed_dim"],
      "intermediate_size": m["mlp_dim"],
      "num_hidden_layers": m["num_layers"],
      "num_attention_heads": m["num_heads"],
      "max_position_embeddings": seq_len,  # RoPE: no learned positions; the length we trained at.
      "initializer_range": m["init_std"],
      "norm_eps": m["norm_eps"],
      "pad_token_id": specials.pad,
      "bos_token_id": specials.cls,
      "eos_token_id": specials.sep,
      "cls_token_id": specials.cls,
      "sep_token_id": specials.sep,
      "layer_types": layer_types(m["num_layers"], m["global_every"]),
      "local_attention": m["local_window"],
      "rope_parameters": {
          "full_attention": {"rope_type": "default", "rope_theta": float(m["rope_theta"])},
          "sliding_attention": {"rope_type": "default", "rope_theta": float(m["local_rope_theta"])},},
      **FIXED_HF,}


def legacy_config_keys(model_cfg: Mapping) -> dict:
  """The pre-transformers-5 spelling of the layout and thetas, kept in config.json for old readers."""
  return {
      "global_attn_every_n_layers": model_cfg["global_every"], "global_rope_theta": float(model_cfg["rope_theta"]),
      "local_rope_theta": float(model_cfg["local_rope_theta"])}


def _global_every(types: list[str], legacy: int | None, source: str) -> int:
  globals_ = [i for i, t in enumerate(types) if t == "full_attention"]
  if not globals_ or globals_[0] != 0:
    raise UserError(f"{source}: layer 0 must use full attention (layer_types={types})")
  every = globals_[1] if len(globals_) > 1 else len(types)
  if legacy and legacy >= 1 and types == layer_types(len(types), legacy):
    every = legacy  # The same layout; keep the spelling the config gave.
  if types != layer_types(len(types), max(every, 1)):
    raise UserError(f"{source}: layer_types {types} is not 'global every n layers'; our encoder "
                    "supports only that pattern")
  return max(every, 1)


def from_hf_config(hf: Mapping, source: str = "--hf") -> dict:
  """Our `config.model` values (the shape and attention keys) from a ModernBERT config.json dict."""
  if hf.get("model_type") != "modernbert":
    raise UserError(f"{source}: config.json has model_type={hf.get('model_type')!r}, not 'modernbert'")
  for key, want in FIXED_HF.items():
    if key in ("classifier_activation", "classifier_bias", "decoder_bias", "tie_word_embeddings"):
      continue  # Only the MLM head / classifier use these; checked where the head is imported.
    if hf.get(key, want) != want:
      raise UserError(f"{source}: config.json has {key}={hf.get(key)!r}; our encoder needs {want!r}")
  n = hf["num_hidden_layers"]
  types = hf.get("layer_types") or layer_types(n, hf.get("global_attn_every_n_layers", 3))
  rope = hf.get("rope_parameters") or {}
  for kind in ("full_attention", "sliding_attention"):
    if rope.get(kind, {}).get("rope_type", "default") != "default":
      raise UserError(f"{source}: rope_type {rope[kind]['rope_type']!r} for {kind}; only 'default' RoPE is supported")
  if hf.get("head_dim") not in (None, hf["hidden_size"] // hf["num_attention_heads"]):
    raise UserError(f"{source}: head_dim={hf['head_dim']} != hidden_size / num_attention_heads")
  return {
      "vocab_size": hf["vocab_size"],
      "embed_dim": hf["hidden_size"],
      "num_heads": hf["num_attention_heads"],
      "num_layers": n,
      "mlp_dim": hf["intermediate_size"],
      "norm_eps": hf.get("norm_eps", 1e-5),
      "init_std": hf.get("initializer_range", 0.02),
      "rope_theta": float(rope.get("full_attention", {}).get("rope_theta", hf.get("global_rope_theta", 160_000.0))),
      "local_rope_theta": float(
          rope.get("sliding_attention", {}).get("rope_theta", hf.get("local_rope_theta", 10_000.0))),
      "local_window": hf.get("local_attention", 128),
      "global_every": _global_every(list(types), hf.get("global_attn_every_n_layers"), source),}

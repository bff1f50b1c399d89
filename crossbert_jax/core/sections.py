"""Every config section as a typed, frozen dataclass: its keys, their types and defaults, declared once.

A section's defaults are its fields' defaults; those that depend on the variant (the model's shape,
the run's length) come from the tables below through `for_variant`. The user-facing front end is
still an ml_collections ConfigDict (`core/config.get_config` builds it from these sections, so a
config file and `--config.key=value` flags work as in big_vision); `core/plan.build` validates it
once and returns the same sections, typed and frozen, for everything below the commands.

A section reads like the ConfigDict it came from: `s.key`, `s["key"]`, `s.get(key)`, `"key" in s`, `s.to_dict()`.
"""

import dataclasses
from typing import Any, ClassVar

# Encoder shapes per variant: (embed_dim, num_heads, num_layers, mlp_dim, vocab_size).
# `base` and `large` are ModernBERT-base/-large (GeGLU mlp_dim is the half-width of Wi).
ENCODER_SHAPES = {
    "tiny": (64, 4, 2, 128, 1024),
    "small": (512, 8, 8, 768, 8192),
    "base": (768, 12, 22, 1152, 50368),
    "large": (1024, 16, 28, 2624, 50368),}
# (reconstructor layers, seq_len, global batch size, train steps, warmup, checkpoint every, lr)
RUN_SHAPES = {
    "tiny": (2, 64, 16, 300, 30, 100, 3e-3),
    "small": (2, 256, 16, 10_000, 500, 1000, 1e-3),
    "base": (4, 512, 256, 200_000, 3000, 2000, 8e-4),
    "large": (4, 512, 256, 200_000, 3000, 2000, 5e-4),}
VARIANTS = tuple(ENCODER_SHAPES)


class Section:
  """Read access shared by the sections: attributes, `s[key]`, `key in s`, `to_dict()`."""

  NAME: ClassVar[str] = ""  # The config's key for this section.

  def __getitem__(self, key: str) -> Any:
    if key not in self:
      raise KeyError(f"{self.NAME}.{key}")
    return getattr(self, key)

  def __contains__(self, key: str) -> bool:
    return key in self.keys()

  def keys(self) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(self))

  def get(self, key: str, default: Any = None) -> Any:
    return getattr(self, key) if key in self else default

  def to_dict(self) -> dict[str, Any]:
    """Its keys and values in declaration order (nested sections as dicts), as ConfigDict.to_dict."""
    return {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in ((k, getattr(self, k)) for k in self.keys())}

  @classmethod
  def for_variant(cls, variant: str) -> "Section":
    del variant  # Most sections do not depend on it.
    return cls()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Model(Section):
  """The encoder: shape, attention, numerics."""

  NAME: ClassVar[str] = "model"
  vocab_size: int  # Must be >= the tokenizer's vocabulary.
  embed_dim: int
  num_heads: int
  num_layers: int
  mlp_dim: int  # GeGLU hidden width (Wi maps embed -> 2 * mlp_dim).
  norm_eps: float = 1e-5
  init_std: float = 0.02
  # Attention kernel (model/attention.py), every layer: "xla" dense scores (the reference),
  # "chunked" blocked online softmax in XLA, "splash" (TPU Pallas), "gpu_flash" (Pallas GPU), "cudnn"
  # (cuDNN's fused attention, the mask passed whole; GPU, bf16), or
  # "auto": splash on TPU, gpu_flash on GPU, on CPU chunked from attention_chunked_min_len keys.
  attention: str = "auto"
  attention_block_q: int = 512  # Query tile of splash / gpu_flash (splash rounds up to 128s).
  attention_block_kv: int = 512  # Key block of chunked / splash / gpu_flash.
  attention_chunked_min_len: int = 1024  # auto on CPU: chunked when max(queries, keys) >= this.
  # Vocabulary head + cross-entropy over this many predicted slots at a time (a rematerialised
  # scan), so B x Q x V float32 logits never exist whole; Q <= loss_chunk: one plain pass.
  loss_chunk: int = 512
  # The head's GEMMs: "float32" (bf16 inputs under dtype=bfloat16, but the backward's two GEMMs take
  # the float32 logit gradient, and recompute the logits) or "bfloat16" (all three GEMMs bf16 with
  # float32 accumulation; float32 softmax and loss; gradient in the forward pass: no recompute).
  head_dtype: str = "float32"
  rope_theta: float = 160_000.0  # Global-attention layers (ModernBERT's global_rope_theta).
  local_rope_theta: float = 10_000.0  # Local-attention layers.
  local_window: int = 128  # Total window as in ModernBERT: each token sees +-local_window//2.
  global_every: int = 1  # Layer i is global iff i % global_every == 0 (1: all global; ModernBERT: 3).
  # Pod-sized variants: bf16 compute, scan and full remat, the settings the pre-flight compile
  # (`python -m crossbert_jax.compile`) shows they need on 16 GiB chips and at L=8192 (docs/scaling.md).
  scan_layers: bool = False  # nn.scan over layers 1..N-1 (layer 0 has no attention pre-norm).
  # "none" | "full" | "dots" (save matmul outputs only) | "auto": the least recomputation whose
  # compiled step fits memory_budget_gib, else the device's memory (training/memory.py).
  remat: str = "none"
  memory_budget_gib: float = 0.0  # remat=auto's budget per device; 0: the device's memory.
  dtype: str = "float32"  # Compute dtype: "float32" | "bfloat16". Params stay float32.
  # Dropout on the embeddings' output and each block's attention and MLP branch, drawn only where the
  # objective passes a dropout key (objective=contrast: SimCSE's noise); 0: none, the step unchanged.
  dropout: float = 0.0

  @classmethod
  def for_variant(cls, variant: str) -> "Model":
    d, heads, layers, mlp, vocab = ENCODER_SHAPES[variant]
    pod = variant in ("base", "large")
    return cls(vocab_size=vocab, embed_dim=d, num_heads=heads, num_layers=layers, mlp_dim=mlp, scan_layers=pod,
               remat="full" if pod else "none", dtype="bfloat16" if pod else "float32")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reconstructor(Section):
  """CrossBERT's reconstructor (in every config: runs of either objective saved it)."""

  NAME: ClassVar[str] = "reconstructor"
  num_layers: int
  embed_dim: int  # Own width; K/V projections map encoder width -> this.
  num_heads: int
  mlp_dim: int
  self_attention: bool = False  # Self-attention among queries before cross-attention.
  feature_mixing: bool = False  # CrossMAE: each block attends to a learned mix of all encoder layers.
  tie_head: bool = False  # Vocabulary head tied to the token embedding (needs equal widths).

  @classmethod
  def for_variant(cls, variant: str) -> "Reconstructor":
    d, heads, _, mlp, _ = ENCODER_SHAPES[variant]
    return cls(num_layers=RUN_SHAPES[variant][0], embed_dim=d, num_heads=heads, mlp_dim=mlp)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mlm(Section):
  """Flat BERT's corruption of the selected positions (in every config, as the reconstructor)."""

  NAME: ClassVar[str] = "mlm"
  mask_prob: float = 0.8  # -> [MASK]
  random_prob: float = 0.1  # -> a random non-special piece of data.tokenizer; the rest stay unchanged.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Masking(Section):
  """Which tokens are hidden and predicted."""

  NAME: ClassVar[str] = "masking"
  ratio: float = 0.15  # Fraction of real tokens hidden; the objective sets its default.
  views: int = 1  # Complementary views K (crossbert only); the objective sets its default.
  reconstruct_ratio: float = 1.0  # CrossMAE partial reconstruction: fraction of masked slots predicted.
  exclude_special: bool = True  # [CLS]/[SEP] are never targets (as HF's collators); False predicts them too.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Data(Section):
  """Sources, tokenizer and the input pipeline."""

  NAME: ClassVar[str] = "data"
  path: str = "builtin"  # "builtin", or file / directory / glob, comma-separated; gs:// works.
  format: str = "auto"  # "auto" (by extension), or a format of core/formats.py FORMAT_TABLE: text, jsonl, ...
  text_field: str = "text"  # Field holding the text in jsonl / parquet / arrayrecord records.
  text_unit: str = "paragraph"  # Plain text: "line" | "paragraph" (blank-line separated) | "file".
  tokenizer: str = ""  # SentencePiece .model from `python -m crossbert_jax.tokenizer`, or a HF tokenizer.json / folder.
  seq_len: int
  shuffle_seed: int = 0
  # Weighted mixture (data/mixture.py), instead of data.path: a tuple of dicts {"path": P, "weight": w},
  # each document drawn from source k with probability w_k / sum(w) (shares of documents, not of
  # tokens). Optional per source: "name" (metrics tokens_seen/<name>; default: the path's last
  # component) and "format" / "text_field" / "text_unit" (default: the data.* keys).
  # () = data.path alone; when set, data.path must stay "builtin" or "".
  mixture: tuple = ()
  worker_count: int = 0  # Grain multiprocess prefetch workers (0: in-process).
  worker_buffer_size: int = 2

  @classmethod
  def for_variant(cls, variant: str) -> "Data":
    return cls(seq_len=RUN_SHAPES[variant][1])


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchRamp(Section):
  """Batch-size ramp (ModernBERT's batch warmup): the first phase's first steps as `stages` stairs whose
  batch grows in multiples of `start` up to the phase's batch size, over `steps` steps or `tokens`
  tokens (exactly one of the two); each stair is a phase of its own. start=0: off."""

  NAME: ClassVar[str] = "train.batch_ramp"
  start: int = 0  # Batch size of the first stair (divides the phase's batch size).
  steps: int = 0  # Steps the whole ramp takes, split evenly over the stairs.
  tokens: int = 0  # Or: tokens the ramp takes, split evenly over the stairs.
  stages: int = 4  # Number of stairs below the full batch size.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Train(Section):
  """Steps, batch and the optimizer's schedule."""

  NAME: ClassVar[str] = "train"
  steps: int
  batch_size: int  # Global batch (sequences), split across processes and the batch mesh axes.
  init_from: str = ""  # Encoder (and MLM head) params from `python -m crossbert_jax.export import`.
  # True: model.* shape keys from train.init_from's config.json, and data.tokenizer (when empty) its
  # tokenizer (hf/import_config.py; configs/*.py:from_hf).
  shape_from_init: bool = False
  # Start a new workdir from another run's checkpoint, "WORKDIR[:STEP]" (default: its newest step;
  # gs:// works): params, optimizer state, data position, tokens_seen and step, under this config's
  # schedule. The source is only read. Once this workdir has a checkpoint, it resumes from its own.
  # Empty init_from: the source's (a from_hf source's shape); another than the source's is refused.
  fork_from: str = ""
  stop_at_step: int = 0  # Checkpoint and stop after this step, schedule unchanged (0: run to steps).
  # Micro-batches per step; batch_size must divide evenly. 0 (auto): the fewest whose compiled step fits
  # model.memory_budget_gib, else the device's memory (training/memory.py; it prints its choice).
  grad_accum: int = 1
  seed: int = 0  # Params init and the masking base key.
  learning_rate: float
  warmup_steps: int
  decay: str = "cosine"  # "cosine" | "linear" | "wsd" (warmup-stable-decay), to final_lr_ratio * peak.
  decay_fraction: float = 0.2  # wsd: the last round(decay_fraction * steps) steps decay; before them, the peak.
  decay_shape: str = "1-sqrt"  # wsd decay shape: "linear" | "1-sqrt" (Hägele et al. 2024).
  final_lr_ratio: float = 0.1
  weight_decay: float = 0.01  # Not applied to norms and biases.
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-6
  clip_norm: float = 1.0  # Global-norm gradient clipping (0: off).
  # Training phases (core/phases.py): an ordered tuple of dicts {"steps": N, "data.seq_len": L, ...}, each
  # setting keys of phases.OVERRIDABLE (seq_len, batch_size, rope thetas, data path / mixture / shuffle seed,
  # the lr peak and schedule keys) for its N steps. Checked, not derived: the steps must sum to train.steps
  # (the last phase may omit "steps": it runs to train.steps). (): one phase with the keys above.
  phases: tuple = ()
  batch_ramp: BatchRamp = BatchRamp()

  @classmethod
  def for_variant(cls, variant: str) -> "Train":
    _, _, batch, steps, warmup, _, lr = RUN_SHAPES[variant]
    return cls(steps=steps, batch_size=batch, learning_rate=lr, warmup_steps=warmup)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint(Section):
  """When checkpoints are saved and kept."""

  NAME: ClassVar[str] = "checkpoint"
  every_steps: int
  keep: int = 3
  keep_steps: tuple = ()  # Steps also saved and never garbage-collected (a WSD stable run's fork points).
  async_save: bool = True

  @classmethod
  def for_variant(cls, variant: str) -> "Checkpoint":
    return cls(every_steps=RUN_SHAPES[variant][5])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mesh(Section):
  """Device mesh sizes and sharding-rule overrides."""

  NAME: ClassVar[str] = "mesh"
  data: int = 1  # One of data / fsdp / tensor may be -1: it takes the remaining devices.
  fsdp: int = -1
  tensor: int = 1
  rules: tuple = ()  # Overrides of sharding.DEFAULT_RULES: (("mlp", "tensor"), ("vocab", None), ...).


@dataclasses.dataclass(frozen=True, kw_only=True)
class Eval(Section):
  """Frozen probes during pretraining (the probe hook the train command registers)."""

  NAME: ClassVar[str] = "eval"
  every_steps: int = 0  # 0: off. Logged to metrics.jsonl as probe/<task>/<probe>.
  tasks: str = "sst2,stsb"  # Comma-separated task names (see `python -m crossbert_jax.evaluate --help`).
  data_dir: str = ""  # Root of the task data (e.g. ../shared/data); required when every_steps > 0.
  max_examples: int = 2000  # Per split: a fixed, seeded subset keeps in-training probes cheap; 0 = whole splits.
  splits: str = "first"  # "first": score each task's first evaluation split; "all": the size-weighted mean over all.
  seed: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Metrics(Section):
  """Logging and MFU."""

  NAME: ClassVar[str] = "metrics"
  log_every: int
  tensorboard: bool = True
  progress_bar: bool = True
  cpu_peak_tflops: float = 0.1  # Per-device peak used for MFU on CPU (no vendor number exists).
  # Weights & Biases (run/wandb_logger.py): the metrics.jsonl scalars and the config, from process 0.
  # A resume continues the run's W&B run (its id in WORKDIR/wandb_run.json); WANDB_MODE=offline works.
  wandb: bool = False
  wandb_project: str = "crossbert_jax"
  wandb_entity: str = ""  # "": W&B's default entity.
  wandb_run_name: str = ""  # "": the workdir's name.
  wandb_tags: tuple = ()  # e.g. ("tiny", "ablation").
  wandb_group: str = ""  # "": a fork's group is its source's; sweeps set the sweep's name.

  @classmethod
  def for_variant(cls, variant: str) -> "Metrics":
    return cls(log_every=1 if variant == "tiny" else 10)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile(Section):
  """A jax.profiler trace of a window of steps (run/profile.py), into WORKDIR/profile/."""

  NAME: ClassVar[str] = "profile"
  start_step: int = 0  # First traced step (>= 2: step 1 compiles); 0: off.
  steps: int = 3  # Steps traced from start_step on.
  hosts: str = "0"  # Processes that trace: comma-separated indices, or "all".


@dataclasses.dataclass(frozen=True, kw_only=True)
class Contrast(Section):
  """The contrastive stage (objective=contrast only; docs/embedding.md): its source, recipe and loss."""

  NAME: ClassVar[str] = "contrast"
  # The encoder it starts from: a run's workdir (its newest checkpoint's encoder) or an `export import`
  # folder; the run's model shape and (when data.tokenizer is empty) tokenizer are the source's.
  init_from: str = ""
  recipe: str = "pairs"  # "pairs": (anchor, positive[, negative]) rows of data.path; "simcse": a corpus.
  columns: str = ""  # Pair-file columns "anchor,positive[,negative]"; "": found by name (data/pairs.py).
  hard_negatives: bool = False  # pairs: the file's negative column as one hard negative per anchor.
  temperature: float = 0.05  # > 0; the initial value when learn_temperature.
  learn_temperature: bool = False  # A trained log-temperature param (floored at 1e-3).
  symmetric: bool = False  # Also positives -> anchors, the two losses averaged.
  pooling: str = "mean"  # "mean" | "cls": the embedding, and the exported Pooling module.
  # GradCache: embed the step's texts this many rows at a time without activations, then backprop by
  # chunk (training/objectives/contrastive_cache.py); 0: one plain pass.
  chunk_size: int = 0
  # "max": every text padded to data.seq_len; "batch": each batch to the shortest of 16, 32, 64, ... (and
  # data.seq_len) that holds its longest text, as sentence-transformers pads (data/contrast_feed.py): fewer
  # tokens for short texts, one compiled program per length. One process only.
  padding: str = "max"


# The schema's sections in the config's order (an objective may add its own after them).
SECTIONS: tuple[type[Section],
                ...] = (Model, Reconstructor, Mlm, Masking, Data, Train, Checkpoint, Mesh, Eval, Metrics, Profile)

# Sections an objective adds in its `configure` (core/objectives.py), typed by name in the plan.
OBJECTIVE_SECTIONS: dict[str, type[Section]] = {Contrast.NAME: Contrast}


def from_dict(cls: type[Section], values: dict[str, Any]) -> Section:
  """The section `cls` holding `values` (a ConfigDict's `to_dict()`: nested sections as dicts)."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  kwargs = {}
  for key, value in values.items():
    kind = fields[key].type
    kwargs[key] = from_dict(kind, value) if isinstance(kind, type) and issubclass(kind, Section) else value
  return cls(**kwargs)

"""The one config schema: every key declared here, variants, and validation.

`configs/crossbert.py` and `configs/bert.py` call `get_config(objective, variant)`; code reads
keys as attributes and never supplies a default of its own (no `config.get(key, default)`).
"""

from typing import Any

import ml_collections

from crossbert_jax.core import mixture
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError

VARIANTS = ("tiny", "small", "base", "large")
ATTENTION_BACKENDS = ("auto", "xla", "chunked", "splash", "gpu_flash")  # = model.attention.BACKENDS

# Encoder shapes per variant: (embed_dim, num_heads, num_layers, mlp_dim, vocab_size).
# `base` and `large` are ModernBERT-base/-large (GeGLU mlp_dim is the half-width of Wi).
_ENCODER_SHAPES = {
    "tiny": (64, 4, 2, 128, 1024),
    "small": (512, 8, 8, 768, 8192),
    "base": (768, 12, 22, 1152, 50368),
    "large": (1024, 16, 28, 2624, 50368),
}
# (reconstructor layers, seq_len, global batch size, train steps, warmup, checkpoint every, lr)
_RUN_SHAPES = {
    "tiny": (2, 64, 16, 300, 30, 100, 3e-3),
    "small": (2, 256, 16, 10_000, 500, 1000, 1e-3),
    "base": (4, 512, 256, 200_000, 3000, 2000, 8e-4),
    "large": (4, 512, 256, 200_000, 3000, 2000, 5e-4),
}


def get_config(objective: str, variant: str) -> ml_collections.ConfigDict:
  """Returns the full, locked config for `objective` (a name in training/objectives) at `variant`."""
  objectives = _objectives()
  if objective not in objectives.names():
    raise UserError(f"objective={objective!r}: use one of {objectives.names()}")
  if variant not in VARIANTS:
    raise UserError(f"config variant {variant!r}: use one of {VARIANTS} (e.g. configs/crossbert.py:tiny)")

  c = ml_collections.ConfigDict()
  # training/objectives: "crossbert" (encoder on visible tokens + reconstructor), "mlm" (flat BERT), or a
  # registered one (which may add its own section in `configure`).
  c.objective = objective
  c.model = _model(variant)
  c.reconstructor = _reconstructor(variant)
  c.mlm = _mlm()
  c.masking = _masking()
  c.data = _data(variant)
  c.train = _train(variant)
  c.checkpoint = _checkpoint(variant)
  c.mesh = _mesh()
  c.eval = _eval()
  c.metrics = _metrics(variant)
  objectives.get(objective).configure(c)
  c.lock()
  return c


def _objectives():
  """The objectives package (training/objectives), imported on first use: it imports the model,
  which imports this module."""
  from crossbert_jax.training import objectives  # pylint: disable=g-import-not-at-top

  return objectives


def _model(variant: str) -> ml_collections.ConfigDict:
  """The encoder: shape, attention, numerics."""
  d, heads, layers, mlp, vocab = _ENCODER_SHAPES[variant]
  s = ml_collections.ConfigDict()
  s.vocab_size = vocab  # Must be >= the tokenizer's vocabulary.
  s.embed_dim = d
  s.num_heads = heads
  s.num_layers = layers
  s.mlp_dim = mlp  # GeGLU hidden width (Wi maps embed -> 2 * mlp_dim).
  s.norm_eps = 1e-5
  s.init_std = 0.02
  # Attention kernel (model/attention.py), every layer: "xla" dense scores (the reference),
  # "chunked" blocked online softmax in XLA, "splash" (TPU Pallas), "gpu_flash" (Pallas GPU), or
  # "auto": splash on TPU, gpu_flash on GPU, on CPU chunked from attention_chunked_min_len keys.
  s.attention = "auto"
  s.attention_block_q = 512  # Query tile of splash / gpu_flash (splash rounds up to 128s).
  s.attention_block_kv = 512  # Key block of chunked / splash / gpu_flash.
  s.attention_chunked_min_len = 1024  # auto on CPU: chunked when max(queries, keys) >= this.
  # Vocabulary head + cross-entropy over this many predicted slots at a time (a rematerialised
  # scan), so B x Q x V float32 logits never exist whole; Q <= loss_chunk: one plain pass.
  s.loss_chunk = 512
  s.rope_theta = 160_000.0  # Global-attention layers (ModernBERT's global_rope_theta).
  s.local_rope_theta = 10_000.0  # Local-attention layers.
  s.local_window = 128  # Total window as in ModernBERT: each token sees +-local_window//2.
  s.global_every = 1  # Layer i is global iff i % global_every == 0 (1: all global; ModernBERT: 3).
  # Pod-sized variants: bf16 compute, scan and full remat, the settings the pre-flight compile
  # (`python -m crossbert_jax.compile`) shows they need on 16 GiB chips and at L=8192 (docs/scaling.md).
  pod = variant in ("base", "large")
  s.scan_layers = pod  # nn.scan over layers 1..N-1 (layer 0 has no attention pre-norm).
  s.remat = "full" if pod else "none"  # "none" | "full" | "dots" (save matmul outputs only).
  s.dtype = "bfloat16" if pod else "float32"  # Compute dtype: "float32" | "bfloat16". Params stay float32.
  return s


def _reconstructor(variant: str) -> ml_collections.ConfigDict:
  """CrossBERT's reconstructor (in every config: runs of either objective saved it)."""
  d, heads, _, mlp, _ = _ENCODER_SHAPES[variant]
  rec_layers = _RUN_SHAPES[variant][0]
  s = ml_collections.ConfigDict()
  s.num_layers = rec_layers
  s.embed_dim = d  # Own width; K/V projections map encoder width -> this.
  s.num_heads = heads
  s.mlp_dim = mlp
  s.self_attention = False  # Self-attention among queries before cross-attention.
  s.feature_mixing = False  # CrossMAE: each block attends to a learned mix of all encoder layers.
  s.tie_head = False  # Vocabulary head tied to the token embedding (needs equal widths).
  return s


def _mlm() -> ml_collections.ConfigDict:
  """Flat BERT's corruption (in every config, as the reconstructor)."""
  s = ml_collections.ConfigDict()
  # Flat-BERT corruption of the selected positions.
  s.mask_prob = 0.8  # -> [MASK]
  s.random_prob = 0.1  # -> a random non-special piece of data.tokenizer; the rest stay unchanged.
  return s


def _masking() -> ml_collections.ConfigDict:
  """Which tokens are hidden and predicted."""
  s = ml_collections.ConfigDict()
  s.ratio = 0.15  # Fraction of real tokens hidden; the objective sets its default.
  s.views = 1  # Complementary views K (crossbert only); the objective sets its default.
  s.reconstruct_ratio = 1.0  # CrossMAE partial reconstruction: fraction of masked slots predicted.
  s.exclude_special = True  # [CLS]/[SEP] are never targets (as HF's collators); False predicts them too.
  return s


def _data(variant: str) -> ml_collections.ConfigDict:
  """Sources, tokenizer and the input pipeline."""
  seq_len = _RUN_SHAPES[variant][1]
  s = ml_collections.ConfigDict()
  s.path = "builtin"  # "builtin", or file / directory / glob, comma-separated; gs:// works.
  s.format = "auto"  # "auto" (by extension), or a format of data/sources.py FORMAT_TABLE: text, jsonl, ...
  s.text_field = "text"  # Field holding the text in jsonl / parquet / arrayrecord records.
  s.text_unit = "paragraph"  # Plain text: "line" | "paragraph" (blank-line separated) | "file".
  s.tokenizer = ""  # SentencePiece .model from `python -m crossbert_jax.tokenizer`, or a HF tokenizer.json / folder.
  s.seq_len = seq_len
  s.shuffle_seed = 0
  # Weighted mixture (data/mixture.py), instead of data.path: a tuple of dicts {"path": P, "weight": w},
  # each document drawn from source k with probability w_k / sum(w) (shares of documents, not of
  # tokens). Optional per source: "name" (metrics tokens_seen/<name>; default: the path's last
  # component) and "format" / "text_field" / "text_unit" (default: the data.* keys).
  # () = data.path alone; when set, data.path must stay "builtin" or "".
  s.mixture = ()
  s.worker_count = 0  # Grain multiprocess prefetch workers (0: in-process).
  s.worker_buffer_size = 2
  return s


def _train(variant: str) -> ml_collections.ConfigDict:
  """Steps, batch and the optimizer's schedule."""
  _, _, batch, steps, warmup, _, lr = _RUN_SHAPES[variant]
  s = ml_collections.ConfigDict()
  s.steps = steps
  s.batch_size = batch  # Global batch (sequences), split across processes and the batch mesh axes.
  s.init_from = ""  # Encoder (and MLM head) params from `python -m crossbert_jax.export import`.
  # True: model.* shape keys from train.init_from's config.json, and data.tokenizer (when empty) its
  # tokenizer (hf/import_config.py; configs/*.py:from_hf).
  s.shape_from_init = False
  # Start a new workdir from another run's checkpoint, "WORKDIR[:STEP]" (default: its newest step;
  # gs:// works): params, optimizer state, data position, tokens_seen and step, under this config's
  # schedule. The source is only read. Once this workdir has a checkpoint, it resumes from its own.
  s.fork_from = ""
  s.stop_at_step = 0  # Checkpoint and stop after this step, schedule unchanged (0: run to steps).
  s.grad_accum = 1  # Micro-batches per step; batch_size must divide evenly.
  s.seed = 0  # Params init and the masking base key.
  s.learning_rate = lr
  s.warmup_steps = warmup
  s.decay = "cosine"  # "cosine" | "linear" | "wsd" (warmup-stable-decay), to final_lr_ratio * peak.
  s.decay_fraction = 0.2  # wsd: the last round(decay_fraction * steps) steps decay; before them, the peak.
  s.decay_shape = "1-sqrt"  # wsd decay shape: "linear" | "1-sqrt" (Hägele et al. 2024).
  s.final_lr_ratio = 0.1
  s.weight_decay = 0.01  # Not applied to norms and biases.
  s.b1 = 0.9
  s.b2 = 0.98
  s.eps = 1e-6
  s.clip_norm = 1.0  # Global-norm gradient clipping (0: off).
  # Training phases (core/phases.py): an ordered tuple of dicts {"steps": N, "data.seq_len": L, ...}, each
  # setting keys of phases.OVERRIDABLE (seq_len, batch_size, rope thetas, data path / mixture / shuffle seed,
  # the lr peak and schedule keys) for its N steps. Checked, not derived: the steps must sum to train.steps
  # (the last phase may omit "steps": it runs to train.steps). (): one phase with the keys above.
  s.phases = ()
  # Batch-size ramp (ModernBERT's batch warmup): the first phase's first steps as `stages` stairs whose
  # batch grows in multiples of `start` up to the phase's batch size, over `steps` steps or `tokens`
  # tokens (exactly one of the two); each stair is a phase of its own. start=0: off.
  s.batch_ramp = ml_collections.ConfigDict()
  s.batch_ramp.start = 0  # Batch size of the first stair (divides the phase's batch size).
  s.batch_ramp.steps = 0  # Steps the whole ramp takes, split evenly over the stairs.
  s.batch_ramp.tokens = 0  # Or: tokens the ramp takes, split evenly over the stairs.
  s.batch_ramp.stages = 4  # Number of stairs below the full batch size.
  return s


def _checkpoint(variant: str) -> ml_collections.ConfigDict:
  """When checkpoints are saved and kept."""
  ckpt_every = _RUN_SHAPES[variant][5]
  s = ml_collections.ConfigDict()
  s.every_steps = ckpt_every
  s.keep = 3
  s.keep_steps = ()  # Steps also saved and never garbage-collected (a WSD stable run's fork points).
  s.async_save = True
  return s


def _mesh() -> ml_collections.ConfigDict:
  """Device mesh sizes and sharding-rule overrides."""
  s = ml_collections.ConfigDict()
  s.data = 1  # One of data / fsdp / tensor may be -1: it takes the remaining devices.
  s.fsdp = -1
  s.tensor = 1
  s.rules = ()  # Overrides of sharding.DEFAULT_RULES: (("mlp", "tensor"), ("vocab", None), ...).
  return s


def _eval() -> ml_collections.ConfigDict:
  """Frozen probes during pretraining (crossbert_jax/evaluate.py)."""
  s = ml_collections.ConfigDict()
  # Frozen probes during pretraining (crossbert_jax/evaluate.py).
  s.every_steps = 0  # 0: off. Logged to metrics.jsonl as probe/<task>/<probe>.
  s.tasks = "sst2,stsb"  # Comma-separated task names (see `python -m crossbert_jax.evaluate --help`).
  s.data_dir = ""  # Root of the task data (e.g. ../shared/data); required when every_steps > 0.
  s.max_examples = 2000  # Per split: a fixed, seeded subset keeps in-training probes cheap; 0 = whole splits.
  s.splits = "first"  # "first": score each task's first evaluation split; "all": the size-weighted mean over all.
  s.seed = 0
  return s


def _metrics(variant: str) -> ml_collections.ConfigDict:
  """Logging and MFU."""
  s = ml_collections.ConfigDict()
  s.log_every = 1 if variant == "tiny" else 10
  s.tensorboard = True
  s.progress_bar = True
  s.cpu_peak_tflops = 0.1  # Per-device peak used for MFU on CPU (no vendor number exists).
  return s


def _err(key: str, msg: str) -> UserError:
  return UserError(f"config {key}: {msg}")


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises UserError (one line, naming the key) for any inconsistent config."""
  objectives = _objectives()
  if c.objective not in objectives.names():
    raise _err("objective", f"{c.objective!r} is not one of {objectives.names()}")
  _validate_model(c.model)
  _validate_masking(c, objectives.get(c.objective))
  _validate_data(c.data)
  _validate_train(c.train)
  _validate_runtime(c)
  if phases_lib.has_phases(c):
    for phase in phases_lib.expand(c):
      try:
        validate(phase.config)
      except UserError as e:
        raise UserError(f"{e} (in {phase.describe()})") from None


def _validate_model(m: ml_collections.ConfigDict) -> None:
  """The encoder's shape, attention and numerics."""
  for key in ("vocab_size", "embed_dim", "num_heads", "num_layers", "mlp_dim"):
    if m[key] <= 0:
      raise _err(f"model.{key}", f"must be positive, got {m[key]}")
  if m.embed_dim % m.num_heads:
    raise _err("model.num_heads", f"{m.num_heads} heads do not divide model.embed_dim={m.embed_dim}")
  if (m.embed_dim // m.num_heads) % 2:
    raise _err("model.num_heads", "head dim (embed_dim / num_heads) must be even for RoPE")
  if m.global_every < 1:
    raise _err("model.global_every", f"must be >= 1 (1 = all global), got {m.global_every}")
  if m.local_window < 2 or m.local_window % 2:
    raise _err("model.local_window", f"must be an even number >= 2, got {m.local_window}")
  if m.remat not in ("none", "full", "dots"):
    raise _err("model.remat", f"{m.remat!r}: use 'none', 'full' or 'dots'")
  if m.dtype not in ("float32", "bfloat16"):
    raise _err("model.dtype", f"{m.dtype!r}: use 'float32' or 'bfloat16'")
  if m.attention not in ATTENTION_BACKENDS:
    raise _err("model.attention", f"{m.attention!r}: use one of {ATTENTION_BACKENDS}")
  for key in ("attention_block_q", "attention_block_kv", "attention_chunked_min_len", "loss_chunk"):
    if m[key] < 1:
      raise _err(f"model.{key}", f"must be >= 1, got {m[key]}")
  if m.scan_layers and m.num_layers < 2:
    raise _err("model.scan_layers", "needs model.num_layers >= 2")


def _validate_masking(c: ml_collections.ConfigDict, objective: Any) -> None:
  """The mlm and masking sections, and the objective's own checks."""
  if not (c.mlm.mask_prob >= 0 and c.mlm.random_prob >= 0 and c.mlm.mask_prob + c.mlm.random_prob <= 1.0):
    raise _err("mlm.mask_prob", "mask_prob and random_prob must be >= 0 and sum to <= 1")
  mk, L = c.masking, c.data.seq_len
  if L < 4:
    raise _err("data.seq_len", f"must be >= 4, got {L}")
  if not 0.0 < mk.ratio < 1.0:
    raise _err("masking.ratio", f"must be in (0, 1), got {mk.ratio}")
  if mk.views < 1:
    raise _err("masking.views", f"must be >= 1, got {mk.views}")
  objective.validate(c)  # Its own sections and what it needs of the masking (e.g. complementary views).
  if round(mk.ratio * L) < 1 or L - round(mk.ratio * L) < 1:
    raise _err("masking.ratio", f"{mk.ratio} leaves no masked or no visible slot at data.seq_len={L}")
  if not 0.0 < mk.reconstruct_ratio <= 1.0:
    raise _err("masking.reconstruct_ratio", f"must be in (0, 1], got {mk.reconstruct_ratio}")


def _validate_data(d: ml_collections.ConfigDict) -> None:
  """The data section (sources, formats, the mixture)."""
  from crossbert_jax.data import sources  # pylint: disable=g-import-not-at-top  (Local: the readers import Grain.)

  if fix := sources.format_check(d.format):
    raise _err("data.format", f"{d.format!r}: {fix}")
  if d.text_unit not in ("line", "paragraph", "file"):
    raise _err("data.text_unit", f"{d.text_unit!r}: use line, paragraph or file")
  mixture.validate(d)
  if d.worker_count < 0:
    raise _err("data.worker_count", f"must be >= 0, got {d.worker_count}")


def _validate_train(t: ml_collections.ConfigDict) -> None:
  """Steps, batch and the optimizer's schedule."""
  if t.steps < 1:
    raise _err("train.steps", f"must be >= 1, got {t.steps}")
  if t.stop_at_step < 0:
    raise _err("train.stop_at_step", f"must be >= 0 (0 = run to train.steps), got {t.stop_at_step}")
  if t.batch_size < 1:
    raise _err("train.batch_size", f"must be >= 1, got {t.batch_size}")
  if t.grad_accum < 1 or t.batch_size % t.grad_accum:
    raise _err("train.grad_accum", f"{t.grad_accum} must be >= 1 and divide train.batch_size={t.batch_size}")
  if t.learning_rate <= 0:
    raise _err("train.learning_rate", f"must be positive, got {t.learning_rate}")
  if t.warmup_steps < 0:
    raise _err("train.warmup_steps", f"must be >= 0, got {t.warmup_steps}")
  if t.decay not in ("cosine", "linear", "wsd"):
    raise _err("train.decay", f"{t.decay!r}: use 'cosine', 'linear' or 'wsd'")
  if not 0.0 < t.decay_fraction <= 1.0:
    raise _err("train.decay_fraction", f"must be in (0, 1], got {t.decay_fraction}")
  if t.decay_shape not in ("linear", "1-sqrt"):
    raise _err("train.decay_shape", f"{t.decay_shape!r}: use 'linear' or '1-sqrt'")
  if t.decay == "wsd" and t.warmup_steps > t.steps - round(t.decay_fraction * t.steps):
    raise _err("train.warmup_steps", f"{t.warmup_steps} runs into the wsd decay, which starts after step "
               f"{t.steps - round(t.decay_fraction * t.steps)}; lower it or train.decay_fraction")
  if t.shape_from_init and not t.init_from:
    raise _err("train.shape_from_init", "is set but train.init_from is empty: pass --config.train.init_from=IMP, "
               "a folder from `python -m crossbert_jax.export import`")
  if t.fork_from and t.init_from:
    raise _err("train.fork_from", "and train.init_from are both set: a fork starts from its source's checkpoint; "
               "set only one")
  if not 0.0 <= t.final_lr_ratio <= 1.0:
    raise _err("train.final_lr_ratio", f"must be in [0, 1], got {t.final_lr_ratio}")
  if t.clip_norm < 0:
    raise _err("train.clip_norm", f"must be >= 0 (0 = off), got {t.clip_norm}")


def _validate_runtime(c: ml_collections.ConfigDict) -> None:
  """Checkpoints, mesh, probes and metrics."""
  if c.checkpoint.every_steps < 1:
    raise _err("checkpoint.every_steps", f"must be >= 1, got {c.checkpoint.every_steps}")
  if c.checkpoint.keep < 1:
    raise _err("checkpoint.keep", f"must be >= 1, got {c.checkpoint.keep}")
  if not all(isinstance(s, int) and s >= 1 for s in c.checkpoint.keep_steps):
    raise _err("checkpoint.keep_steps", f"must be steps >= 1, got {c.checkpoint.keep_steps!r}")
  sizes = {k: c.mesh[k] for k in ("data", "fsdp", "tensor")}
  if sum(v == -1 for v in sizes.values()) > 1:
    raise _err("mesh", "at most one of mesh.data / mesh.fsdp / mesh.tensor may be -1")
  for k, v in sizes.items():
    if v == 0 or v < -1:
      raise _err(f"mesh.{k}", f"must be a positive size or -1, got {v}")
  if c.eval.every_steps < 0:
    raise _err("eval.every_steps", f"must be >= 0 (0 = off), got {c.eval.every_steps}")
  if c.eval.every_steps > 0 and not c.eval.data_dir:
    raise _err("eval.data_dir", "is empty but eval.every_steps > 0: point it at the task data (e.g. ../shared/data)")
  if c.eval.max_examples != 0 and c.eval.max_examples < 10:
    raise _err("eval.max_examples", f"must be 0 (whole splits) or >= 10, got {c.eval.max_examples}")
  if c.eval.splits not in ("first", "all"):
    raise _err("eval.splits", f"must be 'first' or 'all', got {c.eval.splits!r}")
  if c.metrics.log_every < 1:
    raise _err("metrics.log_every", f"must be >= 1, got {c.metrics.log_every}")
  if c.metrics.cpu_peak_tflops <= 0:
    raise _err("metrics.cpu_peak_tflops", f"must be positive, got {c.metrics.cpu_peak_tflops}")


def from_flag(value) -> ml_collections.ConfigDict:
  """The config behind a `config_flags` flag; a file that failed to load becomes a UserError."""
  if value is None:
    raise UserError("--config is required, e.g. --config=configs/crossbert.py:tiny")
  try:
    objective = value.objective  # config_flags defers load failures to the first attribute access.
  except OSError as e:
    detail = " ".join(str(e).split())
    raise UserError(f"--config could not be loaded ({detail}); use e.g. --config=configs/crossbert.py:tiny") from None
  except (AttributeError, KeyError):
    raise UserError("--config file sets no `objective`: build it with get_config(objective, variant) from "
                    "crossbert_jax/core/config.py (as configs/crossbert.py does)") from None
  if objective not in _objectives().names():
    raise _err("objective", f"{objective!r} is not one of {_objectives().names()}")
  missing = _missing_keys(value, get_config(objective, "tiny"))
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise UserError(f"--config file lacks config key {missing[0]}{more}: build it with get_config(objective, "
                    "variant) from crossbert_jax/core/config.py, which declares every key")
  return value


def _missing_keys(c: ml_collections.ConfigDict, schema: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Dotted keys of `schema` that `c` lacks (a whole missing section counts once)."""
  out = []
  for key, want in schema.items():
    if key not in c:
      out.append(prefix + key)
    elif isinstance(want, ml_collections.ConfigDict) and isinstance(c[key], ml_collections.ConfigDict):
      out += _missing_keys(c[key], want, f"{prefix}{key}.")
  return out


def from_dict(saved: dict) -> ml_collections.ConfigDict:
  """A locked config from a saved `to_dict()` (JSON turns tuples into lists).

  Keys added to the schema after the config was saved (a run from an older version) take
  today's defaults, so old runs still evaluate, export and resume.
  """
  c = get_config(saved.get("objective", "crossbert"), "tiny")  # Only for the keys `saved` lacks.
  _merge(c, saved)
  c.mesh.rules = tuple(tuple(r) for r in c.mesh.rules)
  c.checkpoint.keep_steps = tuple(c.checkpoint.keep_steps)
  c.train.phases = tuple(dict(p) for p in c.train.phases)
  c.lock()
  return c


def _merge(c: ml_collections.ConfigDict, saved: dict) -> None:
  for key, value in saved.items():
    if isinstance(value, dict) and isinstance(c.get(key), ml_collections.ConfigDict):
      _merge(c[key], value)
    else:
      c[key] = value

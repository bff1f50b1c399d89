"""Every config section's declared keys and default values, per variant (core/config.py assembles
them in `get_config`, an objective's `configure` then sets its own)."""

import ml_collections

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


def model(variant: str) -> ml_collections.ConfigDict:
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


def reconstructor(variant: str) -> ml_collections.ConfigDict:
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


def mlm() -> ml_collections.ConfigDict:
  """Flat BERT's corruption (in every config, as the reconstructor)."""
  s = ml_collections.ConfigDict()
  # Flat-BERT corruption of the selected positions.
  s.mask_prob = 0.8  # -> [MASK]
  s.random_prob = 0.1  # -> a random non-special piece of data.tokenizer; the rest stay unchanged.
  return s


def masking() -> ml_collections.ConfigDict:
  """Which tokens are hidden and predicted."""
  s = ml_collections.ConfigDict()
  s.ratio = 0.15  # Fraction of real tokens hidden; the objective sets its default.
  s.views = 1  # Complementary views K (crossbert only); the objective sets its default.
  s.reconstruct_ratio = 1.0  # CrossMAE partial reconstruction: fraction of masked slots predicted.
  s.exclude_special = True  # [CLS]/[SEP] are never targets (as HF's collators); False predicts them too.
  return s


def data(variant: str) -> ml_collections.ConfigDict:
  """Sources, tokenizer and the input pipeline."""
  seq_len = _RUN_SHAPES[variant][1]
  s = ml_collections.ConfigDict()
  s.path = "builtin"  # "builtin", or file / directory / glob, comma-separated; gs:// works.
  s.format = "auto"  # "auto" (by extension), or a format of core/formats.py FORMAT_TABLE: text, jsonl, ...
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


def train(variant: str) -> ml_collections.ConfigDict:
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
  # Empty init_from: the source's (a from_hf source's shape); another than the source's is refused.
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


def checkpoint(variant: str) -> ml_collections.ConfigDict:
  """When checkpoints are saved and kept."""
  ckpt_every = _RUN_SHAPES[variant][5]
  s = ml_collections.ConfigDict()
  s.every_steps = ckpt_every
  s.keep = 3
  s.keep_steps = ()  # Steps also saved and never garbage-collected (a WSD stable run's fork points).
  s.async_save = True
  return s


def mesh() -> ml_collections.ConfigDict:
  """Device mesh sizes and sharding-rule overrides."""
  s = ml_collections.ConfigDict()
  s.data = 1  # One of data / fsdp / tensor may be -1: it takes the remaining devices.
  s.fsdp = -1
  s.tensor = 1
  s.rules = ()  # Overrides of sharding.DEFAULT_RULES: (("mlp", "tensor"), ("vocab", None), ...).
  return s


def eval_() -> ml_collections.ConfigDict:
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


def metrics(variant: str) -> ml_collections.ConfigDict:
  """Logging and MFU."""
  s = ml_collections.ConfigDict()
  s.log_every = 1 if variant == "tiny" else 10
  s.tensorboard = True
  s.progress_bar = True
  s.cpu_peak_tflops = 0.1  # Per-device peak used for MFU on CPU (no vendor number exists).
  # Weights & Biases (run/wandb_logger.py): the metrics.jsonl scalars and the config, from process 0.
  # A resume continues the run's W&B run (its id in WORKDIR/wandb_run.json); WANDB_MODE=offline works.
  s.wandb = False
  s.wandb_project = "crossbert_jax"
  s.wandb_entity = ""  # "": W&B's default entity.
  s.wandb_run_name = ""  # "": the workdir's name.
  s.wandb_tags = ()  # e.g. ("tiny", "ablation").
  s.wandb_group = ""  # "": a fork's group is its source's; sweeps set the sweep's name.
  return s


def profile() -> ml_collections.ConfigDict:
  """A jax.profiler trace of a window of steps (run/profile.py), into WORKDIR/profile/."""
  s = ml_collections.ConfigDict()
  s.start_step = 0  # First traced step (>= 2: step 1 compiles); 0: off.
  s.steps = 3  # Steps traced from start_step on.
  s.hosts = "0"  # Processes that trace: comma-separated indices, or "all".
  return s



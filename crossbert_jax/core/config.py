"""The config front end: the ml_collections ConfigDict a config file returns, and its validation.

`configs/crossbert.py` and `configs/bert.py` call `get_config(objective, variant)`, built from the
typed sections of core/sections.py (every key, its type and default declared there once); flags
override keys; `core/plan.build` validates the result once (`validate`, then each phase's) and
turns it into the typed RunPlan that everything below the commands reads.
"""

import ml_collections

from crossbert_jax.core import choices, formats, mixture, objectives, sections
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError, config_error

VARIANTS = sections.VARIANTS
# The front end's type, for the few functions that edit a user's config before core/plan.build.
ConfigDict = ml_collections.ConfigDict


def get_config(objective: str, variant: str) -> ml_collections.ConfigDict:
  """Returns the full, locked config for `objective` (a name in core/objectives) at `variant`."""
  if objective not in objectives.names():
    raise UserError(f"objective={objective!r}: use one of {objectives.names()}")
  if variant not in VARIANTS:
    raise UserError(f"config variant {variant!r}: use one of {VARIANTS} (e.g. configs/crossbert.py:tiny)")

  c = ml_collections.ConfigDict()
  # core/objectives: "crossbert" (encoder on visible tokens + reconstructor), "mlm" (flat BERT), or a
  # registered one (which may add its own section in `configure`).
  c.objective = objective
  for section in sections.SECTIONS:
    c[section.NAME] = ml_collections.ConfigDict(section.for_variant(variant).to_dict())
  objectives.get(objective).configure(c)
  c.lock()
  return c


# A CPU trial of a pod-sized recipe (configs/*.py:from_hf_cpu): float32, no remat, a small batch,
# a warmup that ends inside a short run. The model shape is untouched.
CPU_TRIAL = {
    "model.dtype": "float32", "model.remat": "none", "train.batch_size": 8, "data.seq_len": 128,
    "train.warmup_steps": 10, "train.steps": 100, "checkpoint.every_steps": 50}


def on_cpu(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`c` with the CPU_TRIAL run settings (any of them can still be set by flags)."""
  for key, value in CPU_TRIAL.items():
    section, name = key.split(".")
    c[section][name] = value
  return c


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises UserError (one line, naming the key) for an inconsistent config; its phases' configs are
  checked by `core/plan.build`, the one caller."""
  if c.objective not in objectives.names():
    raise config_error("objective", f"{c.objective!r} is not one of {objectives.names()}")
  _validate_model(c.model)
  if not 0.0 <= c.model.dropout < 1.0:
    raise config_error("model.dropout", f"must be in [0, 1), got {c.model.dropout}")
  if c.model.dropout and not objectives.get(c.objective).uses_dropout:
    raise config_error("model.dropout", f"objective={c.objective} draws no dropout; leave it 0 (it applies to "
                       "objective=contrast)")
  _validate_masking(c, objectives.get(c.objective))
  _validate_data(c.data)
  _validate_train(c.train)
  _validate_runtime(c)
  phases_lib.check_ramp_signs(c.train.batch_ramp)


def _validate_model(m: ml_collections.ConfigDict) -> None:
  """The encoder's shape, attention and numerics."""
  for key in ("vocab_size", "embed_dim", "num_heads", "num_layers", "mlp_dim"):
    if m[key] <= 0:
      raise config_error(f"model.{key}", f"must be positive, got {m[key]}")
  if m.embed_dim % m.num_heads:
    raise config_error("model.num_heads", f"{m.num_heads} heads do not divide model.embed_dim={m.embed_dim}")
  if (m.embed_dim // m.num_heads) % 2:
    raise config_error("model.num_heads", "head dim (embed_dim / num_heads) must be even for RoPE")
  if m.global_every < 1:
    raise config_error("model.global_every", f"must be >= 1 (1 = all global), got {m.global_every}")
  if m.local_window < 2 or m.local_window % 2:
    raise config_error("model.local_window", f"must be an even number >= 2, got {m.local_window}")
  choices.check("model.remat", m.remat, choices.Remat)
  choices.check("model.dtype", m.dtype, choices.Dtype)
  choices.check("model.head_dtype", m.head_dtype, choices.Dtype)
  choices.check("model.attention", m.attention, choices.Attention)
  if m.memory_budget_gib < 0:
    raise config_error("model.memory_budget_gib", f"must be >= 0 (0: the device's memory), got {m.memory_budget_gib}")
  for key in ("attention_block_q", "attention_block_kv", "attention_chunked_min_len", "loss_chunk"):
    if m[key] < 1:
      raise config_error(f"model.{key}", f"must be >= 1, got {m[key]}")
  if m.scan_layers and m.num_layers < 2:
    raise config_error("model.scan_layers", "needs model.num_layers >= 2")


def _validate_masking(c: ml_collections.ConfigDict, objective: objectives.ObjectiveSpec) -> None:
  """The mlm and masking sections, and the objective's own checks."""
  if not (c.mlm.mask_prob >= 0 and c.mlm.random_prob >= 0 and c.mlm.mask_prob + c.mlm.random_prob <= 1.0):
    raise config_error("mlm.mask_prob", "mask_prob and random_prob must be >= 0 and sum to <= 1")
  mk, L = c.masking, c.data.seq_len
  if L < 4:
    raise config_error("data.seq_len", f"must be >= 4, got {L}")
  if not 0.0 < mk.ratio < 1.0:
    raise config_error("masking.ratio", f"must be in (0, 1), got {mk.ratio}")
  if mk.views < 1:
    raise config_error("masking.views", f"must be >= 1, got {mk.views}")
  objective.validate(c)  # Its own sections and what it needs of the masking (e.g. complementary views).
  if round(mk.ratio * L) < 1 or L - round(mk.ratio * L) < 1:
    raise config_error("masking.ratio", f"{mk.ratio} leaves no masked or no visible slot at data.seq_len={L}")
  if not 0.0 < mk.reconstruct_ratio <= 1.0:
    raise config_error("masking.reconstruct_ratio", f"must be in (0, 1], got {mk.reconstruct_ratio}")


def _validate_data(d: ml_collections.ConfigDict) -> None:
  """The data section (sources, formats, the mixture)."""

  if fix := formats.check(d.format):
    raise config_error("data.format", f"{d.format!r}: {fix}")
  choices.check("data.text_unit", d.text_unit, choices.TextUnit)
  mixture.validate(d)
  if d.worker_count < 0:
    raise config_error("data.worker_count", f"must be >= 0, got {d.worker_count}")


def _validate_train(t: ml_collections.ConfigDict) -> None:
  """Steps, batch and the optimizer's schedule."""
  if t.steps < 1:
    raise config_error("train.steps", f"must be >= 1, got {t.steps}")
  if t.stop_at_step < 0:
    raise config_error("train.stop_at_step", f"must be >= 0 (0 = run to train.steps), got {t.stop_at_step}")
  if t.batch_size < 1:
    raise config_error("train.batch_size", f"must be >= 1, got {t.batch_size}")
  if t.grad_accum < 0 or (t.grad_accum and t.batch_size % t.grad_accum):
    raise config_error(
        "train.grad_accum", f"{t.grad_accum} must divide train.batch_size={t.batch_size} (or be 0: the fewest "
        "micro-batches whose compiled step fits the device's memory)")
  if t.learning_rate <= 0:
    raise config_error("train.learning_rate", f"must be positive, got {t.learning_rate}")
  if t.warmup_steps < 0:
    raise config_error("train.warmup_steps", f"must be >= 0, got {t.warmup_steps}")
  choices.check("train.decay", t.decay, choices.Decay)
  if not 0.0 < t.decay_fraction <= 1.0:
    raise config_error("train.decay_fraction", f"must be in (0, 1], got {t.decay_fraction}")
  choices.check("train.decay_shape", t.decay_shape, choices.DecayShape)
  if t.decay == "wsd" and t.warmup_steps > t.steps - round(t.decay_fraction * t.steps):
    raise config_error(
        "train.warmup_steps", f"{t.warmup_steps} runs into the wsd decay, which starts after step "
        f"{t.steps - round(t.decay_fraction * t.steps)}; lower it or train.decay_fraction")
  if t.shape_from_init and not t.init_from:
    raise config_error(
        "train.shape_from_init", "is set but train.init_from is empty: pass --config.train.init_from=IMP, "
        "a folder from `python -m crossbert_jax.export import`")
  if not 0.0 <= t.final_lr_ratio <= 1.0:
    raise config_error("train.final_lr_ratio", f"must be in [0, 1], got {t.final_lr_ratio}")
  if t.clip_norm < 0:
    raise config_error("train.clip_norm", f"must be >= 0 (0 = off), got {t.clip_norm}")


def _validate_runtime(c: ml_collections.ConfigDict) -> None:
  """Checkpoints, mesh, probes and metrics."""
  if c.checkpoint.every_steps < 1:
    raise config_error("checkpoint.every_steps", f"must be >= 1, got {c.checkpoint.every_steps}")
  if c.checkpoint.keep < 1:
    raise config_error("checkpoint.keep", f"must be >= 1, got {c.checkpoint.keep}")
  if not all(isinstance(s, int) and s >= 1 for s in c.checkpoint.keep_steps):
    raise config_error("checkpoint.keep_steps", f"must be steps >= 1, got {c.checkpoint.keep_steps!r}")
  sizes = {k: c.mesh[k] for k in ("data", "fsdp", "tensor")}
  if sum(v == -1 for v in sizes.values()) > 1:
    raise config_error("mesh", "at most one of mesh.data / mesh.fsdp / mesh.tensor may be -1")
  for k, v in sizes.items():
    if v == 0 or v < -1:
      raise config_error(f"mesh.{k}", f"must be a positive size or -1, got {v}")
  if c.eval.every_steps < 0:
    raise config_error("eval.every_steps", f"must be >= 0 (0 = off), got {c.eval.every_steps}")
  if c.eval.every_steps > 0 and not c.eval.data_dir:
    raise config_error("eval.data_dir",
                       "is empty but eval.every_steps > 0: point it at the task data (e.g. ../shared/data)")
  if c.eval.max_examples != 0 and c.eval.max_examples < 10:
    raise config_error("eval.max_examples", f"must be 0 (whole splits) or >= 10, got {c.eval.max_examples}")
  choices.check("eval.splits", c.eval.splits, choices.EvalSplits)
  if c.metrics.log_every < 1:
    raise config_error("metrics.log_every", f"must be >= 1, got {c.metrics.log_every}")
  if c.metrics.cpu_peak_tflops <= 0:
    raise config_error("metrics.cpu_peak_tflops", f"must be positive, got {c.metrics.cpu_peak_tflops}")
  _validate_profile(c.profile, c.train.steps)
  if c.metrics.wandb and not c.metrics.wandb_project:
    raise config_error("metrics.wandb_project", "is empty but metrics.wandb=True: name the W&B project")
  bad = sorted(set(_WANDB_NAME_BAD) & set(c.metrics.wandb_project))
  if c.metrics.wandb and bad:
    fix = (f": give the team as metrics.wandb_entity={c.metrics.wandb_project.split('/')[0]!r} and the project as "
           f"metrics.wandb_project={c.metrics.wandb_project.split('/')[-1]!r}"
           if bad == ["/"] else ": W&B project names cannot hold / \\ # ? % :")
    raise config_error("metrics.wandb_project", f"{c.metrics.wandb_project!r} holds {' '.join(bad)}{fix}")
  if not all(isinstance(tag, str) and tag for tag in c.metrics.wandb_tags):
    raise config_error("metrics.wandb_tags", f"must be a tuple of non-empty strings, got {c.metrics.wandb_tags!r}")


_WANDB_NAME_BAD = "/\\#?%:"  # Characters W&B refuses in a project name.


def _validate_profile(p: ml_collections.ConfigDict, steps: int) -> None:
  """The traced window: after the compile step, inside the run."""
  if p.start_step < 0:
    raise config_error("profile.start_step", f"must be >= 0 (0 = off), got {p.start_step}")
  hosts = p.hosts.replace(" ", "")
  if hosts != "all" and not all(h.isdigit() for h in hosts.split(",")):
    raise config_error("profile.hosts",
                       f"{p.hosts!r}: use comma-separated process indices (e.g. '0' or '0,4') or 'all'")
  if p.start_step == 0:
    return
  if p.start_step == 1:
    raise config_error("profile.start_step", "step 1 compiles the train step: start at 2 or later")
  if p.steps < 1:
    raise config_error("profile.steps", f"must be >= 1, got {p.steps}")
  if p.start_step + p.steps - 1 > steps:
    raise config_error(
        "profile.start_step", f"the window {p.start_step}-{p.start_step + p.steps - 1} ends past the last "
        f"step (train.steps={steps}): lower profile.start_step or profile.steps")


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
  if objective not in objectives.names():
    raise config_error("objective", f"{objective!r} is not one of {objectives.names()}")
  missing = _missing_keys(value, get_config(objective, "tiny"))
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise UserError(f"--config file lacks config key {missing[0]}{more}: build it with get_config(objective, "
                    "variant) from crossbert_jax/core/config.py (every key: core/sections.py)")
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

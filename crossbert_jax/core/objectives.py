"""What an objective is as data: its spec (config defaults and checks, sections, export head, model
card, configs file) and the registry of specs by name (config key `objective`).

An objective has two halves under one name. This spec is read by the config schema, resume (`run/`),
the export (`hf/`) and the sweep (`scaling/`) without importing model or training code; its training
half (training/objectives/: model, init inputs, loss, FLOPs) is registered there. The built-in specs
are declared here; a new objective registers its spec with its training half
(`training.objectives.register`).
"""

import dataclasses
import math
import numbers
from typing import Callable

import ml_collections

from crossbert_jax.core import choices, sections
from crossbert_jax.core.errors import UserError, config_error

ConfigFn = Callable[[ml_collections.ConfigDict], None]


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
  """One objective as data."""

  name: str  # The config's `objective`.
  config_file: str  # The configs/*.py file the sweep launches it with (`--config=FILE:VARIANT`).
  # Config sections of its own, beside `model` and `masking`: a resume refuses to change them.
  sections: tuple[str, ...]
  # The export: True writes ModernBertForMaskedLM with the params' "head" (models.MlmHead), False
  # ModernBertModel (the encoder only). `card_title` heads the model card.
  exports_mlm_head: bool
  card_title: str
  configure: ConfigFn  # Sets its defaults (and adds its own sections) on get_config's unlocked config.
  validate: ConfigFn  # Raises UserError (one line naming the key) for a config it cannot train.
  # What the model card adds after "masking ratio R" (e.g. ", 2 complementary views"), or "".
  card_training: Callable[[ml_collections.ConfigDict], str] = lambda c: ""
  # Its own input stream, "module:function" (c, tokenizer, *, batch_size, seed, process_index, process_count)
  # -> a checkpointable iterator of this process's batches; "": data/pipeline.py's packed rows.
  feed: str = ""
  # A key of its own section naming the model it starts from; hf/import_config.resolve makes it train.init_from
  # (with the source's shape): "" for none.
  init_from_key: str = ""
  uses_dropout: bool = False  # Its loss draws model.dropout (others refuse model.dropout > 0).


def _configure_crossbert(c: ml_collections.ConfigDict) -> None:
  c.masking.ratio = 0.5
  c.masking.views = 2


def _validate_crossbert(c: ml_collections.ConfigDict) -> None:
  r, m, mk, seq_len = c.reconstructor, c.model, c.masking, c.data.seq_len
  for key in ("num_layers", "embed_dim", "num_heads", "mlp_dim"):
    if r[key] <= 0:
      raise config_error(f"reconstructor.{key}", f"must be positive, got {r[key]}")
  if r.embed_dim % r.num_heads or (r.embed_dim // r.num_heads) % 2:
    raise config_error("reconstructor.num_heads",
                       f"{r.num_heads} heads must divide reconstructor.embed_dim={r.embed_dim} into even head dims")
  if r.tie_head and r.embed_dim != m.embed_dim:
    raise config_error("reconstructor.tie_head", "needs reconstructor.embed_dim == model.embed_dim")
  if mk.views > 1:
    if abs(mk.ratio - (1.0 - 1.0 / mk.views)) > 1e-9:
      raise config_error(
          "masking.ratio", f"complementary masking with views={mk.views} needs ratio=1-1/views="
          f"{1 - 1 / mk.views:g}, got {mk.ratio}")
    if seq_len % mk.views:
      raise config_error("data.seq_len", f"{seq_len} must be divisible by masking.views={mk.views}")


def _configure_mlm(c: ml_collections.ConfigDict) -> None:
  c.masking.ratio = 0.15
  c.masking.views = 1


def _validate_mlm(c: ml_collections.ConfigDict) -> None:
  if c.masking.views != 1:
    raise config_error("masking.views", "the flat BERT baseline (objective=mlm) uses masking.views=1")
  if c.masking.reconstruct_ratio != 1.0:
    raise config_error("masking.reconstruct_ratio", "applies to objective=crossbert only; leave it at 1.0")


def check_temperature(temperature: float, key: str = "contrast.temperature") -> float:
  """`temperature` if it is a finite number > 0; else the one-line error naming config `key`."""
  if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) \
      or temperature <= 0:
    raise config_error(
        key, f"must be a number > 0 (got {temperature!r}); typical values are 0.01 to 0.1, "
        "e.g. 0.05 (SimCSE) or 0.02")
  return float(temperature)


def _configure_contrast(c: ml_collections.ConfigDict) -> None:
  c.contrast = ml_collections.ConfigDict(sections.Contrast().to_dict())


def _validate_contrast(c: ml_collections.ConfigDict) -> None:
  k, t = c.contrast, c.train
  if not k.init_from:
    raise config_error(
        "contrast.init_from", "is empty: give the encoder the stage starts from, a pretraining "
        "run's workdir or a folder from `python -m crossbert_jax.export import`")
  if t.init_from and t.init_from != k.init_from:
    raise config_error(
        "train.init_from", f"{t.init_from!r} differs from contrast.init_from={k.init_from!r}: a "
        "contrastive run starts from contrast.init_from; leave train.init_from empty")
  choices.check("contrast.recipe", k.recipe, choices.Recipe)
  choices.check("contrast.pooling", k.pooling, choices.Pooling)
  choices.check("contrast.padding", k.padding, choices.Padding)
  check_temperature(k.temperature)
  if t.batch_size < 2:
    raise config_error(
        "train.batch_size", f"{t.batch_size}: a contrastive batch needs >= 2 examples (the other "
        "examples are each one's negatives); use 32 or more")
  if t.grad_accum != 1:
    raise config_error(
        "train.grad_accum", "micro-batches would shrink the in-batch negatives; keep it 1 and set "
        "contrast.chunk_size (GradCache) for a batch that does not fit")
  if k.chunk_size < 0:
    raise config_error("contrast.chunk_size", f"must be >= 0 (0: off), got {k.chunk_size}")
  if k.recipe == "simcse":
    if not c.model.dropout > 0:
      raise config_error("model.dropout", "is 0, but contrast.recipe=simcse's positives differ only by dropout: "
                         "set it > 0, e.g. 0.1")
    for key, default in (("hard_negatives", False), ("columns", "")):
      if k[key] != default:
        raise config_error(f"contrast.{key}", "applies to contrast.recipe=pairs only")
  elif k.columns and not 2 <= len(k.columns.split(",")) <= 3:
    raise config_error("contrast.columns", f"{k.columns!r}: give 'anchor,positive' or 'anchor,positive,negative' "
                       "column names")
  elif k.columns and k.hard_negatives != (len(k.columns.split(",")) == 3):
    raise config_error(
        "contrast.columns", f"{k.columns!r} and contrast.hard_negatives={k.hard_negatives} disagree: "
        "name a negative column exactly when hard_negatives is True")


CROSSBERT = ObjectiveSpec(name="crossbert", config_file="configs/crossbert.py", sections=("reconstructor",),
                          exports_mlm_head=False, card_title="CrossBERT encoder (reconstructor discarded)",
                          configure=_configure_crossbert, validate=_validate_crossbert,
                          card_training=lambda c: f", {c.masking.views} complementary views")
MLM = ObjectiveSpec(name="mlm", config_file="configs/bert.py", sections=("mlm",), exports_mlm_head=True,
                    card_title="flat BERT baseline (MLM head included as ModernBertForMaskedLM)",
                    configure=_configure_mlm, validate=_validate_mlm)
CONTRAST = ObjectiveSpec(
    name="contrast", config_file="configs/contrast.py", sections=("contrast",), exports_mlm_head=False,
    card_title="sentence embedding model (contrastive stage)", configure=_configure_contrast,
    validate=_validate_contrast, card_training=lambda c:
    (f": {c.contrast.recipe} from {c.contrast.init_from}, temperature "
     f"{c.contrast.temperature}, {c.contrast.pooling} pooling, normalised"),
    feed="crossbert_jax.data.contrast_feed:make_iterator", init_from_key="contrast.init_from", uses_dropout=True)
_SPECS: dict[str, ObjectiveSpec] = {spec.name: spec for spec in (CROSSBERT, MLM, CONTRAST)}


def register(spec: ObjectiveSpec) -> ObjectiveSpec:
  """Makes `spec` available as config `objective=spec.name` (a later one replaces it)."""
  _SPECS[spec.name] = spec
  return spec


def names() -> tuple[str, ...]:
  """The objectives a config may name: the built-in ones, then any registered."""
  return tuple(_SPECS)


def get(name: str) -> ObjectiveSpec:
  """The spec of objective `name`; UserError naming the choices for an unknown one."""
  if name not in _SPECS:
    raise UserError(f"objective={name!r}: use one of {names()}")
  return _SPECS[name]

"""The `Objective` protocol and the registry of objectives by name (config key `objective`).

An objective is one module (training/objectives/): it registers an instance here, and every part
of the framework that depends on the objective (config defaults and checks, model, init, loss,
FLOPs, what resume refuses, the sweep's keys, the Hugging Face export) asks `get(c.objective)`.
The registry sits in core so that the config schema can ask it; the built-in objectives are named
by module, like entry points, and imported on first `get`, so core imports no model code.
"""

import importlib
from typing import Any, Callable, Protocol

import jax
import ml_collections

from crossbert_jax.core.errors import UserError

Batch = dict[str, jax.Array]
# (params, batch, key) -> (summed token loss, LossStats): summed so that micro-batches add up exactly.
LossFn = Callable[[Any, Batch, jax.Array], tuple[jax.Array, Any]]

# Built-in objectives: name -> the module that registers it.
_BUILTIN = {"crossbert": "crossbert_jax.training.objectives.crossbert",
            "mlm": "crossbert_jax.training.objectives.mlm"}
_REGISTRY: dict[str, "Objective"] = {}


class Objective(Protocol):
  """What the framework asks of a training objective."""

  name: str  # The config's `objective`.
  config_file: str  # The configs/*.py file the sweep launches it with (`--config=FILE:VARIANT`).
  # Config sections of its own, beside `model` and `masking`: a resume refuses to change them.
  sections: tuple[str, ...]
  # The export: True writes ModernBertForMaskedLM with the params' "head" (models.MlmHead), False
  # ModernBertModel (the encoder only). `card_title` heads the model card.
  exports_mlm_head: bool
  card_title: str

  def configure(self, c: ml_collections.ConfigDict) -> None:
    """Sets its defaults (and adds its own sections) on get_config's unlocked config."""

  def validate(self, c: ml_collections.ConfigDict) -> None:
    """Raises UserError (one line naming the key) for a config this objective cannot train."""

  def build_model(self, c: ml_collections.ConfigDict) -> Any:
    """The flax module (nn.Module) whose params it trains ("encoder" is the exported part)."""

  def init_inputs(self, c: ml_collections.ConfigDict, batch: Batch) -> tuple:
    """The model's arguments after (tokens, positions, segment_ids) for init on a dummy batch."""

  def make_loss_fn(self, c: ml_collections.ConfigDict, model: Any, replacement_vocab: int | None,
                   specials: Any) -> LossFn:
    """The loss of one (micro-)batch of `model`; `replacement_vocab`, `specials` (data.special_ids.SpecialIds)
    as in training.objectives.make_loss_fn."""

  def encoder_shape(self, c: ml_collections.ConfigDict) -> tuple[int, int, int]:
    """(views, encoder tokens per view, predicted slots per view) of one sequence."""

  def forward_flops(self, c: ml_collections.ConfigDict) -> dict[str, float]:
    """Forward matmul FLOPs per sequence: {"encoder", "reconstructor", "head"} (flops.py's rules)."""

  def sweep_overrides(self, size: dict[str, Any], spec_objective: dict[str, Any]) -> dict[str, Any]:
    """Config keys a sweep sets for a size beyond the encoder's (scaling/plan.py), e.g. its decoder width."""

  def card_training(self, c: ml_collections.ConfigDict) -> str:
    """What the model card adds after "masking ratio R" (e.g. ", 2 complementary views"), or ""."""


def register(objective: Objective) -> Objective:
  """Makes `objective` available as config `objective=objective.name` (a later one replaces it)."""
  _REGISTRY[objective.name] = objective
  return objective


def names() -> tuple[str, ...]:
  """The objectives a config may name: the built-in ones, then any registered."""
  return tuple(dict.fromkeys([*_BUILTIN, *_REGISTRY]))


def get(name: str) -> Objective:
  """The objective `name`; UserError naming the choices for an unknown one."""
  if name not in _REGISTRY and name in _BUILTIN:
    importlib.import_module(_BUILTIN[name])  # It registers itself.
  if name not in _REGISTRY:
    raise UserError(f"objective={name!r}: use one of {names()}")
  return _REGISTRY[name]

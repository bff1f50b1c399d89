"""Training objectives behind one seam: `loss_fn(params, batch, key) -> (summed loss, stats)`.

An objective's training half (model, init inputs, loss, FLOPs), registered by name beside its spec
(core/objectives.py: config defaults and checks, sections, export head, model card). Built in:
crossbert.py (encoder on the visible tokens of K complementary views, a reconstructor predicts the
rest) and mlm.py (the flat BERT baseline), imported on first use. Adding one: a module whose
`Objective` holds its `spec` and calls `register`, and a configs/*.py.
"""

import importlib
from typing import Any, Callable, Protocol

import flax.linen as nn
import jax

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives as specs
from crossbert_jax.core.errors import UserError
from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds
from crossbert_jax.training.objectives.losses import (  # noqa: F401 - the shared loss parts, re-exported.
    Batch, LossStats, _token_losses, chunked_cross_entropy, dummy_batch, replacement_vocab_size, targetable)

# (params, batch, key) -> (summed token loss, LossStats): summed so that micro-batches add up exactly.
LossFn = Callable[[Any, Batch, jax.Array], tuple[jax.Array, Any]]

# Built-in objectives: name -> the module that registers its training half.
_BUILTIN = {
    "crossbert": "crossbert_jax.training.objectives.crossbert", "mlm": "crossbert_jax.training.objectives.mlm",
    "contrast": "crossbert_jax.training.objectives.contrast"}
_REGISTRY: dict[str, "Objective"] = {}


class Objective(Protocol):
  """What the training side asks of an objective (its data half is `spec`)."""

  spec: specs.ObjectiveSpec

  def build_model(self, c: plan_lib.Settings) -> Any:
    """The flax module (nn.Module) whose params it trains ("encoder" is the exported part)."""

  def init_inputs(self, c: plan_lib.Settings, batch: Batch) -> tuple:
    """The model's arguments after (tokens, positions, segment_ids) for init on a dummy batch."""

  def make_loss_fn(self, c: plan_lib.Settings, model: Any, replacement_vocab: int | None, specials: Any) -> LossFn:
    """The loss of one (micro-)batch of `model`; `replacement_vocab`, `specials` (data.special_ids.SpecialIds)
    as in make_loss_fn."""

  def encoder_shape(self, c: plan_lib.Settings) -> tuple[int, int, int]:
    """(views, encoder tokens per view, predicted slots per view) of one sequence."""

  def forward_flops(self, c: plan_lib.Settings) -> dict[str, float]:
    """Forward matmul FLOPs per sequence: {"encoder", "reconstructor", "head"} (flops.py's rules)."""


def register(objective: Objective) -> Objective:
  """Makes `objective` trainable as config `objective=objective.spec.name`, its spec registered too."""
  specs.register(objective.spec)
  _REGISTRY[objective.spec.name] = objective
  return objective


def names() -> tuple[str, ...]:
  return specs.names()


def get(name: str) -> Objective:
  """The training half of objective `name`; UserError naming the choices for an unknown one."""
  if name not in _REGISTRY and name in _BUILTIN:
    importlib.import_module(_BUILTIN[name])  # It registers itself.
  if name not in _REGISTRY:
    raise UserError(f"objective={name!r}: use one of {names()}")
  return _REGISTRY[name]


def build_model(c: plan_lib.Settings) -> nn.Module:
  """The model for `c.objective`."""
  return get(c.objective).build_model(c)


def make_loss_fn(c: plan_lib.Settings, replacement_vocab: int | None = None,
                 specials: SpecialIds = SENTENCEPIECE) -> LossFn:
  """The loss function for `c.objective` (params, batch, key) -> (summed loss, stats).

  `replacement_vocab`: where BERT's random replacement ids end (`replacement_vocab_size`, from
  the run's tokenizer); shape-only callers leave it None and get model.vocab_size. `specials`:
  the tokenizer's special ids (never targets, never random replacements, [MASK]).
  """
  objective = get(c.objective)
  return objective.make_loss_fn(c, objective.build_model(c), replacement_vocab, specials)


def make_grad_fn(c: plan_lib.Settings, replacement_vocab: int | None = None,
                 specials: SpecialIds = SENTENCEPIECE) -> Callable:
  """(params, batch, key) -> ((summed loss, stats), grads) for `c.objective`: jax.value_and_grad of its loss,
  or its own `make_grad_fn` (optional; the contrastive stage's GradCache)."""
  objective = get(c.objective)
  model = objective.build_model(c)
  if hasattr(objective, "make_grad_fn"):
    return objective.make_grad_fn(c, model, replacement_vocab, specials)
  return jax.value_and_grad(objective.make_loss_fn(c, model, replacement_vocab, specials), has_aux=True)


def batch_shapes(c: plan_lib.Settings) -> dict[str, tuple[int, ...]]:
  """The global batch's int32 arrays and shapes: packed rows (tokens, segment_ids, positions: B x L), or
  the objective's own `batch_shapes` (optional; an objective with its own input stream, spec.feed)."""
  objective = get(c.objective)
  if hasattr(objective, "batch_shapes"):
    return objective.batch_shapes(c)
  return {k: (c.train.batch_size, c.data.seq_len) for k in ("tokens", "segment_ids", "positions")}


def init_params(c: plan_lib.Settings, key: jax.Array, batch_size: int = 1) -> Any:
  """Initialises the (boxed, logically partitioned) params of `c.objective`'s model."""
  objective = get(c.objective)
  batch = dummy_batch(batch_size, c.data.seq_len)
  return objective.build_model(c).init(key, batch["tokens"], batch["positions"], batch["segment_ids"],
                                       *objective.init_inputs(c, batch))["params"]

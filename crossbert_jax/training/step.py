"""Train state, abstract-first sharded init, and the jitted train step.

The step draws its masks from `fold_in(base_key, step)` (micro-batch i: one more fold_in), so
a restart reproduces them with no extra state. Gradients are accumulated over micro-batches as
summed losses and divided by the total target count once, so accumulation is exact.
"""

from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crossbert_jax.training import objectives, optimizer, sharding

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  """Everything a step updates: checkpointed as one pytree."""
  step: Array
  params: Any
  opt_state: Any


def create_state(c: ml_collections.ConfigDict, tx: optax.GradientTransformation, key: Array) -> TrainState:
  """A fresh (unsharded, unboxed) train state; call under jit with out_shardings, or eval_shape."""
  params = nn.unbox(objectives.init_params(c, key))
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def state_shardings(c: ml_collections.ConfigDict, tx: optax.GradientTransformation, mesh: Mesh, rules):
  """(abstract state, its NamedShardings): params from logical names, opt state from the params."""
  boxed = jax.eval_shape(lambda k: objectives.init_params(c, k), jax.random.key(0))
  param_shardings = sharding.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
  abstract = jax.eval_shape(lambda k: create_state(c, tx, k), jax.random.key(0))
  replicated = NamedSharding(mesh, PartitionSpec())
  opt_shardings = optax.tree_utils.tree_map_params(
      tx, lambda _, s: s, abstract.opt_state, param_shardings,
      transform_non_params=lambda _: replicated)
  shardings = TrainState(step=replicated, params=param_shardings, opt_state=opt_shardings)
  return abstract, shardings


def init_state(c: ml_collections.ConfigDict, tx: optax.GradientTransformation, mesh: Mesh, rules,
               shardings: TrainState) -> TrainState:
  """Initialises the state directly into its shardings: nothing is materialised unsharded."""
  key = jax.random.key(c.train.seed)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(lambda k: create_state(c, tx, k), out_shardings=shardings)(key)


def make_train_step(c: ml_collections.ConfigDict, tx: optax.GradientTransformation, mesh: Mesh, rules,
                    shardings: TrainState) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
  """The jitted step: (state, global batch) -> (new state, metrics). The state is donated."""
  loss_fn = objectives.make_loss_fn(c)
  schedule = optimizer.learning_rate_schedule(c.train)
  accum = c.train.grad_accum
  base_key = jax.random.key(c.train.seed)

  def step_fn(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    step_key = jax.random.fold_in(jax.random.fold_in(base_key, 1), state.step)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def micro(i, mb):
      (loss_sum, stats), grads = grad_fn(state.params, mb, jax.random.fold_in(step_key, i))
      return loss_sum, stats, grads

    if accum == 1:
      loss_sum, stats, grads = micro(0, batch)
    else:
      # Micro-batch i takes rows i::accum... as contiguous blocks: [accum, B/accum, ...].
      mbs = jax.tree.map(lambda a: a.reshape((accum, a.shape[0] // accum) + a.shape[1:]), batch)
      zeros = (jnp.zeros(()), objectives.LossStats(jnp.zeros(()), jnp.zeros(())),
               jax.tree.map(jnp.zeros_like, state.params))

      def body(carry, xs):
        i, mb = xs
        out = micro(i, mb)
        return jax.tree.map(jnp.add, carry, out), None

      (loss_sum, stats, grads), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), mbs))

    denom = jnp.maximum(stats.num_targets, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss_sum / denom,
        "accuracy": stats.num_correct / denom,
        "num_targets": stats.num_targets,
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": schedule(state.step),
    }
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  batch_shard = sharding.batch_sharding(mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  jitted = jax.jit(step_fn, in_shardings=(shardings, batch_shard), out_shardings=(shardings, replicated),
                   donate_argnums=(0,))

  def run(state: TrainState, batch: dict):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return jitted(state, batch)

  run.jitted = jitted
  return run

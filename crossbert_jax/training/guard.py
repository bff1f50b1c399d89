"""Only finite checkpoints: the params of step N are saved after their own loss was checked.

A step's logged loss is that of the params *before* its update, so checking it says nothing
about the params a checkpoint of that step holds. With a huge learning rate the params after
step N are finite yet give a NaN loss at step N+1 (measured: lr 1e6, params ~1e6, NaN at the
next step), so checking the params for finiteness is not enough either. Before every save
(periodic, final, on a stop) the loop computes the loss of the params to be saved on the next
batch with step N+1's masks: exactly the loss step N+1 will log. The batch is then used by
step N+1, so nothing is skipped and the run stays bitwise identical to one without saves.
"""

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crossbert_jax.training import objectives, sharding, step


def make_loss_check(c: ml_collections.ConfigDict, mesh: Mesh, rules,
                    shardings: step.TrainState) -> Callable[[step.TrainState, dict], jax.Array]:
  """(state, global batch) -> the loss the next train step will report, without updating."""
  loss_fn = objectives.make_loss_fn(c)
  accum = c.train.grad_accum
  base_key = jax.random.key(c.train.seed)

  def check(state: step.TrainState, batch: dict) -> jax.Array:
    # The same keys as step.make_train_step: fold_in(fold_in(base, 1), step), then micro-batch i.
    step_key = jax.random.fold_in(jax.random.fold_in(base_key, 1), state.step)
    mbs = jax.tree.map(lambda a: a.reshape((accum, a.shape[0] // accum) + a.shape[1:]), batch)

    def body(carry, xs):
      i, mb = xs
      loss_sum, stats = loss_fn(state.params, mb, jax.random.fold_in(step_key, i))
      return (carry[0] + loss_sum, carry[1] + stats.num_targets), None

    (loss_sum, num_targets), _ = jax.lax.scan(body, (jnp.zeros(()), jnp.zeros(())), (jnp.arange(accum), mbs))
    return loss_sum / jnp.maximum(num_targets, 1.0)

  jitted = jax.jit(check, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                   out_shardings=NamedSharding(mesh, PartitionSpec()))

  def run(state: step.TrainState, batch: dict) -> jax.Array:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return jitted(state, batch)

  return run

"""A trial's compiled program: the classifier's sharded state, the train step and the dev logits, on a mesh.

The params shard by the model's logical axes through training/sharding.py's rules (FSDP over every device
by default) and the batch over data x fsdp; the state is donated to the step. The loss is the weighted
mean over a batch's real rows (filler rows weigh 0): cross-entropy, or the squared error for regression
(STS-B), as `ModernBertForSequenceClassification` computes it. The learning rate follows transformers'
linear schedule with warmup, so our steps and `Trainer`'s see the same rates.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from crossbert_jax.core import sections
from crossbert_jax.finetuning import recipe
from crossbert_jax.finetuning.classifier import HeadSpec, SequenceClassifier
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.training import optimizer, sharding
from crossbert_jax.training.program import TrainState

INPUTS = ("tokens", "positions", "segment_ids")


def linear_schedule(peak: float, total_steps: int, warmup: int) -> optax.Schedule:
  """transformers' get_linear_schedule_with_warmup: count/warmup * peak, then linear to 0 at total_steps."""
  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    up = count / max(1, warmup)
    down = jnp.maximum(0.0, (total_steps - count) / max(1, total_steps - warmup))
    return peak * jnp.where(count < warmup, up, down)

  return schedule


def make_optimizer(learning_rate: float, weight_decay: float, total_steps: int) -> optax.GradientTransformation:
  """AdamW (recipe.BETAS, recipe.EPS), decay on kernels and embeddings only (as Trainer: not biases, norms)."""
  schedule = linear_schedule(learning_rate, total_steps, recipe.warmup_steps(total_steps))
  return optax.adamw(schedule, b1=recipe.BETAS[0], b2=recipe.BETAS[1], eps=recipe.EPS, weight_decay=weight_decay,
                     mask=optimizer.decay_mask)


def loss_fn(logits_BxC: jax.Array, labels_B: jax.Array, weights_B: jax.Array) -> jax.Array:
  """Weighted mean cross-entropy (C > 1) or squared error of logit 0 (C == 1), in float32."""
  if logits_BxC.shape[-1] == 1:
    per_row = jnp.square(logits_BxC[:, 0] - labels_B.astype(jnp.float32))
  else:
    per_row = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, labels_B.astype(jnp.int32))
  return jnp.sum(per_row * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)


class Program:
  """The model, optimizer, shardings and jitted functions of one trial on one mesh."""
  def __init__(self, encoder_spec: EncoderSpec, head: HeadSpec, tx: optax.GradientTransformation,
               mesh_cfg: sections.Mesh | None = None):
    mesh_cfg = mesh_cfg or sections.Mesh(data=1, fsdp=-1, tensor=1, rules=())
    self.mesh = sharding.make_mesh(mesh_cfg)
    self.rules = sharding.logical_rules(mesh_cfg)
    self.model = SequenceClassifier(encoder_spec, head)
    self.tx = tx
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    replicated = NamedSharding(self.mesh, PartitionSpec())
    boxed = jax.eval_shape(self._init_boxed, jax.random.key(0))
    params = sharding.logical_to_sharding(nn.get_partition_spec(boxed), self.mesh, self.rules)
    sharding.check_divisible(nn.unbox(boxed), params)
    self.abstract_params = nn.unbox(boxed)
    abstract_opt = jax.eval_shape(tx.init, self.abstract_params)
    opt = optax.tree_utils.tree_map_params(tx, lambda _, s: s, abstract_opt, params,
                                           transform_non_params=lambda _: replicated)
    self.shardings = TrainState(step=replicated, params=params, opt_state=opt)
    self._step = jax.jit(self._train_step, in_shardings=(self.shardings, self.batch_sharding),
                         out_shardings=(self.shardings, replicated), donate_argnums=(0,))
    self._logits = jax.jit(self._forward, in_shardings=(params, self.batch_sharding), out_shardings=replicated)
    self._loss = jax.jit(self._batch_loss, in_shardings=(params, self.batch_sharding), out_shardings=replicated)

  def _init_boxed(self, key):
    shape = (1, 8)
    ones = jnp.ones(shape, jnp.int32)
    return self.model.init(key, ones, jnp.zeros(shape, jnp.int32), ones)["params"]

  def _forward(self, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    return self.model.apply({"params": params}, *(batch[k] for k in INPUTS))

  def _batch_loss(self, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    return loss_fn(self._forward(params, batch), batch["labels"], batch["weights"])

  def _train_step(self, state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    loss, grads = jax.value_and_grad(self._batch_loss)(state.params, batch)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def _in_context(self, fn, *args):
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return fn(*args)

  def init_state(self, seed: int, start: dict[str, Any]) -> TrainState:
    """The trial's first state: the head and classifier drawn from `seed`, then the subtrees of `start`
    ({"encoder"[, "head"[, "classifier"]]}: numpy or arrays) put in their place, sharded."""
    init = jax.jit(lambda k: nn.unbox(self._init_boxed(k)), out_shardings=self.shardings.params)
    key = jax.random.key(seed)
    # As run/load.init_params: XLA:CPU's backend optimisations cost seconds on an init and change nothing needed.
    options = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else {}
    params = dict(self._in_context(lambda: init.lower(key).compile(compiler_options=options)(key)))
    for name, tree in start.items():
      params[name] = jax.device_put(jax.tree.map(np.asarray, tree), self.shardings.params[name])
    opt = jax.jit(self.tx.init, out_shardings=self.shardings.opt_state)
    opt_state = self._in_context(opt, params)
    return TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), self.shardings.step), params=params,
                      opt_state=opt_state)

  def put(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """A host batch (this process's rows) as the global batch."""
    return sharding.global_batch({k: v for k, v in local.items() if k != "rows"}, self.mesh)

  def step(self, state: TrainState, batch: dict[str, np.ndarray]) -> tuple[TrainState, dict[str, jax.Array]]:
    return self._in_context(self._step, state, self.put(batch))

  def logits(self, params: Any, batch: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(self._in_context(self._logits, params, self.put(batch)))

  def loss(self, params: Any, batch: dict[str, np.ndarray]) -> float:
    return float(self._in_context(self._loss, params, self.put(batch)))

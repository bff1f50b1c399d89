"""The compiled program of a run: the train state, its sharded init, the train step, the loss check.

`TrainProgram(c, mesh, replacement_vocab=...)` builds once, from the config and the mesh, what
every consumer of the step needs: the optimizer, the logical-axis rules, the state's abstract
shape and NamedShardings, the jitted train step and the jitted loss check. The loop, `aot`
(pre-flight compile), `bench` and the TPU attention tool all use it; none re-derives a piece.

Both jitted functions go through one `step_loss(params, batch, step)`: the step's mask keys
(`fold_in(fold_in(key(seed), 1), step)`, micro-batch i one more `fold_in(., i)`) and its
micro-batches (rows as `accum` contiguous blocks) are written once, so a restart reproduces the
masks with no extra state and the check cannot drift from the step. Gradients are accumulated
over micro-batches as summed losses and divided by the total target count once: exact.

Only finite checkpoints (`check_loss`): a step's logged loss is that of the params *before* its
update, so it says nothing about the params a checkpoint of that step holds. With a huge learning
rate the params after step N are finite yet give a NaN loss at step N+1 (measured: lr 1e6, params
~1e6, NaN at the next step), so checking the params for finiteness is not enough either. Before
every save the loop computes the loss of the params to be saved on the next batch with step N+1's
masks: exactly the loss step N+1 will log. That batch is then used by step N+1, so nothing is
skipped and the run stays bitwise identical to one without saves.
"""

from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds
from crossbert_jax.training import objectives, optimizer, sharding

Array = jax.Array
Batch = dict[str, Array]
# The keys, dtype and shape of data.pipeline's batches: tokens, segment ids, positions (B x L int32).
BATCH_KEYS = ("tokens", "segment_ids", "positions")
# The jax.profiler.StepTraceAnnotation of a traced train step (run/profile.py, perf/benchmark.py).
TRACE_STEP_NAME = "train_step"


@flax.struct.dataclass
class TrainState:
  """Everything a step updates: checkpointed as one pytree."""
  step: Array
  params: Any
  opt_state: Any


def create_state(c: plan_lib.Settings, tx: optax.GradientTransformation, key: Array) -> TrainState:
  """A fresh (unsharded, unboxed) train state; call under jit with out_shardings, or eval_shape."""
  params = nn.unbox(objectives.init_params(c, key))
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def param_shardings(c: plan_lib.Settings, mesh: Mesh, rules) -> Any:
  """The params' NamedShardings, from the logical axis names the model declares."""
  boxed = jax.eval_shape(lambda k: objectives.init_params(c, k), jax.random.key(0))
  shardings = sharding.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
  sharding.check_divisible(nn.unbox(boxed), shardings)
  return shardings


def abstract_params(c: plan_lib.Settings) -> Any:
  """The params' shapes and dtypes (nothing allocated)."""
  return nn.unbox(jax.eval_shape(lambda k: objectives.init_params(c, k), jax.random.key(0)))


class TrainProgram:
  """The optimizer, shardings, abstract state and jitted step / loss check of one config on one mesh.

  `replacement_vocab`: the end (exclusive) of the ids BERT's random replacements draw from, the
  tokenizer's vocabulary (`objectives.replacement_vocab_size`); shape-only users (aot, bench)
  leave it None and get model.vocab_size. `specials`: the tokenizer's special ids.
  """
  def __init__(self, c: plan_lib.Settings, mesh: Mesh, *, replacement_vocab: int | None = None,
               specials: SpecialIds = SENTENCEPIECE):
    # remat=auto, grad_accum=0 (auto): the compiled candidates tried, {remat, grad_accum, total_bytes}.
    self.fit_choice: list[dict[str, Any]] = []
    # The chosen candidate's (compiled step, compile seconds), from the shaped inputs: the program
    # `lower().compile()` gives, so compile and bench do not compile it twice. None without auto keys.
    self.fit_compiled: tuple[jax.stages.Compiled, float] | None = None
    if c.model.remat == "auto" or c.train.grad_accum == 0:
      from crossbert_jax.training import memory  # pylint: disable=g-import-not-at-top (it builds TrainPrograms)
      compile_step = lambda cand: TrainProgram(cand, mesh, replacement_vocab=replacement_vocab, specials=specials
                                              ).lower().compile()
      c, self.fit_choice, self.fit_compiled = memory.choose_fit(c, mesh, compile_step)
    self.config = c
    self.mesh = mesh
    self.rules = sharding.logical_rules(c.mesh)
    self.tx = optimizer.make_optimizer(c.train)
    self.schedule = optimizer.learning_rate_schedule(c.train)
    self.loss_fn = objectives.make_loss_fn(c, replacement_vocab, specials)
    self.grad_fn = objectives.make_grad_fn(c, replacement_vocab, specials)
    self.abstract = jax.eval_shape(lambda k: create_state(c, self.tx, k), jax.random.key(0))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = param_shardings(c, mesh, self.rules)
    opt = optax.tree_utils.tree_map_params(self.tx, lambda _, s: s, self.abstract.opt_state, params,
                                           transform_non_params=lambda _: replicated)
    self.shardings = TrainState(step=replicated, params=params, opt_state=opt)
    self.batch_sharding = sharding.batch_sharding(mesh)
    self._base_key = jax.random.key(c.train.seed)
    self.jitted_step = jax.jit(self._train_step, in_shardings=(self.shardings, self.batch_sharding),
                               out_shardings=(self.shardings, replicated), donate_argnums=(0,))
    self._jitted_check = jax.jit(self._loss_check, in_shardings=(self.shardings, self.batch_sharding),
                                 out_shardings=replicated)

  # -- What a step computes ---------------------------------------------------------------------

  def step_loss(self, params: Any, batch: Batch, step: Array, *, with_grads: bool = False):
    """Summed loss and LossStats of `params` on the step's micro-batches with the step's masks.

    With `with_grads`, ((loss_sum, stats), summed grads): micro-batches are a scan whose carry
    holds the grads, so only one micro-batch's activations are live at a time.
    """
    fn = self.grad_fn if with_grads else self.loss_fn
    step_key = jax.random.fold_in(jax.random.fold_in(self._base_key, 1), step)
    micro = lambda i, mb: fn(params, mb, jax.random.fold_in(step_key, i))
    accum = self.config.train.grad_accum
    if accum == 1:
      return micro(0, batch)
    # Micro-batch i takes rows [i * B/accum, (i + 1) * B/accum): [accum, B/accum, ...].
    mbs = jax.tree.map(lambda a: a.reshape((accum, a.shape[0] // accum) + a.shape[1:]), batch)
    first = jax.tree.map(lambda a: a[0], mbs)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(micro, 0, first))

    def body(carry, xs):
      return jax.tree.map(jnp.add, carry, micro(*xs)), None

    total, _ = jax.lax.scan(body, zeros, (jnp.arange(accum), mbs))
    return total

  def _train_step(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
    (loss_sum, stats), grads = self.step_loss(state.params, batch, state.step, with_grads=True)
    denom = jnp.maximum(stats.num_targets, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss_sum / denom,
        "accuracy": stats.num_correct / denom,
        "num_targets": stats.num_targets,
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": self.schedule(state.step),}
    # An objective's further summed statistics (the contrastive stage's cosines), as means per target.
    metrics.update({k: v / denom for k, v in stats._asdict().items() if k not in ("num_targets", "num_correct")})
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def _loss_check(self, state: TrainState, batch: Batch) -> Array:
    loss_sum, stats = self.step_loss(state.params, batch, state.step)
    return loss_sum / jnp.maximum(stats.num_targets, 1.0)

  # -- Running it ---------------------------------------------------------------------------------

  def _in_context(self, fn: Callable, *args):
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return fn(*args)

  def init_state(self) -> TrainState:
    """A fresh state initialised directly into its shardings: nothing is materialised unsharded."""
    create = jax.jit(lambda k: create_state(self.config, self.tx, k), out_shardings=self.shardings)
    return self._in_context(create, jax.random.key(self.config.train.seed))

  def step(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
    """(state, global batch) -> (new state, device metrics). The state is donated."""
    return self._in_context(self.jitted_step, state, batch)

  def check_loss(self, state: TrainState, batch: Batch) -> Array:
    """The loss the next train step will report for `state` on `batch`, without updating."""
    return self._in_context(self._jitted_check, state, batch)

  def global_batch(self, local_batch: dict[str, Any]) -> Batch:
    """This process's rows of a batch, as the global array the step takes."""
    return sharding.global_batch(local_batch, self.mesh)

  def shaped_inputs(self) -> tuple[TrainState, Batch]:
    """(state, batch) as sharded ShapeDtypeStructs of the step's arguments: nothing is allocated."""
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.abstract, self.shardings)
    batch = {
        k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=self.batch_sharding)
        for k, shape in objectives.batch_shapes(self.config).items()}
    return state, batch

  def lower(self, state: Any = None, batch: Any = None) -> jax.stages.Lowered:
    """The train step lowered for (state, batch): real arrays, or by default the shaped inputs."""
    if state is None or batch is None:
      state, batch = self.shaped_inputs()
    return self._in_context(self.jitted_step.lower, state, batch)

"""AdamW with warmup + cosine/linear/WSD decay, global-norm clipping, no decay on norms and biases."""

import jax
import jax.numpy as jnp
import optax

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections


def wsd_decay_start(steps: int, decay_fraction: float) -> int:
  """The first step count of a WSD run's decay: the last round(fraction * steps) steps decay.

  The sweep's planner forks its decay branches from the stable run at this step.
  """
  return steps - int(round(decay_fraction * steps))


def _wsd(t: sections.Train) -> optax.Schedule:
  """Warmup-stable-decay (Hägele et al. 2024): the peak until `wsd_decay_start`, then a decay whose
  last step (count steps - 1) runs at final_lr_ratio * peak.

  The decay's progress at count i is p = (i - start + 1) / decay_steps; the lr is
  end + (peak - end) * (1 - p) ("linear") or end + (peak - end) * (1 - sqrt(p)) ("1-sqrt").
  Up to the decay start the lr does not depend on train.steps, so runs of different lengths
  share their stable phase exactly.
  """
  peak, end = t.learning_rate, t.learning_rate * t.final_lr_ratio
  start = wsd_decay_start(t.steps, t.decay_fraction)
  decay_steps = max(1, t.steps - start)
  warmup_steps = max(1, t.warmup_steps)

  def schedule(count):
    count = jnp.asarray(count)
    p = jnp.clip((count - start + 1) / decay_steps, 0.0, 1.0)
    shape = 1.0 - (p if t.decay_shape == "linear" else jnp.sqrt(p))
    stable_or_decay = end + (peak - end) * shape
    return jnp.where(count < t.warmup_steps, peak * (count + 1) / warmup_steps, stable_or_decay)

  return schedule


def learning_rate_schedule(t: sections.Train) -> optax.Schedule:
  """Linear warmup to the peak, then cosine, linear or WSD decay to final_lr_ratio * peak.

  Step i < warmup_steps runs at peak * (i + 1) / warmup_steps: the first update already moves
  the params (a warmup from 0 would waste it) and the last warmup step reaches the peak. The lr
  of every step is a pure function of (step, config.train).
  """
  if t.decay == "wsd":
    return _wsd(t)
  peak, end = t.learning_rate, t.learning_rate * t.final_lr_ratio
  decay_steps = max(1, t.steps - t.warmup_steps)
  if t.decay == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=t.final_lr_ratio)
  else:
    decay = optax.linear_schedule(peak, end, decay_steps)
  warmup_steps = max(1, t.warmup_steps)
  warmup = lambda count: peak * (count + 1) / warmup_steps
  return optax.join_schedules([warmup, decay], [t.warmup_steps])


def run_schedule(c: plan_lib.RunPlan) -> optax.Schedule:
  """The lr of every step of the run across its phases (`core/phases.py`).

  Count i (step i + 1) runs at `learning_rate_schedule` of its phase's train config, evaluated at
  i over the whole run's train.steps: the schedule keys a phase sets shape its own steps only
  (its warmup_steps still count from the run's step 0). Without phases: `learning_rate_schedule`.
  Each phase's TrainProgram uses its phase's schedule, which equals this one on its steps.
  """
  phases = c.phases
  if len(phases) == 1:
    return learning_rate_schedule(phases[0].config.train)
  fns = [learning_rate_schedule(p.config.train) for p in phases]

  def schedule(count):
    count = jnp.asarray(count)
    index = sum((count >= p.end).astype(jnp.int32) for p in phases[:-1])
    return jnp.select([index == i for i in range(len(fns))], [f(count) for f in fns])

  return schedule


def decay_mask(params):
  """True for dense kernels and embedding tables; False for norm scales, biases and other vectors.

  Decided by the leaf's name, not its rank: scanned layers stack norm scales into matrices.
  """
  def is_decayed(path, _):
    return getattr(path[-1], "key", None) in ("kernel", "embedding")

  return jax.tree_util.tree_map_with_path(is_decayed, params)


def make_optimizer(t: sections.Train) -> optax.GradientTransformation:
  """The optimizer for `config.train`."""
  adamw = optax.adamw(learning_rate_schedule(t), b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay,
                      mask=decay_mask)
  if t.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(t.clip_norm), adamw)
  return adamw

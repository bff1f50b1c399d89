"""AdamW with warmup + cosine/linear decay, global-norm clipping, no decay on norms and biases."""

import jax
import ml_collections
import optax


def learning_rate_schedule(t: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to the peak, then cosine or linear decay to final_lr_ratio * peak.

  Step i < warmup_steps runs at peak * (i + 1) / warmup_steps: the first update already moves
  the params (a warmup from 0 would waste it) and the last warmup step reaches the peak.
  """
  peak, end = t.learning_rate, t.learning_rate * t.final_lr_ratio
  decay_steps = max(1, t.steps - t.warmup_steps)
  if t.decay == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=t.final_lr_ratio)
  else:
    decay = optax.linear_schedule(peak, end, decay_steps)
  warmup_steps = max(1, t.warmup_steps)
  warmup = lambda count: peak * (count + 1) / warmup_steps
  return optax.join_schedules([warmup, decay], [t.warmup_steps])


def decay_mask(params):
  """True for dense kernels and embedding tables; False for norm scales, biases and other vectors.

  Decided by the leaf's name, not its rank: scanned layers stack norm scales into matrices.
  """
  def is_decayed(path, _):
    return getattr(path[-1], "key", None) in ("kernel", "embedding")
  return jax.tree_util.tree_map_with_path(is_decayed, params)


def make_optimizer(t: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The optimizer for `config.train`."""
  adamw = optax.adamw(learning_rate_schedule(t), b1=t.b1, b2=t.b2, eps=t.eps,
                      weight_decay=t.weight_decay, mask=decay_mask)
  if t.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(t.clip_norm), adamw)
  return adamw

"""Analytic training FLOPs, parameter counts, per-device peak TFLOP/s and MFU.

Counting rules (the unit tests check them against a longhand count):
- A matmul of (M, K) by (K, N) costs 2 * M * N * K FLOPs (a multiply-add is 2 FLOPs).
- Only matmuls count: norms, softmax, activations, RoPE and embedding gathers are ignored.
- Attention is bidirectional, so scores and the weighted sum are full T x T (no causal halving).
- A training step costs 3x the forward matmuls (the backward pass is 2x the forward).

Each objective counts its own step (its `forward_flops`, training/objectives) from the encoder's
count here. Shape letters: T tokens in a sequence, d encoder width, I encoder GeGLU width, N
encoder layers.
"""

import math
from typing import Any

import jax
import numpy as np
from absl import logging
from flax.core import meta

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections
from crossbert_jax.training import objectives

# Dense (non-sparse) per-device peak TFLOP/s by a substring of `jax.Device.device_kind`.
# Lookup takes the longest matching substring (case-insensitive), so "H100 PCIe" beats "H100",
# "GH200" beats "H200" and "TPU v5 lite" beats "TPU v5"; the order here does not matter.
# "float32" is the rate float32 matmuls actually run at under JAX's default matmul precision:
# - TPU: the MXU runs DEFAULT-precision float32 dots as one bfloat16 pass, so float32 = bfloat16.
# - NVIDIA Ampere and later: XLA runs float32 dots on TF32 tensor cores, so float32 = dense TF32
#   (not the much lower non-tensor-core FP32 rate, e.g. 67 on H100 SXM).
# One JAX device is one chip, except TPU v2/v3 where it is one TensorCore (half a chip).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "TPU v2": {"bfloat16": 22.5, "float32": 22.5},  # 45 per chip, 2 cores.
    "TPU v3": {"bfloat16": 61.5, "float32": 61.5},  # 123 per chip, 2 cores.
    "TPU v4": {"bfloat16": 275.0, "float32": 275.0},
    "TPU v5 lite": {"bfloat16": 197.0, "float32": 197.0},  # v5e.
    "TPU v5e": {"bfloat16": 197.0, "float32": 197.0},
    "TPU v5": {"bfloat16": 459.0, "float32": 459.0},  # v5p reports "TPU v5".
    "TPU v5p": {"bfloat16": 459.0, "float32": 459.0},
    "TPU v6 lite": {"bfloat16": 918.0, "float32": 918.0},  # v6e / Trillium.
    "TPU v6e": {"bfloat16": 918.0, "float32": 918.0},
    "Trillium": {"bfloat16": 918.0, "float32": 918.0},
    "H100": {"bfloat16": 989.0, "float32": 494.0},  # SXM ("NVIDIA H100 80GB HBM3").
    "H100 PCIe": {"bfloat16": 756.0, "float32": 378.0},
    "H100 NVL": {"bfloat16": 835.0, "float32": 418.0},
    "H200": {"bfloat16": 989.0, "float32": 494.0},  # Same compute as H100 SXM.
    "GH200": {"bfloat16": 989.0, "float32": 494.0},
    "B200": {"bfloat16": 2250.0, "float32": 1100.0},
    "A100": {"bfloat16": 312.0, "float32": 156.0},  # SXM and PCIe.
    "L40S": {"bfloat16": 362.0, "float32": 183.0},
    "L4": {"bfloat16": 121.0, "float32": 60.0},}

_DTYPE_ALIASES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32"}
_warned_kinds: set[str] = set()


def encoder_forward_flops(model_cfg: sections.Model, tokens: int) -> float:
  """Forward matmul FLOPs of the encoder stack on one sequence of `tokens` tokens."""
  d, i, n, t = model_cfg.embed_dim, model_cfg.mlp_dim, model_cfg.num_layers, tokens
  # QKV d->3d, output d->d, GeGLU Wi d->2I and Wo I->d: 2 * T * (3d^2 + d^2 + 2dI + Id).
  projections = 2 * t * (3 * d * d + d * d + 2 * d * i + i * d)
  # Scores Q.K^T and the weighted sum A.V, 2 * T * T * d each. Local-attention layers count as
  # full T x T too: the implementation computes dense scores and masks them.
  attention = 4 * t * t * d
  return float(n * (projections + attention))


def forward_flops_breakdown(c: plan_lib.Settings) -> dict[str, float]:
  """Forward matmul FLOPs per sequence, split into encoder, reconstructor and head (the objective's count)."""
  return objectives.get(c.objective).forward_flops(c)


def train_flops_per_sequence(c: plan_lib.Settings) -> float:
  """Training (forward + backward) matmul FLOPs for one sequence."""
  return 3.0 * sum(forward_flops_breakdown(c).values())


def train_flops_per_step(c: plan_lib.Settings) -> float:
  """Training matmul FLOPs for one step on the global batch (all micro-batches, all devices)."""
  return c.train.batch_size * train_flops_per_sequence(c)


def _is_embedding(path: tuple[Any, ...]) -> bool:
  # flax nn.Embed names its table "embedding", so the token table (and any other nn.Embed)
  # always has "embedding" somewhere in its path.
  return any("embedding" in str(getattr(k, "key", getattr(k, "name", k))).lower() for k in path)


def param_counts(params: Any) -> dict[str, int]:
  """Total and non-embedding parameter counts of a param pytree (arrays or ShapeDtypeStructs).

  A leaf is an embedding iff some key on its path contains "embedding" (case-insensitive), which
  covers flax nn.Embed tables such as the token embedding. An untied output head is a plain Dense
  kernel and counts as non-embedding.
  """
  # Unbox nn.Partitioned / nn.LogicallyPartitioned so the box's "value" field is not on the path.
  leaves = jax.tree_util.tree_flatten_with_path(meta.unbox(params))[0]
  total = embedding = 0
  for path, leaf in leaves:
    size = math.prod(np.shape(leaf))
    total += size
    if _is_embedding(path):
      embedding += size
  return {"total": total, "non_embedding": total - embedding}


def peak_tflops_per_device(device: jax.Device, dtype: str, cpu_peak_tflops: float) -> float | None:
  """Dense peak TFLOP/s of `device` at compute `dtype`; None (warned once) for unknown kinds."""
  if dtype not in _DTYPE_ALIASES:
    raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPE_ALIASES)}")
  if device.platform == "cpu":
    # No vendor number exists for CPUs; the config's metrics.cpu_peak_tflops stands in.
    return float(cpu_peak_tflops)
  kind = device.device_kind
  matches = [s for s in PEAK_TFLOPS if s.lower() in kind.lower()]
  if not matches:
    if kind not in _warned_kinds:
      _warned_kinds.add(kind)
      logging.warning(
          "No peak TFLOP/s known for device kind %r: MFU is not reported. "
          "Add it to crossbert_jax.flops.PEAK_TFLOPS.", kind)
    return None
  return PEAK_TFLOPS[max(matches, key=len)][_DTYPE_ALIASES[dtype]]


def mfu(flops_per_step: float, step_seconds: float, num_devices: int, peak_tflops: float | None) -> float:
  """Model FLOPs utilisation in [0, 1]; NaN when the peak is unknown or the step time is not positive."""
  if peak_tflops is None or not step_seconds > 0 or num_devices < 1:
    return float("nan")
  return flops_per_step / step_seconds / (num_devices * peak_tflops * 1e12)


def achieved_tflops_per_device(flops_per_step: float, step_seconds: float, num_devices: int) -> float:
  """Achieved model TFLOP/s per device; NaN when the step time is not positive."""
  if not step_seconds > 0 or num_devices < 1:
    return float("nan")
  return flops_per_step / step_seconds / num_devices / 1e12

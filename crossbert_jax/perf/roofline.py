"""A roofline estimate of one train step from its compiled program: the step time each of compute,
HBM traffic and chip-to-chip communication alone would need on a given chip, which one binds, and
the MFU that bound allows.

It is an upper bound on performance, not a measurement: each resource is assumed to run at its
peak and all three to overlap perfectly. The inputs are per device: the model FLOPs (the exact
analytic count, `flops.py`), the bytes accessed and the collective bytes read from the optimized
HLO with every loop counted as many times as it runs (`hlo_costs.py`).

The chip table gives each chip's peak dense bf16 FLOP/s, HBM bandwidth and inter-chip bandwidth (one
direction, all of a chip's links together: the ICI of a TPU, NVLink of a GPU in an 8-GPU node),
from the vendors' published specifications (`Chip.source`). Collectives are charged at that
bandwidth whatever mesh axis they run over, which is optimistic for an axis laid along fewer links.
"""

from typing import Any, NamedTuple


class Chip(NamedTuple):
  name: str
  peak_flops: float  # Dense bf16 FLOP/s.
  hbm_bytes_per_s: float
  link_bytes_per_s: float  # Chip-to-chip, one direction, all links.
  source: str


_CLOUD_TPU = "https://cloud.google.com/tpu/docs/"
CHIPS: dict[str, Chip] = {
    # v4: 6 ICI links x 45 GB/s one way (the JAX scaling book's TPU table; ISCA 2023 TPU v4 paper).
    "v4": Chip("TPU v4", 275e12, 1.2e12, 6 * 45e9, _CLOUD_TPU + "v4; jax-ml.github.io/scaling-book/tpus"),
    # v5e: ICI 1,600 Gbps per chip.
    "v5e": Chip("TPU v5e", 197e12, 819e9, 1600e9 / 8, _CLOUD_TPU + "v5e"),
    # v5p: bidirectional ICI 1,200 GB/s per chip, half of it one way.
    "v5p": Chip("TPU v5p", 459e12, 2765e9, 1200e9 / 2, _CLOUD_TPU + "v5p"),
    # v6e (Trillium): ICI 3,584 Gbps per chip.
    "v6e": Chip("TPU v6e", 918e12, 1640e9, 3584e9 / 8, _CLOUD_TPU + "v6e"),
    # NVLink 4: 900 GB/s bidirectional per GPU.
    "h100": Chip("NVIDIA H100 SXM", 989e12, 3.35e12, 900e9 / 2,
                 "https://www.nvidia.com/en-us/data-center/h100/ (datasheet, dense bf16)"),
    "h200": Chip("NVIDIA H200 SXM", 989e12, 4.8e12, 900e9 / 2,
                 "https://www.nvidia.com/en-us/data-center/h200/ (datasheet, dense bf16)"),}
# Substrings of a JAX device_kind (lower case) or a topology's generation -> the table's key.
_KINDS = (("v5 lite", "v5e"), ("v5litepod", "v5e"), ("v5e", "v5e"), ("v5p", "v5p"), ("tpu v5", "v5p"),
          ("v6 lite", "v6e"), ("v6e", "v6e"), ("tpu v4", "v4"), ("v4", "v4"), ("h200", "h200"), ("h100", "h100"))


def chip_for(kind: str) -> Chip | None:
  """The table's chip for a device_kind ("TPU v5", "NVIDIA H200") or a generation ("v5p"); None if unknown."""
  kind = kind.lower()
  if kind in CHIPS:
    return CHIPS[kind]
  return next((CHIPS[key] for needle, key in _KINDS if needle in kind), None)


def custom_chip(name: str, peak_flops: float, hbm_bytes_per_s: float, link_bytes_per_s: float = 0.0) -> Chip:
  """A chip from measured figures (this CPU's matmul FLOP/s and memory bandwidth, say)."""
  return Chip(name, peak_flops, hbm_bytes_per_s, link_bytes_per_s, "measured")


def estimate(chip: Chip, executed_flops: float, model_flops: float, bytes_per_device: float,
             collective_bytes_per_device: float) -> dict[str, Any]:
  """The three bound step times (seconds), the binding one, and the MFU it allows; all per device.

  executed_flops: what the chip computes (rematerialized forwards included) sets the compute bound;
  model_flops (6ND-style, no recomputation) is what MFU counts.
  """
  bounds = {
      "compute_s": executed_flops / chip.peak_flops,
      "memory_s": bytes_per_device / chip.hbm_bytes_per_s,
      "communication_s": (collective_bytes_per_device / chip.link_bytes_per_s if chip.link_bytes_per_s else
                          (0.0 if not collective_bytes_per_device else float("inf"))),}
  binding = max(bounds, key=bounds.get)
  step_s = bounds[binding]
  return {
      "chip": chip.name,
      "chip_source": chip.source,
      "peak_flops": chip.peak_flops,
      "hbm_bytes_per_s": chip.hbm_bytes_per_s,
      "link_bytes_per_s": chip.link_bytes_per_s,
      "executed_flops_per_device": executed_flops,
      "model_flops_per_device": model_flops,
      "bytes_accessed_per_device": bytes_per_device,
      "collective_bytes_per_device": collective_bytes_per_device,
      "arithmetic_intensity": executed_flops / bytes_per_device if bytes_per_device else None,
      **bounds,
      "bound_by": binding.removesuffix("_s"),
      "step_s_lower_bound": step_s,
      "mfu_upper_bound": model_flops / (step_s * chip.peak_flops) if step_s > 0 else None,
      "note": "upper bound on performance (each resource at its peak, perfect overlap), not a measurement",}


def format_lines(r: dict[str, Any]) -> list[str]:
  """The estimate as report lines."""
  ms = {k: 1e3 * r[f"{k}_s"] for k in ("compute", "memory", "communication")}
  return [
      f"roofline on {r['chip']} ({r['peak_flops'] / 1e12:.3g} TFLOP/s, memory {r['hbm_bytes_per_s'] / 1e9:.3g} GB/s, "
      f"links {r['link_bytes_per_s'] / 1e9:.3g} GB/s) -- an upper bound, not a measurement:",
      f"  compute        {ms['compute']:10.3f} ms   ({r['executed_flops_per_device']:.3e} FLOPs executed per device; "
      f"the model's {r['model_flops_per_device']:.3e})",
      f"  memory         {ms['memory']:10.3f} ms   ({r['bytes_accessed_per_device'] / 1e9:.3f} GB accessed per device, "
      "loops counted per trip)",
      f"  communication  {ms['communication']:10.3f} ms   ({r['collective_bytes_per_device'] / 1e9:.3f} GB sent per device)",
      f"  bound by {r['bound_by']}: step >= {1e3 * r['step_s_lower_bound']:.3f} ms, MFU <= " +
      ("n/a" if r["mfu_upper_bound"] is None else f"{100 * r['mfu_upper_bound']:.1f}%"),]

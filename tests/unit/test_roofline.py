"""The roofline estimate: HLO costs counted per loop trip, collectives by mesh axis, the bounds."""

import jax
import jax.numpy as jnp
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.perf import aot, hlo_costs, roofline
from crossbert_jax.training import flops


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  return cost[0] if isinstance(cost, (list, tuple)) else cost


def test_a_scanned_loop_costs_what_its_unrolled_twin_costs():
  """XLA's cost analysis counts a while body once; hlo_costs counts it per trip."""
  def scanned(x, w):
    return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0]

  def unrolled(x, w):
    for i in range(w.shape[0]):
      x = jnp.tanh(x @ w[i])
    return x

  x, w = jnp.ones((128, 256)), jnp.ones((10, 256, 256))
  loop, flat = (jax.jit(f).lower(x, w).compile() for f in (scanned, unrolled))
  ours_loop, ours_flat = (hlo_costs.costs(c.as_text(), {"data": 1}) for c in (loop, flat))
  assert ours_flat["bytes_accessed"] == _cost(flat)["bytes accessed"]  # The same model as XLA's, without loops.
  assert _cost(loop)["bytes accessed"] < 0.2 * _cost(flat)["bytes accessed"]  # XLA: the body once.
  # Per trip, a layer's weights are read a slice at a time (not the stacked array each trip).
  assert ours_loop["bytes_accessed"] == pytest.approx(ours_flat["bytes_accessed"], rel=0.05)
  assert ours_loop["dot_flops"] == ours_flat["dot_flops"] == 2 * 128 * 256 * 256 * 10
  assert ours_loop["loops"] == [(10, ours_loop["loops"][0][1])] and ours_loop["unknown_trip_counts"] == 0


def test_replica_groups_in_each_form_name_the_mesh_axes():
  mesh = {"data": 2, "fsdp": 4}
  assert hlo_costs._groups("replica_groups={{0,1,2,3},{4,5,6,7}}") == [[0, 1, 2, 3], [4, 5, 6, 7]]
  iota = hlo_costs._groups("replica_groups=[4,2]<=[2,4]T(1,0)")
  assert iota[0] == [0, 4] and hlo_costs._axes(iota[0], mesh) == "data"
  meshed = hlo_costs._groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}")
  assert meshed[0] == [0, 1, 2, 3] and hlo_costs._axes(meshed[0], mesh) == "fsdp"
  both = hlo_costs._groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}")
  assert hlo_costs._axes(both[0], mesh) == "data+fsdp"
  assert hlo_costs._sent_bytes("all-gather", 100, 4) == 300
  assert hlo_costs._sent_bytes("all-reduce", 100, 4) == 150
  assert hlo_costs._sent_bytes("reduce-scatter", 100, 4) == 75


def test_the_fsdp_step_gathers_its_params_and_reduces_its_gradients_over_fsdp():
  c = config_lib.get_config("crossbert", "tiny").unlock()
  report = aot.compile_train_step(plan_lib.build(c), chip="v5p")  # 8 CPU devices: fsdp=8.
  traffic = report["traffic"]
  params = 4 * report["params"]["total"]  # float32 bytes.
  gathered = sum(traffic["collectives"]["all-gather"].values())
  assert set(traffic["collectives"]["all-gather"]) == {"fsdp"}
  # Every fsdp-sharded param (all but a few small replicated vectors) gathered once, a ring of 8.
  assert 0.99 * 7 / 8 * params <= gathered <= 1.2 * 7 / 8 * params
  reduced = sum(sum(traffic["collectives"].get(op, {}).values()) for op in ("all-reduce", "reduce-scatter"))
  assert reduced >= 7 / 8 * params  # Every gradient reduced over fsdp.
  assert report["flops"]["executed_matmul_per_device"] == pytest.approx(flops.train_flops_per_step(c) / 8)
  r = report["roofline"]
  assert r["chip"] == "TPU v5p" and r["bound_by"] in ("compute", "memory", "communication")
  assert r["step_s_lower_bound"] == max(r["compute_s"], r["memory_s"], r["communication_s"])
  text = aot.format_report(report, params=False)
  assert "an upper bound, not a measurement" in text and f"bound by {r['bound_by']}" in text


def test_estimate_arithmetic_and_chip_lookup():
  chip = roofline.CHIPS["v5p"]
  r = roofline.estimate(chip, executed_flops=2 * 459e12, model_flops=459e12, bytes_per_device=2765e9,
                        collective_bytes_per_device=600e9)
  assert (r["compute_s"], r["memory_s"], r["communication_s"]) == pytest.approx((2.0, 1.0, 1.0))
  assert r["bound_by"] == "compute" and r["mfu_upper_bound"] == pytest.approx(0.5)  # Remat halves MFU.
  assert roofline.chip_for("TPU v5 lite") is roofline.CHIPS["v5e"]
  assert roofline.chip_for("TPU v5") is roofline.CHIPS["v5p"]
  assert roofline.chip_for("NVIDIA H200") is roofline.CHIPS["h200"]
  assert roofline.chip_for("cpu") is None
  with pytest.raises(UserError, match="--chip=v9: use one of"):
    aot.target_chip("", jax.devices()[0], "v9")

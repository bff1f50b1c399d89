"""A device's memory, what a compiled train step needs of it, and `model.remat="auto"`'s choice.

`auto` compiles the train step with the least recomputation first ("none", then "dots", then
"full") and keeps the first whose compiled program (`memory_analysis()`: arguments + outputs not
aliased onto them + temporaries + code) fits the budget: `model.memory_budget_gib` when set, else
the device's memory (the runtime's `bytes_limit`, else the HBM_GIB table). It says what it chose
in one line. With no budget known (a CPU, an unknown chip) it chooses "none". Nothing fits: "full",
and the line says by how much it is over (the compile command's check then names the fixes).
"""

from typing import Any, Callable

import jax

from crossbert_jax.core import plan as plan_lib

GIB = 1024 ** 3

# Memory per JAX device, GiB, by a substring of `device_kind` (longest match wins, as in
# flops.PEAK_TFLOPS). Vendor capacities; XLA keeps a little of it for itself. One JAX device
# is one chip, except TPU v2/v3 where it is one TensorCore (half a chip's HBM).
HBM_GIB: dict[str, float] = {
    "TPU v2": 8.0,
    "TPU v3": 16.0,
    "TPU v4": 32.0,
    "TPU v5 lite": 16.0,  # v5e.
    "TPU v5e": 16.0,
    "TPU v5": 95.0,  # v5p reports "TPU v5".
    "TPU v5p": 95.0,
    "TPU v6 lite": 32.0,  # v6e / Trillium.
    "TPU v6e": 32.0,
    "A100": 40.0,
    "A100-SXM4-80GB": 80.0,
    "A100 80GB": 80.0,
    "H100": 80.0,
    "H100 NVL": 94.0,
    "H200": 141.0,
    "GH200": 96.0,
    "B200": 180.0,
    "L40S": 48.0,
    "L4": 24.0,}


def hbm_bytes(device: jax.Device) -> int | None:
  """Per-device memory: the runtime's limit for a local accelerator, else the HBM_GIB table."""
  if device.platform == "cpu":
    return None
  try:
    limit = (device.memory_stats() or {}).get("bytes_limit")
  except Exception:  # noqa: BLE001 - compile-only topology devices have no memory stats.
    limit = None
  if limit:
    return int(limit)
  matches = [k for k in HBM_GIB if k.lower() in device.device_kind.lower()]
  return int(HBM_GIB[max(matches, key=len)] * GIB) if matches else None


def compiled_memory(compiled) -> dict[str, int]:
  """The compiled program's memory per device (`memory_analysis()`), and `total_bytes`: what is live at once."""
  m = compiled.memory_analysis()
  out = {
      "argument_bytes": int(m.argument_size_in_bytes),
      "output_bytes": int(m.output_size_in_bytes),
      "alias_bytes": int(m.alias_size_in_bytes),  # Outputs written into donated arguments (the state).
      "temp_bytes": int(m.temp_size_in_bytes),
      "generated_code_bytes": int(m.generated_code_size_in_bytes),}
  # Live at once: arguments, outputs not aliased onto them, temporaries and the program itself.
  out["total_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"] +
                        out["generated_code_bytes"])
  return out


# Least recomputation first: the first that fits wins.
REMAT_ORDER = ("none", "dots", "full")


def budget_bytes(c: plan_lib.Settings, device: jax.Device) -> int | None:
  """remat=auto's memory budget per device: model.memory_budget_gib, else the device's memory."""
  if c.model.memory_budget_gib > 0:
    return int(c.model.memory_budget_gib * GIB)
  return hbm_bytes(device)


def choose_remat(c: plan_lib.Settings, mesh: jax.sharding.Mesh, compile_step: Callable[[plan_lib.Settings], Any],
                 say: Callable[[str], None] = print) -> tuple[plan_lib.Settings, list[dict[str, Any]]]:
  """`c` with model.remat="auto" replaced by the least recomputation whose compiled step fits, and
  the tried rows ({remat, total_bytes}); `compile_step(config)` returns the compiled train step."""
  budget = budget_bytes(c, mesh.devices.flat[0])
  rows = []
  for mode in REMAT_ORDER:
    candidate = plan_lib.with_keys(c, {"model.remat": mode})
    total = compiled_memory(compile_step(candidate))["total_bytes"]
    rows.append({"remat": mode, "total_bytes": total})
    if budget is None or total <= budget:
      break
  chosen = rows[-1]
  tried = ", ".join(f"{r['remat']} {r['total_bytes'] / GIB:.3f} GiB" for r in rows)
  where = f"{mesh.devices.flat[0].device_kind}"
  if budget is None:
    say(f"model.remat=auto: chose {chosen['remat']} (no memory size known for {where}: set "
        f"model.memory_budget_gib to choose by a budget; compiled step {tried})")
  else:
    fits = "fits" if chosen["total_bytes"] <= budget else "DOES NOT FIT even so"
    say(f"model.remat=auto: chose {chosen['remat']}, {fits} in {budget / GIB:.3f} GiB per device ({where}); "
        f"compiled step: {tried}")
  return plan_lib.with_keys(c, {"model.remat": chosen["remat"]}), rows

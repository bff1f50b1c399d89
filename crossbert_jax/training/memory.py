"""A device's memory, what a compiled train step needs of it, and the choices of `model.remat="auto"`
and `train.grad_accum=0` ("auto").

Both compile the train step and keep the first candidate whose compiled program (`memory_analysis()`:
arguments + outputs not aliased onto them + temporaries + code) fits the budget: `model.memory_budget_gib`
when set, else the device's memory (the runtime's `bytes_limit`, else the HBM_GIB table). remat: the
least recomputation first ("none", then "dots", then "full"). grad_accum: the fewest micro-batches
first (the largest micro-batch per device), bisecting the batch's divisors. Each says what it chose in
one line. With no budget known (a CPU, an unknown chip) they choose "none" and one micro-batch.
Nothing fits: the most frugal, and the line says by how much it is over (the compile command's check
then names the fixes).
"""

import time
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
  """The auto choices' memory budget per device: model.memory_budget_gib, else the device's memory."""
  if c.model.memory_budget_gib > 0:
    return int(c.model.memory_budget_gib * GIB)
  return hbm_bytes(device)


def accum_candidates(batch_size: int, shards: int) -> list[int]:
  """train.grad_accum=0's candidates, fewest micro-batches (largest micro-batch) first: the divisors
  of batch_size whose micro-batch still splits over the mesh's data*fsdp shards."""
  return [a for a in range(1, batch_size + 1) if batch_size % a == 0 and (batch_size // a) % shards == 0]


def _fewest_that_fit(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
  """The first candidate that fits, memory falling along the list: the first (the common case, one
  compile), else the last (none fits: None), else a bisection between them."""
  if fits(candidates[0]):
    return candidates[0]
  if len(candidates) == 1 or not fits(candidates[-1]):
    return None
  lo, hi = 0, len(candidates) - 1  # candidates[lo] does not fit, candidates[hi] does.
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if fits(candidates[mid]):
      hi = mid
    else:
      lo = mid
  return candidates[hi]


def choose_fit(c: plan_lib.Settings, mesh: jax.sharding.Mesh, compile_step: Callable[[plan_lib.Settings], Any],
               say: Callable[[str], None] = print) -> tuple[plan_lib.Settings, list[dict[str, Any]], Any]:
  """`c` with model.remat="auto" and train.grad_accum=0 ("auto") resolved by compiling the train step,
  the compiled candidates ({remat, grad_accum, total_bytes, compile_seconds}) and (the chosen one's
  compiled step, its compile seconds), so its callers need not compile it again (None when nothing
  fits); `compile_step(config)` compiles it.

  remat=auto: the least recomputation whose step fits. grad_accum=0: the fewest micro-batches (the
  largest micro-batch per device) that fit. Both: the least recomputation at which some micro-batch
  fits, and at it the fewest micro-batches (recomputing costs every step a third more FLOPs; a
  smaller micro-batch costs less). With no budget known (a CPU) the first candidate: none, one
  micro-batch. Nothing fits: the most frugal (full, the most micro-batches), and the line says so.
  """
  budget = budget_bytes(c, mesh.devices.flat[0])
  remats = REMAT_ORDER if c.model.remat == "auto" else (c.model.remat,)
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  accums = accum_candidates(c.train.batch_size, shards) if c.train.grad_accum == 0 else [c.train.grad_accum]
  rows: list[dict[str, Any]] = []
  # The last candidate that fits, (compiled step, seconds): the chosen one, when one fits.
  compiled: dict[tuple[str, int], tuple[Any, float]] = {}

  def fits(remat: str, accum: int) -> bool:
    candidate = plan_lib.with_keys(c, {"model.remat": remat, "train.grad_accum": accum})
    t0 = time.perf_counter()
    try:
      step = compile_step(candidate)
    except Exception as e:  # noqa: BLE001 - XLA may refuse a program over the chip's memory as it compiles.
      if not is_out_of_memory(e):
        raise
      rows.append({
          "remat": remat, "grad_accum": accum, "total_bytes": None, "compile_seconds": time.perf_counter() - t0})
      return False
    seconds, total = time.perf_counter() - t0, compiled_memory(step)["total_bytes"]
    rows.append({"remat": remat, "grad_accum": accum, "total_bytes": total, "compile_seconds": seconds})
    ok = budget is None or total <= budget
    if ok:
      compiled.clear()
      compiled[(remat, accum)] = (step, seconds)
    return ok

  chosen = None
  for remat in remats:
    accum = _fewest_that_fit(accums, lambda a, r=remat: fits(r, a))
    if accum is not None:
      chosen = (remat, accum)
      break
  over = chosen is None
  if over:
    chosen = (remats[-1], accums[-1])
  total = next(r["total_bytes"] for r in reversed(rows) if (r["remat"], r["grad_accum"]) == chosen)
  say(_choice_line(c, chosen, total, budget, over, rows, mesh, c.train.batch_size))
  return plan_lib.with_keys(c, {"model.remat": chosen[0], "train.grad_accum": chosen[1]}), rows, compiled.get(chosen)


def is_out_of_memory(e: Exception) -> bool:
  """Whether XLA refused a program for the device's memory (it reports that as a runtime error)."""
  message = str(e)
  return "RESOURCE_EXHAUSTED" in message or "out of memory" in message.lower()


def _gib_or_oom(total: int | None) -> str:
  return "out of memory in XLA's compile" if total is None else f"{total / GIB:.3f} GiB"


def _choice_line(c: plan_lib.Settings, chosen: tuple[str, int], total: int | None, budget: int | None, over: bool,
                 rows: list[dict[str, Any]], mesh: jax.sharding.Mesh, batch_size: int) -> str:
  """One line: what the auto keys chose, whether it fits, and every compiled candidate."""
  keys = []
  if c.model.remat == "auto":
    keys.append(("model.remat=auto", chosen[0]))
  if c.train.grad_accum == 0:
    micro = batch_size // chosen[1] / (mesh.shape["data"] * mesh.shape["fsdp"])
    keys.append(("train.grad_accum=0 (auto)", f"{chosen[1]} ({micro:g} sequences per device a micro-batch)"))
  what = "; ".join(f"{k}: chose {v}" for k, v in keys)
  tried = ", ".join(f"{r['remat']}/{r['grad_accum']} {_gib_or_oom(r['total_bytes'])}" for r in rows)
  where = mesh.devices.flat[0].device_kind
  if budget is None:
    return (f"{what} (no memory size known for {where}: set model.memory_budget_gib to choose by a budget; "
            f"compiled step (remat/grad_accum): {tried})")
  fit = f"DOES NOT FIT even so ({_gib_or_oom(total)})" if over else "fits"
  return (f"{what}; {fit} in {budget / GIB:.3f} GiB per device ({where}); compiled step (remat/grad_accum): {tried}")

"""Ahead-of-time compile of the real train step for a TPU topology or the local devices.

The MaxText `train_compile.py` pattern: the state and the batch exist only as sharded
`jax.ShapeDtypeStruct`s (`TrainProgram.shaped_inputs`, the trainer's own program), the mesh is built
over the topology's compile-only devices (`jax.experimental.topologies`, needs libtpu but no
TPU), and `lower().compile()` runs the same SPMD partitioner and memory planner as the pod.
What fails on the pod fails here: out of memory, a mesh that does not divide the chips, a
batch that does not shard. The command is `crossbert_jax.compile`.

Each compiled step also gets a roofline estimate (`roofline.py`) on the target chip: the topology's
generation, the local device's kind, or `chip` (a table key, or a `roofline.Chip` measured here).

A config with phases (`core/phases.py`) compiles every phase's step (one compile per distinct
batch x length; the phases of one shape share it): the report is that of the phase needing the
most memory, plus `phases`, one row per phase. A phase that does not fit (the 8,192-token
context extension, typically) is a row marked so, and `check_fits` names it.
"""

import math
import os
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import topologies

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.perf import hlo_costs, roofline
from crossbert_jax.training import flops, objectives, program as program_lib, sharding
from crossbert_jax.training import memory as memory_lib
from crossbert_jax.training.memory import GIB, HBM_GIB, hbm_bytes  # noqa: F401 - re-exported (tests, tools).

# TPU generation (the topology name's prefix) -> chip config: v4 and v5p run both TensorCores
# of a chip as one device ("megacore"), which is what a pod slice gives JAX.
_CHIP_CONFIG = {"v4": "megacore", "v5p": "megacore", "v5": "megacore"}
# The generations libtpu (0.0.42) compiles a topology for; "v5" is v5p's other name.
TPU_GENERATIONS = ("v2", "v3", "v4", "v5e", "v5p", "v5", "v6e", "tpu7x")


def topology_devices(topology: str) -> list[jax.Device]:
  """The compile-only devices of a TPU topology such as "v5p:4x4x8" (one per chip); needs libtpu."""
  generation, _, shape = topology.partition(":")
  if not generation or not shape:
    raise UserError(f"--topology={topology!r}: use GENERATION:SHAPE, e.g. v5p:4x4x8 (v5p-256) or v5e:4x4")
  if generation not in TPU_GENERATIONS:  # Before libtpu: its absence would hide the typo.
    raise UserError(f"--topology={topology}: unknown TPU generation {generation!r}; use one of "
                    f"{', '.join(TPU_GENERATIONS)}, e.g. v5p:4x4x8 (v5p-256) or v5e:4x4")
  kwargs = {"chip_config_name": _CHIP_CONFIG[generation]} if generation in _CHIP_CONFIG else {}
  # Compile-only devices touch no TPU, so several compiles (and tests) may load libtpu at once;
  # without this, libtpu's /tmp lockfile lets only one process in.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  _quiet_libtpu()
  try:
    return list(topologies.get_topology_desc(topology, "tpu", **kwargs).devices)
  except Exception as e:  # noqa: BLE001 - libtpu missing or a name it rejects: both are one line.
    detail = " ".join(str(e).split())[:200]
    if "support not installed" in detail:  # jax's message when libtpu is absent.
      raise UserError(f"--topology={topology}: libtpu is not installed ({detail}); run `make setup-tpu` "
                      "and use .venv-tpu/bin/python, or drop --topology to compile for the local devices") from None
    raise UserError(f"--topology={topology}: {detail}; use e.g. v5p:4x4x8, v5p:2x2x2, v5e:4x4, v4:2x2x2") from None


def _quiet_libtpu() -> None:
  """Silences libtpu's start-up on a process that uses no TPU of its own (JAX_PLATFORMS without tpu).

  Loaded for compile-only devices, libtpu still sets itself up as a pod worker: it asks the GCE
  metadata server for the accelerator type and the workers' hostnames, gets none, and prints a
  "Failed to find host bounds" line and an `E0000 ... unexpected worker hostname` error with a
  source trace, which read like a crash. Naming this process a one-host slice (libtpu's own
  variables, set before it loads; a caller's values stay) skips both; the topology's devices, and
  so the compile, are the same (checked for v4, v5e, v5p and v6e topologies).
  """
  platforms = jax.config.jax_platforms or ""
  if platforms and "tpu" not in platforms.split(","):
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")


def make_mesh(c: plan_lib.Settings, devices: list[jax.Device] | None) -> jax.sharding.Mesh:
  """The config's mesh over the topology's devices, or over the local ones (as the trainer)."""
  if devices is None:
    return sharding.make_mesh(c.mesh)
  return sharding.make_topology_mesh(c.mesh, devices)


def param_table(c: plan_lib.Settings, params, shardings) -> list[dict[str, Any]]:
  """One row per param: path, shape, logical axes, mesh PartitionSpec, per-device shard shape."""
  boxed = jax.eval_shape(lambda k: objectives.init_params(c, k), jax.random.key(0))
  logical = nn.get_partition_spec(boxed)
  rows = []
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  specs = jax.tree.leaves(logical, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  for (path, leaf), names, shard in zip(flat, specs, jax.tree.leaves(shardings), strict=True):
    rows.append({
        "path": "/".join(str(getattr(k, "key", k)) for k in path), "shape": list(leaf.shape), "dtype": str(leaf.dtype),
        "logical": list(names) + [None] * (leaf.ndim - len(names)),
        "spec": list(shard.spec) + [None] * (leaf.ndim - len(shard.spec)),
        "shard_shape": list(shard.shard_shape(leaf.shape))})
  return rows


def _xla_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001 - not every backend implements cost analysis.
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  value = (cost or {}).get("flops")
  return float(value) if value is not None and value >= 0 else None


def _hints(c: plan_lib.Settings) -> str:
  """What to change when a step does not fit, in the order that costs the least throughput."""
  tips = []
  if c.model.dtype != "bfloat16":
    tips.append("--config.model.dtype=bfloat16")
  if c.model.remat != "full":
    tips.append("--config.model.remat=full")
  if not c.model.scan_layers:
    tips.append("--config.model.scan_layers=True")
  tips.append(f"--config.train.grad_accum={2 * c.train.grad_accum}" if c.train.grad_accum else
              "more devices or a shorter data.seq_len (grad_accum=0 tried down to one sequence per device)")
  return ", ".join(tips)


def target_chip(topology: str, device: jax.Device, chip: str | roofline.Chip = "") -> roofline.Chip | None:
  """The chip the roofline is for: `chip` (a roofline.CHIPS key or a Chip), else the topology's
  generation, else the device's kind; None when the table has no figures for it."""
  if isinstance(chip, roofline.Chip):
    return chip
  if chip:
    if chip not in roofline.CHIPS:
      raise UserError(f"--chip={chip}: use one of {sorted(roofline.CHIPS)} or 'measured' (this machine)")
    return roofline.CHIPS[chip]
  return roofline.chip_for(topology.partition(":")[0] if topology else device.device_kind)


def compile_train_step(c: plan_lib.RunPlan, topology: str = "", chip: str | roofline.Chip = "",
                       log: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
  """Lowers and compiles the real train step (every phase's); the report. UserError when it cannot run there.
  `log`: a progress line before each slow stage (lowering, compiling: minutes at pod scale)."""
  devices = topology_devices(topology) if topology else None
  mesh = make_mesh(c, devices)
  target = target_chip(topology, mesh.devices.flat[0], chip)
  if not phases_lib.has_phases(c):
    return _compile_one(c, mesh, topology, target, log=log)
  phases = list(c.phases)
  # Every phase's batch shards on the mesh: checked before the first (slow) compile.
  phases_lib.check_each(phases,
                        lambda p: sharding.check_batch_divisible(p.config.train.batch_size, c.train.grad_accum, mesh))
  by_shape: dict[tuple[int, int], dict[str, Any]] = {}
  rows = []
  for phase in phases:
    pc = phase.config
    shape = (pc.train.batch_size, pc.data.seq_len)
    if shape not in by_shape:
      try:
        log(f"compile: {phase.describe()}")
        by_shape[shape] = _compile_one(pc, mesh, topology, target, log=log)
      except UserError as e:
        if "does not fit" not in str(e):
          raise UserError(f"{e} (in {phase.describe()})") from None
        by_shape[shape] = {"error": str(e)}
    one = by_shape[shape]
    m, bound = one.get("memory", {}), one.get("roofline") or {}
    rows.append({
        "phase": phase.index, "first_step": phase.start + 1, "last_step": phase.end, "batch_size": shape[0],
        "seq_len": shape[1], "total_bytes": m.get("total_bytes"), "temp_bytes": m.get("temp_bytes"),
        "fits": m.get("fits", False if "error" in one else None),
        "analytic_flops_per_device": one.get("flops", {}).get("analytic_per_device"),
        "compile_seconds": one.get("compile_seconds"), "error": one.get("error"), "bound_by": bound.get("bound_by"),
        "step_s_lower_bound": bound.get("step_s_lower_bound"), "mfu_upper_bound": bound.get("mfu_upper_bound")})
  compiled = [r for r in by_shape.values() if "error" not in r]
  if not compiled:
    raise UserError(next(iter(by_shape.values()))["error"] + " (every phase)")
  report = max(compiled, key=lambda r: r["memory"]["total_bytes"])
  return {**report, "phases": rows}


def _compile_one(c: plan_lib.Settings, mesh: jax.sharding.Mesh, topology: str, chip: roofline.Chip | None,
                 log: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
  """The report of one (single-phase) config's train step on `mesh`."""
  sharding.check_batch_divisible(c.train.batch_size, c.train.grad_accum, mesh)
  train_program = program_lib.TrainProgram(c, mesh)
  c = train_program.config  # remat=auto and grad_accum=0 resolved.
  state, batch = train_program.shaped_inputs()
  device = mesh.devices.flat[0]
  where = topology or f"{mesh.size} local {device.platform} device(s)"

  log(f"compile: lowering the train step (batch {c.train.batch_size} x L={c.data.seq_len}) for {where}")
  t0 = time.perf_counter()
  lowered = train_program.lower(state, batch)
  t1 = time.perf_counter()
  if chosen := train_program.fit_compiled:  # remat=auto / grad_accum=0 compiled it already.
    compiled, compile_seconds = chosen
  else:
    log(f"compile: lowered in {t1 - t0:.1f} s; compiling (XLA: minutes for a pod-sized model)")
    compiled = _compile(lowered, where, c)
    compile_seconds = time.perf_counter() - t1

  memory = memory_lib.compiled_memory(compiled)
  hbm = hbm_bytes(device)
  memory["hbm_bytes"] = hbm
  memory["fits"] = None if hbm is None else memory["total_bytes"] <= hbm
  per_step = flops.train_flops_per_step(c)
  counts = flops.param_counts(state.params)
  traffic = hlo_costs.costs(compiled.as_text(), dict(mesh.shape))
  # What the chip computes, rematerialized forwards included: the largest of three lower bounds (the
  # model's count; the HLO's dots, per loop trip, none where matmuls lower to convolutions or library
  # calls; XLA's count, each loop body once).
  xla_flops = _xla_flops(compiled)
  executed = max(per_step / mesh.size, traffic["dot_flops"], xla_flops or 0.0)
  bound = None if chip is None else roofline.estimate(chip, executed, per_step /
                                                      mesh.size, traffic["bytes_accessed"], traffic["collective_bytes"])
  return {
      "topology": topology or None,
      "platform": device.platform,
      "device_kind": device.device_kind,
      "num_devices": mesh.size,
      "mesh": dict(mesh.shape),
      "objective": c.objective,
      "batch_size": c.train.batch_size,
      "seq_len": c.data.seq_len,
      "grad_accum": c.train.grad_accum,
      "sequences_per_device": c.train.batch_size / mesh.size,
      "dtype": c.model.dtype,
      "scan_layers": c.model.scan_layers,
      "remat": c.model.remat,  # remat=auto: what it chose (grad_accum=0: above).
      "fit_choice": train_program.fit_choice,
      "lower_seconds": t1 - t0,
      "compile_seconds": compile_seconds,
      "memory": memory,
      "flops": {
          "analytic_per_device": per_step / mesh.size, "xla_per_device": xla_flops,
          "executed_matmul_per_device": traffic["dot_flops"]},
      "traffic": {k: traffic[k] for k in ("bytes_accessed", "collective_bytes", "collectives", "unknown_trip_counts")},
      "roofline": bound,
      "params": {
          "total": counts["total"], "non_embedding": counts["non_embedding"],
          "table": param_table(c, state.params, train_program.shardings.params)},
      "jax_version": jax.__version__,}


def _compile(lowered: jax.stages.Lowered, where: str, c: plan_lib.Settings) -> jax.stages.Compiled:
  """`lowered.compile()`; XLA's out-of-memory as one UserError line naming the fixes."""
  try:
    return lowered.compile()
  except Exception as e:  # noqa: BLE001 - XLA reports OOM as a runtime error; anything else re-raises.
    if not memory_lib.is_out_of_memory(e):
      raise
    message = " ".join(str(e).split())
    raise UserError(f"the train step does not fit on {where} ({message[:300]}); try {_hints(c)}") from None


def check_fits(report: dict[str, Any], c: plan_lib.Settings) -> None:
  """UserError (one line) when the compiled step needs more memory than the device has."""
  for row in report.get("phases", []):
    if row["fits"] is False:
      what = (
          row["error"] if row["error"] else f"the train step needs {row['total_bytes'] / GIB:.2f} GiB per "
          f"device but a {report['device_kind']} has {report['memory']['hbm_bytes'] / GIB:.1f} GiB; try {_hints(c)}")
      raise UserError(f"phase {row['phase']} (steps {row['first_step']}-{row['last_step']}, batch "
                      f"{row['batch_size']} x L={row['seq_len']}): {what}")
  m = report["memory"]
  if m["fits"] is False:
    where = report["topology"] or report["device_kind"]
    raise UserError(f"the train step needs {m['total_bytes'] / GIB:.2f} GiB per device but a {report['device_kind']} "
                    f"on {where} has {m['hbm_bytes'] / GIB:.1f} GiB; try {_hints(c)}")


def _gib(n: int | None) -> str:
  return "?" if n is None else f"{n / GIB:.3f}"


def format_report(report: dict[str, Any], params: bool = True) -> str:
  """The report as aligned text: run shape, memory per device, FLOPs, the param sharding table."""
  m, f = report["memory"], report["flops"]
  mesh = " ".join(f"{k}={v}" for k, v in report["mesh"].items())
  lines = [
      f"{report['objective']} on {report['topology'] or 'local devices'}: {report['num_devices']} x "
      f"{report['device_kind']}, mesh {mesh}",
      f"batch {report['batch_size']} x L={report['seq_len']} ({report['sequences_per_device']:g} sequences per device, "
      f"grad_accum {report['grad_accum']}), {report['dtype']} compute, scan_layers={report['scan_layers']}, "
      f"remat={report['remat']}",
      f"lowered in {report['lower_seconds']:.1f} s, compiled in {report['compile_seconds']:.1f} s",
      "",
      "memory per device (GiB):",
      f"  arguments    {_gib(m['argument_bytes']):>8}   (params + optimizer state + batch)",
      f"  outputs      {_gib(m['output_bytes']):>8}   ({_gib(m['alias_bytes'])} of it written into the donated state)",
      f"  temporaries  {_gib(m['temp_bytes']):>8}   (activations, gradients, collectives)",
      f"  code         {_gib(m['generated_code_bytes']):>8}",
      f"  total        {_gib(m['total_bytes']):>8}   " +
      (f"(no memory size known for {report['device_kind']}: not checked)" if m["hbm_bytes"] is None else
       f"of {_gib(m['hbm_bytes'])} HBM ({100 * m['total_bytes'] / m['hbm_bytes']:.0f}%): " +
       ("fits" if m["fits"] else "DOES NOT FIT")),
      "",
      f"FLOPs per device per step: analytic {f['analytic_per_device']:.3e}, XLA cost analysis " +
      ("n/a" if f["xla_per_device"] is None else f"{f['xla_per_device']:.3e}") +
      (" (XLA counts a loop body once: scan over layers, grad_accum)" if f["xla_per_device"] is not None and
       (report["scan_layers"] or report["grad_accum"] > 1) else ""),
      f"params: {report['params']['total'] / 1e6:.1f} M ({report['params']['non_embedding'] / 1e6:.1f} M non-embedding)",
      f"collectives per device per step: {hlo_costs.summary(report['traffic'])}",]
  lines += ([""] + roofline.format_lines(report["roofline"]) if report.get("roofline") else [
      "", f"roofline: no chip figures for {report['device_kind']}; pass --chip (see --helpfull)"])
  if report.get("phases"):
    lines += ["", "phases (the details above: the phase needing the most memory):"]
    lines += _table(
        ("phase", "steps", "batch x L", "total GiB", "temp GiB", "fits", "bound by", "step ms >=", "MFU <="), [
            (str(r["phase"]), f"{r['first_step']}-{r['last_step']}", f"{r['batch_size']} x {r['seq_len']}",
             _gib(r["total_bytes"]), _gib(r["temp_bytes"]), {True: "fits", False: "DOES NOT FIT", None: "not checked"
                                                            }[r["fits"]], r["bound_by"] or
             "-", "-" if r["step_s_lower_bound"] is None else f"{1e3 * r['step_s_lower_bound']:.2f}",
             "-" if r["mfu_upper_bound"] is None else f"{100 * r['mfu_upper_bound']:.1f}%") for r in report["phases"]])
  if not params:
    return "\n".join(lines)
  lines.append("")
  lines += _table(("param", "shape", "logical axes", "mesh spec", "per-device shard"), [
      (r["path"], "x".join(map(str, r["shape"])), ",".join(str(n) for n in r["logical"]), ",".join(
          str(s) for s in r["spec"]), "x".join(map(str, r["shard_shape"]))) for r in report["params"]["table"]])
  return "\n".join(lines)


def _table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
  """Aligned lines: the header, a rule, the rows."""
  rows = [header] + body
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  out = []
  for j, row in enumerate(rows):
    out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if j == 0:
      out.append("  ".join("-" * w for w in widths))
  return out


def shard_bytes(report: dict[str, Any]) -> int:
  """Bytes of one device's param shards (fp32 or the stored dtype): a check on argument_bytes."""
  return sum(math.prod(r["shard_shape"]) * jnp.dtype(r["dtype"]).itemsize for r in report["params"]["table"])

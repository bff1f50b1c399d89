"""Per-device costs read from a compiled program's HLO text: bytes accessed and collective bytes,
each instruction counted as many times as it runs.

XLA's `cost_analysis()` counts a loop body once, so a step that scans its layers (model.scan_layers)
or accumulates gradients (train.grad_accum) is undercounted by the trip count. Here the optimized
HLO is parsed: every computation gets the number of times it runs (a while body: its caller's
count times the loop's `known_trip_count`), and

- bytes accessed: each instruction of a control computation (the entry, loop bodies, branches,
  called computations) reads its operands and writes its output, as XLA's cost model counts a
  fusion; a fused parameter read only through (dynamic-)slices counts the slices, and an in-place
  dynamic-update-slice counts the update, not the whole buffer (a scan's stacked weights and
  carries are read and written a layer at a time);
- matmul FLOPs: 2 x output elements x contracted size of every dot (fused ones included), so
  rematerialized forwards count; a backend that lowers dots to library calls (cuBLAS on GPU) or
  to convolutions (TPU) shows none or few, and the roofline then takes the largest of this, XLA's
  count and the model's (each a lower bound of what runs);
- collectives: all-gather, reduce-scatter, all-reduce, all-to-all and collective-permute (their
  async -start forms included), with the bytes one device sends for each by a ring algorithm,
  attributed to the mesh axes its replica groups span.

Both are estimates of traffic, not measurements: the roofline (`roofline.py`) divides them by a
chip's bandwidths.
"""

import collections
import dataclasses
import math
import re
from typing import Any

import numpy as np

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([^\]]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLED = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_LIST_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}")
# Instructions that move no data of their own (their bodies, if any, are counted instead).
_NO_TRAFFIC = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call", "after-all",
    "partition-id", "replica-id", "opt-barrier", "copy-start", "copy-done", "async-start", "async-update", "async-done",
    "all-gather-done", "all-reduce-done", "collective-permute-done", "send-done", "recv-done", "add-dependency",
    "domain"}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def shape_bytes(text: str) -> float:
  """Bytes of every array shape written in `text` (a tuple's elements summed)."""
  total = 0.0
  for dtype, dims in _SHAPE.findall(text):
    if dtype not in _DTYPE_BYTES:
      continue
    sizes = [int(re.sub(r"[^\d]", "", d) or 1) for d in dims.split(",") if d.strip()]
    total += _DTYPE_BYTES[dtype] * math.prod(sizes)
  return total


@dataclasses.dataclass
class Instruction:
  name: str
  type: str  # The result type: "f32[8,16]{1,0}" or a tuple "(s32[], f32[8])".
  opcode: str
  operands: list[str]  # Names of the operand instructions.
  args: str  # The text between the opcode's parentheses ("0" for parameter(0)).
  attributes: str


def _balanced(text: str, start: int) -> int:
  """The index just past the bracket group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(text[i], 0)
    if depth == 0:
      return i + 1
  return len(text)


def _parse_instruction(line: str) -> Instruction | None:
  m = _INSTRUCTION.match(line)
  if not m:
    return None
  name, rest = m.groups()
  if rest.startswith("("):
    end = _balanced(rest, 0)
  else:
    end = rest.find(" ")
    if end < 0:
      return None
  result_type, rest = rest[:end], rest[end:].strip()
  op = re.match(r"([\w\-]+)\(", rest)
  if not op:
    return None
  close = _balanced(rest, op.end() - 1)
  args = rest[op.end():close - 1]
  return Instruction(name, result_type, op.group(1), re.findall(r"%([\w.\-]+)", args), args, rest[close:])


def parse(hlo: str) -> tuple[dict[str, list[Instruction]], str]:
  """{computation name: its instructions} and the entry computation's name."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = "", None
  for line in hlo.splitlines():
    header = _HEADER.match(line)
    if header:
      current = header.group(2)
      computations[current] = []
      if header.group(1):
        entry = current
    elif line.strip() == "}":
      current = None
    elif current is not None:
      instruction = _parse_instruction(line)
      if instruction is not None:
        computations[current].append(instruction)
  return computations, entry


def _trip_count(ins: Instruction, computations: dict[str, list[Instruction]]) -> int | None:
  """A while loop's trip count: XLA's known_trip_count, else N from a condition `i < N` (a counter
  from 0, as jax's fori_loop and scan lower), else None."""
  known = _TRIP_COUNT.search(ins.attributes)
  if known:
    return int(known.group(1))
  condition = re.search(r"\bcondition=%?([\w.\-]+)", ins.attributes)
  body = computations.get(condition.group(1), []) if condition else []
  root = body[-1] if body else None
  if root is None or root.opcode != "compare" or "direction=LT" not in root.attributes:
    return None
  constants = {i.name: i.args for i in body if i.opcode == "constant"}
  bound = [constants[o] for o in root.operands[1:] if o in constants]
  return int(bound[0]) if bound and bound[0].lstrip("-").isdigit() else None


def _run_counts(computations: dict[str, list[Instruction]], entry: str) -> tuple[dict[str, float], set[str]]:
  """How many times each computation runs per call of the entry, and which are control computations
  (their instructions run on their own, not inside a fusion or as a reducer)."""
  counts: dict[str, float] = collections.defaultdict(float)
  control = {entry}
  counts[entry] = 1.0
  order = [entry]
  for name in order:  # Callers come before callees in this walk (HLO has no recursion).
    for ins in computations.get(name, []):
      called = [(kind, callee) for kind, callee in _CALLED.findall(ins.attributes)]
      if (branches := _BRANCHES.search(ins.attributes)):
        called += [("branch", b.strip().lstrip("%")) for b in branches.group(1).split(",") if b.strip()]
      trips = _trip_count(ins, computations) if ins.opcode == "while" else None
      for kind, callee in called:
        if callee not in computations:
          continue
        times = counts[name] * (trips or 1)
        counts[callee] += times
        if kind in ("body", "condition", "true_computation", "false_computation",
                    "branch") or (kind in ("calls", "to_apply") and ins.opcode in ("call", "async-start")):
          control.add(callee)
        if callee not in order:
          order.append(callee)
  return counts, control


def _fused_read_bytes(fused: list[Instruction], index: int, full: float) -> float:
  """Bytes a fusion reads of its parameter `index`: the slices taken of it when it is only sliced,
  nothing when it is the buffer of an in-place dynamic-update-slice (the update is counted)."""
  target = next((i.name for i in fused if i.opcode == "parameter" and i.args.strip() == str(index)), None)
  users = [i for i in fused if target is not None and target in i.operands]
  if users and all(u.opcode in ("dynamic-slice", "slice", "gather") and u.operands[0] == target for u in users):
    return sum(shape_bytes(u.type) for u in users)
  if users and all(u.opcode == "dynamic-update-slice" and u.operands[0] == target for u in users):
    return 0.0
  return full


def _written_bytes(ins: Instruction, fused: list[Instruction] | None) -> float:
  """Bytes an instruction writes: its output, or the update of an in-place dynamic-update-slice."""
  if ins.opcode == "dynamic-update-slice":
    return 0.0  # The update operand's bytes are added by the caller (read and written).
  if fused:
    root = fused[-1]
    if root.opcode == "dynamic-update-slice":
      by_name = {i.name: i for i in fused}
      update = by_name.get(root.operands[1]) if len(root.operands) > 1 else None
      return shape_bytes(update.type) if update is not None else shape_bytes(ins.type)
  return shape_bytes(ins.type)


def _dot_flops(ins: Instruction, types: dict[str, str]) -> float:
  """2 x output elements x contracted elements of a dot."""
  contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attributes)
  lhs = _SHAPE.search(types.get(ins.operands[0], "")) if ins.operands else None
  out = _SHAPE.search(ins.type)
  if not (contracting and lhs and out):
    return 0.0
  lhs_dims = [int(re.sub(r"[^\d]", "", d) or 1) for d in lhs.group(2).split(",") if d.strip()]
  out_dims = [int(re.sub(r"[^\d]", "", d) or 1) for d in out.group(2).split(",") if d.strip()]
  k = math.prod(lhs_dims[int(i)] for i in contracting.group(1).split(",") if i.strip())
  return 2.0 * math.prod(out_dims) * k


def _groups(attributes: str) -> list[list[int]] | None:
  """The replica groups of a collective: explicit lists, the iota form [G,N]<=[dims]T(perm), or the
  mesh form mesh['axis_0'=A,'axis_1'=B] {'axis_0'} (groups along the listed axes of the devices
  laid out row-major)."""
  m = _MESH_GROUPS.search(attributes)
  if m:
    axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
    chosen = [i for i, (name, _) in enumerate(axes) if f"'{name}'" in m.group(2)]
    ids = np.arange(math.prod(int(size) for _, size in axes)).reshape([int(size) for _, size in axes])
    rest = [i for i in range(len(axes)) if i not in chosen]
    size = math.prod(int(axes[i][1]) for i in chosen)
    return ids.transpose(rest + chosen).reshape(-1, size).tolist()
  m = _IOTA_GROUPS.search(attributes)
  if m:
    groups, size, dims, perm = m.groups()
    ids = np.arange(math.prod(int(d) for d in dims.split(","))).reshape([int(d) for d in dims.split(",")])
    if perm:
      ids = ids.transpose([int(p) for p in perm.split(",")])
    return ids.reshape(int(groups), int(size)).tolist()
  m = _LIST_GROUPS.search(attributes)
  if m and m.group(1).strip():
    return [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))]
  pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", attributes)
  if pairs:
    return [[int(x) for x in p.split(",")] for p in re.findall(r"\{(\d+,\d+)", pairs.group(0))]
  return None


def _axes(group: list[int], mesh_shape: dict[str, int]) -> str:
  """The mesh axes along which a group's devices differ ("fsdp", "data+fsdp"); device ids are
  positions in the mesh's device array (row-major)."""
  names = list(mesh_shape)
  coords = np.array(np.unravel_index(np.array(group), [mesh_shape[n] for n in names])).T
  varying = [n for k, n in enumerate(names) if len(set(coords[:, k])) > 1]
  return "+".join(varying) or "none"


def _sent_bytes(opcode: str, operand_bytes: float, n: int) -> float:
  """Bytes one device sends for a collective over n devices (ring algorithms)."""
  if n <= 1:
    return 0.0
  if opcode == "all-gather":
    return operand_bytes * (n - 1)
  if opcode in ("reduce-scatter", "all-to-all"):
    return operand_bytes * (n - 1) / n
  if opcode == "all-reduce":
    return 2 * operand_bytes * (n - 1) / n
  return operand_bytes  # collective-permute: each device sends its operand once.


def costs(hlo: str, mesh_shape: dict[str, int]) -> dict[str, Any]:
  """{"bytes_accessed": per device per call, "dot_flops": matmul FLOPs executed, "collectives": {opcode: {axes: bytes sent}}, "collective_bytes":
  total sent, "loops": [(trip count, computation)], "unknown_trip_counts": n}."""
  computations, entry = parse(hlo)
  counts, control = _run_counts(computations, entry)
  accessed = dot_flops = 0.0
  sent: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
  unknown = 0
  loops = []
  for name, instructions in computations.items():
    times = counts.get(name, 0.0)
    if not times:
      continue
    types = {i.name: i.type for i in instructions}
    for ins in instructions:
      if ins.opcode == "while":
        trips = _trip_count(ins, computations)
        unknown += trips is None
        loops.append((trips, ins.name))
      if ins.opcode == "dot":
        dot_flops += times * _dot_flops(ins, types)
      base = ins.opcode.removesuffix("-start")
      if base in COLLECTIVES:
        operand = sum(shape_bytes(types.get(o, "")) for o in ins.operands)
        groups = _groups(ins.attributes) or [list(range(math.prod(mesh_shape.values())))]  # None: every device.
        n, axes = len(groups[0]), _axes(groups[0], mesh_shape)
        if base == "collective-permute":  # Pairs (source, target): the axes the targets move along.
          n, axes = 2, _axes(sorted({d for pair in groups for d in pair}), mesh_shape)
        sent[base][axes] += times * _sent_bytes(base, operand, n)
      if name not in control or ins.opcode in _NO_TRAFFIC or ins.opcode.endswith("-done"):
        continue
      callee = re.search(r"\bcalls=%?([\w.\-]+)", ins.attributes)
      fused = computations.get(callee.group(1)) if (ins.opcode == "fusion" and callee) else None
      reads = 0.0
      for k, operand in enumerate(ins.operands):
        full = shape_bytes(types.get(operand, ""))
        if fused is not None:
          reads += _fused_read_bytes(fused, k, full)
        elif ins.opcode in ("dynamic-slice", "slice", "gather") and k == 0:
          reads += shape_bytes(ins.type)
        elif ins.opcode == "dynamic-update-slice" and k == 0:
          continue
        else:
          reads += full
      written = _written_bytes(ins, fused)
      if ins.opcode == "dynamic-update-slice" and len(ins.operands) > 1:
        written = shape_bytes(types.get(ins.operands[1], ""))
      accessed += times * (reads + written)
  collectives = {op: dict(by_axes) for op, by_axes in sent.items()}
  return {
      "bytes_accessed": accessed, "dot_flops": dot_flops, "collectives": collectives,
      "collective_bytes": sum(v for by_axes in collectives.values() for v in by_axes.values()), "loops": loops,
      "unknown_trip_counts": unknown}


def summary(report: dict[str, Any]) -> str:
  """The collectives of `costs` as one line: "all-gather fsdp 1.2 GB, reduce-scatter fsdp 0.6 GB"."""
  parts = [
      f"{op} {axes} {b / 1e9:.3g} GB" for op, by_axes in report["collectives"].items()
      for axes, b in sorted(by_axes.items())]
  return ", ".join(parts) or "none"

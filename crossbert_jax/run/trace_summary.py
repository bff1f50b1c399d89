"""Where a trace's steps spent their time, from the trace itself (`summarize`, `format_summary`).

The .xplane.pb is read with jax.profiler.ProfileData, the profiler's own reader. Within the traced
span (the first StepTraceAnnotation's start to the last step's last execution), the step program's
executions (TPU / GPU: the "XLA Modules" line; CPU: the client's "ThunkExecutor::Execute (wait for
completion)") are the compute, the rest of the span is the host idle between steps (dispatch,
input, the loop's own work). The ops are the XLA ops inside: on TPU / GPU the device planes' op
(kernel) events, on CPU the host threads' thunk events (those with an `hlo_op` stat), their time
scaled onto the wall time they cover (CPU threads run ops side by side). An op is a matmul /
convolution when its name or HLO category names one (dot, convolution, gemm, matmul, cuBLAS /
CUTLASS kernels (`nvjet`, `xmma`), and on CPU `ynn_fusion`: XLA:CPU hands dots and their fused elementwise ops to
YNNPACK). On CPU the execution time no thunk covers is counted as matmul too: XLA:CPU's Eigen
dots run as thread-pool tasks outside the thunk events (docs/benchmarks.md, "Where the L=256 step
goes", attributes that time the same way), so a loaded host, whose descheduled threads also show
as untraced, overstates it.
"""

import collections
import re
from typing import Any

import jax

MATMUL = re.compile(r"dot|convolution|gemm|matmul|einsum|ynn_fusion|cublas|cutlass|nvjet|xmma", re.IGNORECASE)
_NOT_OPS = {
    "Steps", "XLA Modules", "Framework Name Scope", "Framework Ops", "XLA TraceMe", "Source code", "Host Threads",
    "Launch Stats", "TensorFlow Name Scope", "TensorFlow Ops"}
TOP = 8
CPU_EXECUTION = "ThunkExecutor::Execute (wait for completion)"
UNTRACED = "(untraced: XLA:CPU dots)"


def _device_planes(planes: list[Any]) -> list[Any]:
  return [p for p in planes if p.name.startswith("/device:") and any(True for _ in p.lines)]


def _ops(planes: list[Any], devices: list[Any]) -> list[tuple[str, float, float, bool]]:
  """(name, start ns, end ns, is matmul) of every op event: the device planes', else the host's thunks."""
  out = []
  for plane in devices:
    lines = list(plane.lines)
    xla_ops = [line for line in lines if line.name == "XLA Ops"]
    for line in xla_ops or [line for line in lines if line.name not in _NOT_OPS]:
      for e in line.events:
        category = str(dict(e.stats).get("hlo_category", ""))
        out.append((e.name, e.start_ns, e.start_ns + e.duration_ns, bool(MATMUL.search(f"{e.name} {category}"))))
  for plane in ([] if devices else planes):
    for line in plane.lines:
      for e in line.events:
        if e.duration_ns > 0 and "hlo_op" in dict(e.stats):
          out.append((e.name, e.start_ns, e.start_ns + e.duration_ns, bool(MATMUL.search(e.name))))
  return out


def _executions(planes: list[Any], devices: list[Any]) -> list[tuple[float, float]]:
  """(start, end) ns of the programs' executions."""
  if devices:
    return [(e.start_ns, e.start_ns + e.duration_ns) for p in devices for line in p.lines if line.name == "XLA Modules"
            for e in line.events]
  return [(e.start_ns, e.start_ns + e.duration_ns)
          for p in planes
          for line in p.lines
          for e in line.events
          if e.name == CPU_EXECUTION]


def _steps(planes: list[Any], step_name: str) -> list[tuple[float, float]]:
  """(start, end) ns of the StepTraceAnnotation events named `step_name`."""
  return sorted((e.start_ns, e.start_ns + e.duration_ns)
                for p in planes
                for line in p.lines
                for e in line.events
                if e.name == step_name)


def _union(intervals: list[tuple[float, float]]) -> float:
  total, end = 0.0, float("-inf")
  for a, b in sorted(intervals):
    if b > end:
      total += b - max(a, end)
      end = b
  return total


def summarize(xplane: str, step_name: str) -> dict[str, Any]:
  """The traced steps' span, their compute, its matmul share, top ops and host idle; times in seconds."""
  planes = list(jax.profiler.ProfileData.from_file(xplane).planes)
  steps = _steps(planes, step_name)
  if not steps:
    raise ValueError(f"{xplane} holds no {step_name!r} step annotation")
  first, devices = steps[0][0], _device_planes(planes)
  ops = [o for o in _ops(planes, devices) if o[1] >= first]
  runs = [r for r in _executions(planes, devices) if r[0] >= first] or [(a, b) for _, a, b, _ in ops]
  span = max([steps[-1][1]] + [b for _, b in runs]) - first
  compute, busy = _union(runs), _union([(a, b) for _, a, b, _ in ops])
  op_ns = sum(b - a for _, a, b, _ in ops)
  scale = busy / op_ns if op_ns else 0.0  # Op time -> the wall time it covers.
  per_name: dict[str, float] = collections.Counter()
  for name, a, b, _ in ops:
    per_name[re.sub(r"\.\d+$", "", name)] += (b - a) * scale
  untraced = 0.0 if devices else max(0.0, compute - busy)
  if untraced:
    per_name[UNTRACED] = untraced
  matmul = sum(b - a for _, a, b, mm in ops if mm) * scale + untraced
  top = sorted(per_name.items(), key=lambda kv: -kv[1])[:TOP]
  return {
      "steps": len(steps), "span_s": span / 1e9, "compute_s": compute / 1e9, "matmul_s": matmul / 1e9,
      "untraced_s": untraced / 1e9, "matmul_fraction": matmul / compute if compute else 0.0,
      "host_idle_s": (span - compute) / 1e9, "host_idle_fraction": (span - compute) / span if span else 0.0, "top": [
          (name, t / 1e9, t / compute) for name, t in top]}


def format_summary(s: dict[str, Any], label: str) -> str:
  """A few lines a user reads without TensorBoard."""
  n = s["steps"]
  return "\n".join([
      f"profile summary ({label}, {n} step(s), {1e3 * s['span_s'] / n:.1f} ms/step): compute "
      f"{1e3 * s['compute_s'] / n:.1f} ms/step, of it matmul/conv {100 * s['matmul_fraction']:.0f}% and the rest "
      f"{100 * (1 - s['matmul_fraction']):.0f}%; host idle between steps {100 * s['host_idle_fraction']:.0f}% of the "
      f"span ({1e3 * s['host_idle_s'] / n:.1f} ms/step)",
      "  top ops by time: " + ", ".join(f"{name} {100 * share:.0f}%" for name, _, share in s["top"])])

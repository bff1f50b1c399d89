"""Where a trace's steps spent their time, from the trace itself (`summarize`, `format_summary`).

The .xplane.pb is read with jax.profiler.ProfileData, the profiler's own reader. The ops are the
XLA ops executed inside the traced steps' span (the first to the last StepTraceAnnotation, to the
last op that started in it): on TPU / GPU the device planes' op (kernel) events, on CPU the host
threads' thunk events (those carrying an `hlo_op` stat). An op is a matmul / convolution when its
name or HLO category names one (dot, convolution, gemm, matmul, cuBLAS / CUTLASS kernels, and on
CPU `ynn_fusion`: XLA:CPU hands its dots, with their fused elementwise ops, to YNNPACK).
"Device idle" is the span minus the union of the ops' intervals: time the device waited on the
host (dispatch, input, the loop's own work) between and within the steps.
"""

import collections
import re
from typing import Any

import jax

MATMUL = re.compile(r"dot|conv|gemm|matmul|einsum|ynn_fusion|cublas|cutlass|nvjet|xmma", re.IGNORECASE)
_NOT_OPS = {"Steps", "XLA Modules", "Framework Name Scope", "Framework Ops", "XLA TraceMe", "Source code",
            "Host Threads", "Launch Stats", "TensorFlow Name Scope", "TensorFlow Ops"}
TOP = 8


def _ops(planes: list[Any]) -> list[tuple[str, float, float, bool]]:
  """(name, start ns, end ns, is matmul) of every op event: the device planes', else the host's thunks."""
  devices = [p for p in planes if p.name.startswith("/device:") and any(True for _ in p.lines)]
  out = []
  if devices:
    for plane in devices:
      lines = list(plane.lines)
      xla_ops = [line for line in lines if line.name == "XLA Ops"]
      for line in xla_ops or [line for line in lines if line.name not in _NOT_OPS]:
        for e in line.events:
          category = str(dict(e.stats).get("hlo_category", ""))
          out.append((e.name, e.start_ns, e.start_ns + e.duration_ns, bool(MATMUL.search(f"{e.name} {category}"))))
    return out
  for plane in planes:
    for line in plane.lines:
      for e in line.events:
        stats = dict(e.stats)
        if "hlo_op" in stats and e.duration_ns > 0:
          out.append((e.name, e.start_ns, e.start_ns + e.duration_ns, bool(MATMUL.search(e.name))))
  return out


def _steps(planes: list[Any], step_name: str) -> list[tuple[float, float]]:
  """(start, end) ns of the StepTraceAnnotation events named `step_name`."""
  return sorted((e.start_ns, e.start_ns + e.duration_ns) for p in planes for line in p.lines for e in line.events
                if e.name == step_name)


def _union(intervals: list[tuple[float, float]]) -> float:
  total, end = 0.0, float("-inf")
  for a, b in sorted(intervals):
    if b > end:
      total += b - max(a, end)
      end = b
  return total


def summarize(xplane: str, step_name: str) -> dict[str, Any]:
  """The traced steps' span, op time (total, matmul), top ops and device idle; times in seconds."""
  planes = list(jax.profiler.ProfileData.from_file(xplane).planes)
  steps = _steps(planes, step_name)
  if not steps:
    raise ValueError(f"{xplane} holds no {step_name!r} step annotation")
  first = steps[0][0]
  ops = [o for o in _ops(planes) if o[1] >= first]
  end = max([steps[-1][1]] + [o[2] for o in ops])
  per_name: dict[str, float] = collections.Counter()
  for name, a, b, _ in ops:
    per_name[re.sub(r"\.\d+$", "", name)] += b - a
  op_s = sum(b - a for _, a, b, _ in ops)
  matmul_s = sum(b - a for _, a, b, mm in ops if mm)
  span = end - first
  busy = _union([(a, b) for _, a, b, _ in ops])
  return {"steps": len(steps), "span_s": span / 1e9, "op_s": op_s / 1e9, "matmul_s": matmul_s / 1e9,
          "matmul_fraction": matmul_s / op_s if op_s else 0.0, "device_idle_s": (span - busy) / 1e9,
          "device_idle_fraction": (span - busy) / span if span else 0.0,
          "top": [(name, t / 1e9, t / op_s) for name, t in sorted(per_name.items(), key=lambda kv: -kv[1])[:TOP]]}


def format_summary(s: dict[str, Any], label: str) -> str:
  """A few lines a user reads without TensorBoard."""
  lines = [f"profile summary ({label}, {s['steps']} step(s), {1e3 * s['span_s'] / s['steps']:.1f} ms/step): "
           f"ops {s['op_s']:.3f} s, matmul/conv {100 * s['matmul_fraction']:.0f}% of op time, the rest "
           f"{100 * (1 - s['matmul_fraction']):.0f}%; device idle (waiting on the host) "
           f"{100 * s['device_idle_fraction']:.0f}% of the span ({1e3 * s['device_idle_s'] / s['steps']:.1f} ms/step)",
           "  top ops by time: " + ", ".join(f"{name} {100 * share:.0f}%" for name, _, share in s["top"])]
  return "\n".join(lines)

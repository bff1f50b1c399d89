"""The accelerator check's speed rows (tools/accelerator_check.py runs them): the bf16 train-step bench of
`base` at L=1024 (BENCH_CASES: each lever alone and together, all-global and ModernBERT's layer pattern),
the transformers ModernBERT peer at the same shape (tools/peer_modernbert.py), tokens/s against the peer,
and the table printed at the end."""

import gzip
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from crossbert_jax.core import config as config_lib  # noqa: E402
from crossbert_jax.core import plan as plan_lib  # noqa: E402
from crossbert_jax.perf import benchmark, roofline  # noqa: E402
from crossbert_jax.training import flops  # noqa: E402


def _save_trace(trace_dir: pathlib.Path, out: pathlib.Path, name: str) -> dict[str, Any]:
  """The trace's .xplane.pb, gzipped to OUT/profile_<case>.xplane.pb.gz (one file: a lent machine's OUT
  returns files at most two folders down)."""
  found = sorted(trace_dir.rglob("*.xplane.pb"))
  if not found:
    return {"trace": None}
  target = out / f"profile_{name}.xplane.pb.gz"
  target.write_bytes(gzip.compress(found[-1].read_bytes()))
  return {"trace": target.name, "trace_bytes": target.stat().st_size}


# ModernBERT-base's layer pattern: global attention every 3rd layer, the others a 128-token window.
MB = {"model.global_every": 3, "model.local_window": 128}
LEVERS = {"model.remat": "auto", "model.head_dtype": "bfloat16"}
# The batch lever: 4x the bench's batch, as few micro-batches as fit (train.grad_accum=0); tokens/s per step
# then count 4x the tokens, in the largest micro-batch the chip holds.
BATCH = {"train.batch_size": 128, "train.grad_accum": 0}
# (case, benchmark.CASES entry, config keys over `base`'s, traced). `base` as is: remat full, float32
# head, attention auto (gpu_flash on a GPU: its window kernel, by position, runs every local layer, BERT's
# packed rows and CrossBERT's gathered encoder tokens, and the reconstructor's cross-attention).
BENCH_CASES = (
    ("bert_r0.15", "bert_r0.15", {}, True),  # All global: run1-run5's rows.
    ("cb_r0.5_k1", "cb_r0.5_k1", {}, True),
    ("bert_mb", "bert_r0.15", MB, False),  # ModernBERT's pattern, the peer's.
    ("cb_mb", "cb_r0.5_k1", MB, False),
    ("bert_mb_levers", "bert_r0.15", {**MB, **LEVERS}, True),
    ("cb_mb_levers", "cb_r0.5_k1", {**MB, **LEVERS}, True),
    ("bert_mb_levers_batch", "bert_r0.15", {**MB, **LEVERS, **BATCH}, False),  # Every lever of this call.
    ("cb_mb_levers_batch", "cb_r0.5_k1", {**MB, **LEVERS, **BATCH}, False),
    ("bert_mb_attention_cudnn", "bert_r0.15", {**MB, "model.attention": "cudnn"}, False),
    ("bert_mb_attention_xla", "bert_r0.15", {**MB, "model.attention": "xla"}, False),
    ("bert_mb_remat_auto", "bert_r0.15", {**MB, "model.remat": "auto"}, False),
    ("bert_mb_head_bf16", "bert_r0.15", {**MB, "model.head_dtype": "bfloat16"}, False),
    ("bert_r0.15_levers", "bert_r0.15", LEVERS, False),
    ("cb_r0.5_k1_levers", "cb_r0.5_k1", LEVERS, False),
)
BENCH_BUDGET_S = 230  # No case starts after this (the wrapper stops the check at 480 s).
# The dry run's cases: every code path of the table (each lever, both patterns, both objectives) in
# five compiles, not eleven.
DRY_RUN_CASES = ("bert_r0.15", "cb_r0.5_k1", "bert_mb_levers_batch", "cb_mb_levers", "bert_mb_attention_cudnn")


def bench_config(name: str, dry_run: bool):
  """The plan of bench case `name` (BENCH_CASES) at the check's shape."""
  variant, seq_len, batch = ("tiny", 64, 8) if dry_run else ("base", 1024, 32)
  _, case, keys, _ = next(row for row in BENCH_CASES if row[0] == name)
  edit = next(e for n, _, e in benchmark.CASES if n == case)
  # case_config times float32 by default; the accelerator is judged in bf16.
  c = benchmark.case_config(config_lib.get_config("crossbert", variant), edit, seq_len, batch_size=batch,
                            dtype="bfloat16")
  if dry_run and "model.local_window" in keys:  # The tiny rows are 64 long: a window that masks something.
    keys = {**keys, "model.local_window": 16}
  if dry_run and "train.batch_size" in keys:  # The same 4x over the dry run's batch.
    keys = {**keys, "train.batch_size": 4 * batch}
  return plan_lib.with_keys(c, keys)


def bench(dry_run: bool, out: pathlib.Path, work: pathlib.Path, on_case: Callable[[dict[str, Any]],
                                                                                  None] = lambda rows: None,
          cases: list[str] | None = None) -> dict[str, Any]:
  """The bf16 train step of each case on one device (`cases`: those of BENCH_CASES only): time, tokens/s,
  MFU, memory; then, for the traced cases, a jax.profiler trace of benchmark.TRACED_STEPS more steps,
  saved into OUT. `on_case(rows)` after each case (the JSON is rewritten: a check stopped mid-bench keeps
  the cases it measured)."""
  device = jax.devices()[0]
  chip = roofline.chip_for(device.device_kind)
  rows = {}
  t0 = time.perf_counter()
  for name, _, keys, traced in BENCH_CASES:
    if (dry_run and not cases and name not in DRY_RUN_CASES) or (cases and name not in cases):
      continue
    if not dry_run and time.perf_counter() - t0 > BENCH_BUDGET_S:
      rows[name] = {"skipped": f"past the bench's {BENCH_BUDGET_S} s"}
      continue
    c = bench_config(name, dry_run)
    trace_dir = work / f"trace_{name}" if traced else None
    try:
      timing = benchmark.time_case(c, steps=3 if dry_run else 10, warmup=1 if dry_run else 3,
                                   trace_dir=str(trace_dir) if traced else "")
    except Exception as e:  # noqa: BLE001 - a case that fails (e.g. out of memory) is recorded; the others run.
      rows[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
      continue
    step_flops = flops.train_flops_per_step(c)
    stats = (device.memory_stats() or {}) if hasattr(device, "memory_stats") else {}
    rows[name] = {
        "variant": "tiny" if dry_run else "base",
        "batch_size": c.train.batch_size,
        "seq_len": c.data.seq_len,
        "dtype": "bfloat16",
        "keys": keys,
        "global_every": c.model.global_every,
        "remat": timing["remat"],
        "grad_accum": timing["grad_accum"],
        "head_dtype": c.model.head_dtype,
        "attention": c.model.attention,
        "median_step_s": timing["median_s"],
        "compile_s": timing["compile_s"],
        "temp_bytes": timing["temp_bytes"],
        "tokens_per_s": c.train.batch_size * c.data.seq_len / timing["median_s"],
        "achieved_tflops": step_flops / timing["median_s"] / 1e12,
        "mfu": step_flops / timing["median_s"] / chip.peak_flops if chip else None,
        # The process's peak so far (JAX cannot reset it): an upper bound for this case.
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "loss": timing["loss"],
        **(_save_trace(trace_dir, out, name) if traced else {})}
    on_case(rows)
  failed = [n for n, r in rows.items() if "error" in r]
  return {
      "chip": chip.name if chip else None, "cases": rows, "passed": not failed,
      **({"failed": failed} if failed else {})}


def peer(dry_run: bool, out: pathlib.Path) -> dict[str, Any]:
  """tools/peer_modernbert.py in its own process (torch gets the GPU JAX has not taken yet)."""
  args = (["--shape=tiny", "--batch=2", "--seq_len=64", "--steps=2", "--warmup=1", "--compile=eager", "--device=cpu"]
          if dry_run else ["--budget_s=90"])
  path = out / "peer.json"
  proc = _python("tools/peer_modernbert.py", f"--out={path}", *args, timeout=420)
  if not path.is_file():
    return {"passed": False, "rc": proc.returncode, "error": _tail(proc)}
  result = json.loads(path.read_text())
  path.unlink()  # Kept in the check's JSON.
  return {
      **result, "rc": proc.returncode, "passed": proc.returncode == 0,
      **({"error": _tail(proc)} if proc.returncode else {})}


def add_vs_peer(report: dict[str, Any]) -> None:
  """Each bench case's tokens/s over the peer's best (in place), when both were measured."""
  best = report["steps"].get("peer", {}).get("best_tokens_per_s")
  for row in report["steps"].get("bench", {}).get("cases", {}).values():
    if best and "tokens_per_s" in row:
      row["vs_peer"] = row["tokens_per_s"] / best


def format_table(report: dict[str, Any]) -> str:
  """Ours and the peer: step ms, tokens/s, MFU, memory, vs the peer's best."""
  lines = [
      f"{'case':<24} {'layers':<11} {'batch':>9} {'remat':<5} {'head':<8} {'attention':<9} {'step ms':>8} {'tok/s':>9} "
      f"{'MFU':>6} {'GiB':>6} {'vs peer':>7}"]
  pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
  for name, r in report["steps"].get("bench", {}).get("cases", {}).items():
    if "tokens_per_s" not in r:
      lines.append(f"{name:<24} {r.get('error', r.get('skipped', ''))[:80]}")
      continue
    layers = "all global" if r["global_every"] == 1 else f"global/{r['global_every']}"
    batch = f"{r['batch_size']}/{r.get('grad_accum', 1)}"  # Sequences a step / micro-batches.
    lines.append(f"{name:<24} {layers:<11} {batch:>9} {r['remat']:<5} {r['head_dtype'][:8]:<8} {r['attention']:<9} "
                 f"{1e3 * r['median_step_s']:>8.1f} {r['tokens_per_s']:>9,.0f} {pct(r['mfu']):>6} "
                 f"{r['temp_bytes'] / 2**30:>6.2f} {r.get('vs_peer', 0):>6.2f}x")
  peer_batch = f"{report['steps'].get('peer', {}).get('batch_size', '-')}/1"
  for name, r in report["steps"].get("peer", {}).get("variants", {}).items():
    if "tokens_per_s" not in r:
      lines.append(f"peer {name:<19} {r.get('error', r.get('skipped', ''))[:80]}")
      continue
    gib = "-" if r["peak_bytes_allocated"] is None else f"{r['peak_bytes_allocated'] / 2**30:.2f}"
    lines.append(f"{'peer ' + name:<24} {'global/3':<11} {peer_batch:>9} {'-':<5} {'torch':<8} "
                 f"{name.split('+')[0][:9]:<9} "
                 f"{1e3 * r['median_step_s']:>8.1f} {r['tokens_per_s']:>9,.0f} {pct(r['mfu']):>6} {gib:>6} "
                 f"{'':>7}")
  return "\n".join(lines)


def _python(*args: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, **(env or {})})


def _tail(proc: subprocess.CompletedProcess) -> str:
  return (proc.stdout + proc.stderr)[-1500:]

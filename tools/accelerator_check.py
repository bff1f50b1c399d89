r"""One prepared check of an accelerator (a lent GPU, minutes long): writes one JSON of what it measured.

  python tools/accelerator_check.py --out=results/accelerator [--work=/tmp/runs] [--dry_run]

Steps, each recorded (passed or not, seconds, figures) and none stopping the others:
  peer       transformers' ModernBertForMaskedLM (torch) at the bench's shape with ModernBERT's layer
             pattern (tools/peer_modernbert.py, its own process, first: before JAX holds the GPU):
             step time, tokens/s, MFU by our FLOP formula per attention implementation, eager and
             torch.compile'd.
  versions   Python, jax, jaxlib, flax, optax, orbax, grain; the devices.
  attention  every attention backend (xla, chunked, gpu_flash; splash on a TPU) against dense,
             forward and gradients, on the default device; gpu_flash also on a local window (on
             packed and on gathered positions) and on cross-attention (its window kernel).
  attention_speed  forward + backward time of each backend in bf16 at the bench's shape, and of
             cuDNN's fused attention on a GPU (the reference); chunked and gpu_flash on a local
             layer (window 128) too.
  bench      the real bf16 train step of `base` at L=1024, one case per row of BENCH_CASES: BERT r=0.15
             and CrossBERT r=0.5 K=1 with all layers global and with ModernBERT's pattern (global
             every 3rd layer, window 128), each lever alone and all together (step time, tokens/s,
             MFU against the chip's peak, XLA's temporaries, vs_peer: tokens/s over the peer's
             best); the traced cases get a jax.profiler trace of 3 more steps:
             OUT/profile_<case>.xplane.pb.gz.
  resume     `small` trained 200 steps straight, and again killed (SIGKILL) after its step-100
             checkpoint and resumed: the two final params compared (bitwise, or the largest
             difference).
  export     `export --verify` of that run (transformers and sentence-transformers on the CPU).
  tests      the suite's sharding and masking tests on the default device.
  curves     `small` (L=256, ModernBERT's pattern) trained 200 steps per path for BERT and CrossBERT:
             the dense reference, another seed (the noise), gpu_flash, cudnn and the bf16 head; each
             path's late loss against the reference's (tools/accelerator_curves.py).
The default steps are the speed table (peer, versions, attention, attention_speed, bench: about
7 minutes on an H200); `--steps=all` adds resume, export, tests and curves (a second call:
`--steps=curves`, a few minutes).
--dry_run: every step at tiny shapes on this machine's CPU (the suite runs it, so the script stays
working between loans). tools/accelerator_check.sh is the wrapper that installs wheels and
keeps the log; docs/benchmarks.md says how the figures are read.
"""

import argparse
import functools
import importlib.metadata
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from crossbert_jax.core import xla_flags  # noqa: E402
from crossbert_jax.core.errors import UserError  # noqa: E402
from crossbert_jax.model import attention as attention_lib  # noqa: E402
from accelerator_bench import BENCH_CASES, _python, _tail, add_vs_peer, bench, format_table, peer  # noqa: E402
import accelerator_curves  # noqa: E402  (tools/)

DEFAULT_STEPS = "peer,versions,attention,attention_speed,bench"
ALL_STEPS = DEFAULT_STEPS + ",resume,export,tests,curves"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "ml-collections", "transformers", "torch")


def versions() -> dict[str, Any]:
  found = {}
  for name in PACKAGES:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  device = jax.devices()[0]
  return {
      "python": platform.python_version(), "packages": found, "backend": jax.default_backend(),
      "devices": [d.device_kind for d in jax.devices()], "device_kind": device.device_kind}


def _attention_inputs(shape: tuple[int, int, int, int], dtype, seed: int):
  """Random q, k, v of shape B x L x H x K and segment ids: two segments a row (the second L - L/2 long)."""
  b, length, _, _ = shape
  q, kk, v = (jax.random.normal(key, shape, dtype) for key in jax.random.split(jax.random.key(seed), 3))
  seg = jnp.concatenate([jnp.ones((b, length // 2), jnp.int32), 2 * jnp.ones((b, length - length // 2), jnp.int32)], 1)
  return q, kk, v, seg


def _gathered_positions(pos_BxL: jax.Array) -> jax.Array:
  """Positions about two apart and rising, as CrossBERT's visible tokens at r = 0.5 keep them."""
  return 2 * pos_BxL + jax.random.bernoulli(jax.random.key(7), 0.5, pos_BxL.shape).astype(pos_BxL.dtype)


def attention(dry_run: bool) -> dict[str, Any]:
  """Max |difference| to dense of each backend's output and gradients (float32 inputs, two segments)."""
  b, length, heads, k = (2, 128, 2, 32) if dry_run else (4, 2048, 12, 64)
  q, kk, v, seg = _attention_inputs((b, length, heads, k), jnp.float32, seed=0)
  block = 64 if dry_run else 128
  on_cpu = jax.default_backend() == "cpu"
  backends = ["chunked", "gpu_flash"] + (["splash"] if jax.default_backend() == "tpu" else [])

  # gpu_flash's window kernel: a local layer (ModernBERT's window), on positions that follow the indices and
  # on gathered ones (CrossBERT's visible tokens: every other position or so, rising), and cross-attention
  # (half as many queries as keys, their own segment array).
  window = 32 if dry_run else 128
  pos = jnp.broadcast_to(jnp.arange(length), seg.shape)
  gathered = _gathered_positions(pos)
  cases = {backend: (backend, {}) for backend in backends}
  cases["gpu_flash_local"] = ("gpu_flash", {"window": window, "q_pos_BxT": pos})
  cases["gpu_flash_gathered"] = ("gpu_flash", {"window": window, "q_pos_BxT": gathered})
  cases["gpu_flash_cross"] = ("gpu_flash", {"kv_seg_BxS": seg, "cross": True})

  def run(backend: str, kw: dict):
    spec = attention_lib.AttentionSpec(backend=backend, block_q=block, block_kv=block, interpret=on_cpu and
                                       backend in ("gpu_flash", "splash"))
    kw = dict(kw)
    q_seg, query = (seg[:, ::2], lambda q: q[:, ::2]) if kw.pop("cross", False) else (seg, lambda q: q)
    fn = lambda q, kk, v: attention_lib.attention(query(q), kk, v, q_seg, spec=spec, **kw)  # noqa: E731
    out = jax.jit(fn)(q, kk, v)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), argnums=(0, 1, 2)))(q, kk, v)
    return out, grads

  rows, dense = {}, {}
  for name, (backend, kw) in cases.items():
    mask = name if kw else "global"  # One dense reference per mask.
    if mask not in dense:
      dense[mask] = run("xla", kw)
    dense_out, dense_grads = dense[mask]
    t0 = time.perf_counter()
    out, grads = run(backend, kw)
    rows[name] = {
        "forward_max_abs_diff": float(jnp.max(jnp.abs(out - dense_out))),
        "grad_max_abs_diff": max(float(jnp.max(jnp.abs(g - d))) for g, d in zip(grads, dense_grads)),
        "seconds": time.perf_counter() - t0}
  worst = max(max(r["forward_max_abs_diff"], r["grad_max_abs_diff"]) for r in rows.values())
  # cudnn runs bf16 only: its inputs rounded to bf16, against dense on those same values in float32.
  lo = [a.astype(jnp.bfloat16) for a in (q, kk, v)]
  spec = attention_lib.AttentionSpec(backend="cudnn", interpret=on_cpu)
  try:
    got = jax.jit(lambda *a: attention_lib.attention(*a, seg, spec=spec))(*lo).astype(jnp.float32)
    ref = jax.jit(lambda *a: attention_lib.attention(*a, seg, spec=attention_lib.AttentionSpec("xla")))(
        *(a.astype(jnp.float32) for a in lo))
    rows["cudnn_bf16"] = {"forward_max_abs_diff": float(jnp.max(jnp.abs(got - ref)))}
    cudnn_ok = rows["cudnn_bf16"]["forward_max_abs_diff"] < 3e-2  # bf16 outputs: 2^-8 of values ~1.
  except Exception as e:  # noqa: BLE001 - recorded; the float32 backends decide the step.
    rows["cudnn_bf16"], cudnn_ok = {"error": f"{type(e).__name__}: {e}"[:300]}, False
  return {"shape_BxTxHxK": [b, length, heads, k], "backends": rows, "passed": worst < 1e-3 and cudnn_ok}


def attention_speed(dry_run: bool) -> dict[str, Any]:
  """Forward + backward time of each attention backend in bf16 at the bench's shape (B x L x 12 x 64,
  two segments a row), and of cuDNN's fused attention (`jax.nn.dot_product_attention`) on a GPU as
  the reference a GPU backend could reach. TFLOP/s count the model's 3x the forward's 4 B H L^2 K."""
  b, length, heads, k = (2, 128, 2, 32) if dry_run else (32, 1024, 12, 64)
  q, kk, v, seg = _attention_inputs((b, length, heads, k), jnp.bfloat16, seed=1)
  on_cpu = jax.default_backend() == "cpu"
  fns = {}
  for backend in ["xla", "chunked", "gpu_flash", "cudnn"] + (["splash"] if jax.default_backend() == "tpu" else []):
    spec = attention_lib.AttentionSpec(backend=backend, interpret=on_cpu and
                                       backend in ("gpu_flash", "splash", "cudnn"))
    fns[backend] = functools.partial(attention_lib.attention, q_seg_BxT=seg, spec=spec)
  if jax.default_backend() == "gpu":
    mask = (seg[:, None, :, None] == seg[:, None, None, :])
    fns["cudnn (reference)"] = lambda q, kk, v: jax.nn.dot_product_attention(q, kk, v, mask=mask, implementation="cudnn"
                                                                            )
  # gpu_flash on a local layer (window 128, the bench's ModernBERT pattern): its block-skipping kernel should
  # take about (window + 64) / L of a global layer's time; chunked's local layer beside it. `gathered`: the
  # positions of CrossBERT's visible tokens at r = 0.5 (about every other one), a window of about 64 indices.
  window, pos = (32 if dry_run else 128), jnp.broadcast_to(jnp.arange(length), seg.shape)
  gathered = _gathered_positions(pos)
  for backend, name, positions in (("chunked", "", pos), ("gpu_flash", "", pos), ("gpu_flash", " gathered", gathered)):
    spec = attention_lib.AttentionSpec(backend=backend, interpret=on_cpu and backend == "gpu_flash")
    fns[f"{backend} local {window}{name}"] = functools.partial(attention_lib.attention, q_seg_BxT=seg, spec=spec,
                                                               q_pos_BxT=positions, window=window)
  flops_step = 3 * 4 * b * heads * length * length * k
  rows = {}
  for name, fn in fns.items():
    step = jax.jit(jax.grad(lambda q, kk, v, fn=fn: jnp.sum(fn(q, kk, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    try:
      jax.block_until_ready(step(q, kk, v))
      times = []
      for _ in range(3 if dry_run else 10):
        t0 = time.perf_counter()
        jax.block_until_ready(step(q, kk, v))
        times.append(time.perf_counter() - t0)
      ms = 1e3 * sorted(times)[len(times) // 2]
      # A local row's TFLOP/s count a global layer's FLOPs: its speed-up over that layer, not its work rate.
      rows[name] = {"median_ms": ms, "tflops": flops_step / ms / 1e9}
    except Exception as e:  # noqa: BLE001 - a backend this machine cannot run is recorded, not fatal.
      rows[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
  return {
      "shape_BxLxHxK": [b, length, heads, k], "dtype": "bfloat16", "backends": rows,
      "passed": all("median_ms" in r for n, r in rows.items() if not n.startswith("cudnn (reference)"))}


def make_tokenizer(path: pathlib.Path) -> str | None:
  """The runs' 1,024-piece tokenizer of the built-in text at `path`; None, or why it failed."""
  made = _python("-m", "crossbert_jax.tokenizer", "--input=builtin", "--vocab_size=1024", f"--output={path}",
                 timeout=300)
  return _tail(made) if made.returncode else None


def resume(dry_run: bool, work: pathlib.Path) -> dict[str, Any]:
  """A straight run and a killed-then-resumed run of the same config; their final params compared."""
  from crossbert_jax.run import load  # pylint: disable=g-import-not-at-top

  variant, steps, every = ("tiny", 12, 4) if dry_run else ("small", 200, 50)
  tokenizer = work / "spm.model"
  if error := make_tokenizer(tokenizer):
    return {"passed": False, "error": "tokenizer: " + error}
  args = [
      "-m", "crossbert_jax.train", f"--config=configs/crossbert.py:{variant}", f"--config.data.tokenizer={tokenizer}",
      f"--config.train.steps={steps}", f"--config.checkpoint.every_steps={every}",
      "--config.checkpoint.async_save=False", "--config.metrics.progress_bar=False",
      "--config.metrics.tensorboard=False"]
  t0 = time.perf_counter()
  straight = _python(*args, f"--workdir={work / 'straight'}", timeout=600)
  straight_s = time.perf_counter() - t0
  if straight.returncode:
    return {"passed": False, "error": "straight run: " + _tail(straight)}
  killed_dir = work / "killed"
  proc = subprocess.Popen([sys.executable, *args, f"--workdir={killed_dir}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  kill_after = killed_dir / "checkpoints" / str(2 * every)
  deadline = time.time() + 600
  while proc.poll() is None and not kill_after.is_dir() and time.time() < deadline:
    time.sleep(0.05)
  killed_at_rc = proc.poll()
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  resumed = _python(*args, f"--workdir={killed_dir}", timeout=600)
  if resumed.returncode:
    return {"passed": False, "error": "resume: " + _tail(resumed)}
  _, a, step_a = load.load_run(work / "straight")
  _, b, step_b = load.load_run(killed_dir)
  diffs = [
      float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
  return {
      "variant": variant, "steps": steps, "straight_s": straight_s, "killed_after_step": 2 * every,
      "killed_before_it_finished": killed_at_rc is None, "final_steps": [step_a, step_b], "bitwise": max(diffs) == 0.0,
      "max_abs_param_diff": max(diffs), "passed": step_a == step_b == steps}


def export(dry_run: bool, work: pathlib.Path) -> dict[str, Any]:
  del dry_run
  run_dir = work / "straight"
  if not run_dir.is_dir():
    return {"passed": False, "error": "no run to export (the resume step failed)"}
  proc = _python("-m", "crossbert_jax.export", f"--workdir={run_dir}", f"--output={work / 'hf'}", "--verify", "--force",
                 timeout=600, env={"JAX_PLATFORMS": "cpu"})
  verify = [line for line in proc.stdout.splitlines() if "max" in line and "diff" in line]
  return {
      "rc": proc.returncode, "verify_lines": verify, "passed": proc.returncode == 0,
      **({"error": _tail(proc)} if proc.returncode else {})}


def tests(dry_run: bool) -> dict[str, Any]:
  selection = [
      "tests/unit/test_sharding.py", "tests/unit/test_masking.py", "-m", "not slow", "-q", "-p", "no:cacheprovider"]
  if dry_run:  # The suite already runs these on the CPU: here only that they are found and start.
    selection += ["-x", "-k", "test_masking and ratio"]
  env = {"CROSSBERT_DATA": os.environ.get("CROSSBERT_DATA", str(ROOT.parent / "shared" / "data"))}
  if not dry_run:
    env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")  # Not the suite's 8 fake CPU devices: the accelerator.
  proc = _python("-m", "pytest", *selection, timeout=900, env=env)
  summary = (proc.stdout.strip().splitlines() or [""])[-1]
  return {
      "rc": proc.returncode, "summary": summary, "passed": proc.returncode == 0,
      **({"error": _tail(proc)} if proc.returncode else {})}


def _backend() -> str:
  """JAX's backend, asked in another process: this one must not take the GPU before the peer runs."""
  proc = _python("-c", "import jax; print(jax.default_backend())", timeout=120)
  return proc.stdout.strip() or "not importable"


def _refusal(asked: list[str], known: list[str], out: pathlib.Path, dry_run: bool) -> str | None:
  """Why the check cannot start, checked before anything is written; None when it can."""
  unknown = [s for s in asked if s not in known]
  if unknown:
    return f"--steps {','.join(unknown)}: use some of {','.join(known)}"
  if out.exists() and not out.is_dir():
    return f"--out {out} is a file: give a folder"
  if not dry_run and _backend() == "cpu":  # The full-size steps would run for minutes on the CPU.
    return ("no GPU found (jax's backend is cpu): run this on the lent GPU machine, or pass --dry_run for the tiny "
            "shapes on the CPU")
  return None


def _case_refusal(cases: list[str]) -> str | None:
  """Why --cases cannot run (names no bench case); None when it can."""
  known = [row[0] for row in BENCH_CASES]
  unknown = [c for c in cases if c not in known]
  return f"--cases {','.join(unknown)}: use some of {','.join(known)}" if unknown else None


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder for accelerator_check.json and the runs")
  parser.add_argument("--work", default="", help="folder for the runs (default: OUT/runs)")
  parser.add_argument("--dry_run", action="store_true", help="tiny shapes on the CPU (the suite runs this)")
  parser.add_argument(
      "--xla_gpu_preset", default="", help="an XLA:GPU flag preset of core/xla_flags.GPU_PRESETS "
      "for this call (its steps and the runs it starts): a second call measures it")
  parser.add_argument(
      "--cases", default="", help="comma-separated bench cases (BENCH_CASES), in their order: a second "
      "call measures the cases the first left past its budget (default: all)")
  parser.add_argument(
      "--steps", default="", help="comma-separated steps, in order, or 'all' (default: the "
      f"speed table, {DEFAULT_STEPS}; with --dry_run: all)")
  a = parser.parse_args(argv)
  out = pathlib.Path(a.out)
  work = pathlib.Path(a.work) if a.work else out / "runs"
  steps: dict[str, Callable[[], dict[str, Any]]] = {
      "peer": lambda: peer(a.dry_run, out), "versions": versions, "attention": lambda: attention(a.dry_run),
      "attention_speed": lambda: attention_speed(a.dry_run),
      "bench": lambda: bench(a.dry_run, out, work, on_case=lambda rows: partial("bench", {"cases": rows}), cases=cases),
      "resume": lambda: resume(a.dry_run, work), "export": lambda: export(a.dry_run, work),
      "tests": lambda: tests(a.dry_run), "curves": lambda: accelerator_curves.curves(
          a.dry_run, work, make_tokenizer, on_run=lambda result: partial("curves", result))}
  asked = (ALL_STEPS if a.steps == "all" or (a.dry_run and not a.steps) else a.steps or DEFAULT_STEPS).split(",")
  cases = [c for c in a.cases.split(",") if c]
  refusal = _refusal(asked, list(steps), out, a.dry_run) or _case_refusal(cases)
  if a.xla_gpu_preset and not refusal:
    os.environ[xla_flags.GPU_PRESET_ENV] = a.xla_gpu_preset
    try:
      xla_flags.set_gpu_flags()  # Before JAX creates its GPU backend (the peer step does not use it).
    except UserError as e:
      refusal = f"--xla_gpu_preset: {e}"
  if refusal:
    print(f"error: {refusal}", file=sys.stderr)
    return 2
  out.mkdir(parents=True, exist_ok=True)
  work.mkdir(parents=True, exist_ok=True)
  if not a.dry_run and not jax.config.jax_compilation_cache_dir:  # remat=auto's chosen candidate: compiled once.
    jax.config.update("jax_compilation_cache_dir", str(work / "jit_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  report: dict[str, Any] = {
      "dry_run": a.dry_run, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "xla_gpu_preset": a.xla_gpu_preset,
      "xla_flags": os.environ.get("XLA_FLAGS", ""), "steps": {}}
  path = out / "accelerator_check.json"

  def partial(step: str, result: dict[str, Any]) -> None:  # A step's rows so far: a stopped check keeps them.
    report["steps"][step] = {**result, "partial": True}
    add_vs_peer(report)
    path.write_text(json.dumps(report, indent=1))

  for name in asked:
    t0 = time.perf_counter()
    try:
      result = steps[name]()
    except Exception as e:  # noqa: BLE001 - a failed step is recorded; the others still run.
      result = {
          "passed": False, "error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    result["seconds"] = time.perf_counter() - t0
    report["steps"][name] = result
    print(
        f"{name}: {'passed' if result.get('passed', True) else 'FAILED'} in {result['seconds']:.1f} s "
        f"{json.dumps({k: v for k, v in result.items() if k not in ('traceback', 'seconds')})[:600]}", flush=True)
    add_vs_peer(report)
    path.write_text(json.dumps(report, indent=1))  # After every step: a killed check keeps what it measured.
  if "bench" in report["steps"] or "peer" in report["steps"]:
    print(format_table(report), flush=True)
  if "curves" in report["steps"]:
    print("\n".join(accelerator_curves.format_lines(report["steps"]["curves"])), flush=True)
  failed = [n for n, r in report["steps"].items() if r.get("passed") is False]
  print(f"wrote {path}; " + (f"FAILED: {', '.join(failed)}" if failed else "every step passed"), flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())

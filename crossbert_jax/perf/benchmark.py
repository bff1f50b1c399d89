"""Train-step throughput: flat BERT vs CrossBERT at one encoder size, on one device (`bench`).

Times the real train step of `program.TrainProgram` (state donated, random ids, full rows) per case
in CASES, all sharing the config's encoder, batch and length, then the LONG_CASES at `long_len`
with dense and chunked attention (time and XLA's peak temporaries). A float32 matmul is the FLOP/s
ceiling. Times are medians of `steps` blocked steps after `warmup`; compile is timed apart.
"""

import datetime
import os
import statistics
import time
from typing import Any, Callable

import jax
import numpy as np
from etils import epath

from crossbert_jax.core import config as config_lib, host
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.perf import machine
from crossbert_jax.training import flops, objectives, program as program_lib, sharding

REFERENCE = "bert_r0.15"
# Targets (medians, float32): the half-width-reconstructor CrossBERT r=0.5 K=1
# sequences/s over BERT r=0.15 (by seq_len); every CrossBERT case's speed-up >= 0.97 of its FLOP
# bound; every case's achieved FLOP/s >= 75% of the reference matmul's.
SPEEDUP_TARGET = {256: 1.8, 512: 2.0}
FLOP_BOUND_FRACTION_TARGET = 0.97
MATMUL_FRACTION_TARGET = 0.75


def _set_crossbert(ratio: float, views: int, half_reconstructor: bool = False):
  def edit(c: config_lib.ConfigDict) -> None:
    c.objective = "crossbert"
    c.masking.ratio = ratio
    c.masking.views = views
    c.masking.reconstruct_ratio = 1.0
    if half_reconstructor:
      # Half width and half MLP; heads kept, so the head dim halves (must stay even for RoPE).
      c.reconstructor.embed_dim = c.model.embed_dim // 2
      c.reconstructor.mlp_dim = c.model.mlp_dim // 2
      c.reconstructor.num_heads = c.model.num_heads
      c.reconstructor.tie_head = False

  return edit


def _set_mlm(ratio: float):
  def edit(c: config_lib.ConfigDict) -> None:
    c.objective = "mlm"
    c.masking.ratio = ratio
    c.masking.views = 1
    c.masking.reconstruct_ratio = 1.0

  return edit


# (name, description, config edit). The first is the reference for every ratio.
CASES: tuple[tuple[str, str, Callable[[config_lib.ConfigDict], None]], ...] = (
    ("bert_r0.15", "BERT r=0.15", _set_mlm(0.15)),
    ("bert_r0.30", "BERT r=0.30", _set_mlm(0.30)),
    ("cb_r0.5_k1", "CrossBERT r=0.5 K=1", _set_crossbert(0.5, 1)),
    ("cb_r0.5_k2", "CrossBERT r=0.5 K=2", _set_crossbert(0.5, 2)),
    ("cb_r0.75_k1", "CrossBERT r=0.75 K=1", _set_crossbert(0.75, 1)),
    ("cb_r0.5_k1_half", "CrossBERT r=0.5 K=1 rec d/2", _set_crossbert(0.5, 1, half_reconstructor=True)),
)
# The long-context rows: each with the dense (xla) and the chunked attention.
LONG_CASES = (("bert_r0.15", _set_mlm(0.15)), ("cb_r0.5_k1", _set_crossbert(0.5, 1)))


def case_config(base: plan_lib.Settings | config_lib.ConfigDict, edit: Callable[[config_lib.ConfigDict], None],
                seq_len: int, attention: str = "", batch_size: int = 0, dtype: str = "float32") -> plan_lib.RunPlan:
  """The plan of `base` with the case's objective/masking keys, one-device mesh and `dtype`."""
  c = config_lib.from_dict(base.to_dict())
  c.unlock()
  edit(c)
  if seq_len:
    c.data.seq_len = seq_len
  if attention:
    c.model.attention = attention
  if batch_size:
    c.train.batch_size = batch_size
  c.model.dtype = dtype
  c.train.grad_accum = 1
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
  c.lock()
  return plan_lib.build(c)


def random_batch(c: plan_lib.Settings, seed: int = 0) -> dict[str, np.ndarray]:
  """Random token ids in [5, vocab), one full segment per row (text), positions 0..L-1, in the objective's batch
  shapes (`objectives.batch_shapes`: B x L packed rows, or the contrastive stage's B x T x L texts and
  B x T distinct text ids)."""
  rng = np.random.default_rng(seed)
  out = {}
  for key, shape in objectives.batch_shapes(c).items():
    if key == "tokens":
      out[key] = rng.integers(5, c.model.vocab_size, shape).astype(np.int32)
    elif key == "segment_ids":
      out[key] = np.ones(shape, np.int32)
    elif key == "positions":
      out[key] = np.broadcast_to(np.arange(shape[-1], dtype=np.int32), shape).copy()
    else:  # Per-text ids: all distinct (no duplicate to mask).
      out[key] = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
  return out


TRACED_STEPS = 3


def time_case(c: plan_lib.Settings, steps: int, warmup: int, trace_dir: str = "") -> dict[str, Any]:
  """Compile time and per-step times of the real train step for config `c`; with `trace_dir`, a
  jax.profiler trace of TRACED_STEPS more steps after the timed ones (untimed) is written there."""
  device = jax.devices()[0]
  mesh = sharding.make_mesh(c.mesh, devices=[device])
  train_program = program_lib.TrainProgram(c, mesh)
  state = train_program.init_state()
  batch = train_program.global_batch(random_batch(c))
  jax.block_until_ready((state, batch))

  t0 = time.perf_counter()
  if chosen := train_program.fit_compiled:  # remat=auto / grad_accum=0 compiled it already.
    compiled, compile_s = chosen
  else:
    compiled = train_program.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
  # XLA's buffer assignment: the step's peak temporaries (activations, scores, logits).
  temp_bytes = compiled.memory_analysis().temp_size_in_bytes

  def one_step(state):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    return state, metrics, time.perf_counter() - t0

  state, metrics, first_s = one_step(state)
  for _ in range(warmup):
    state, metrics, _ = one_step(state)
  times = []
  for _ in range(steps):
    state, metrics, dt = one_step(state)
    times.append(dt)
  if trace_dir:
    with jax.profiler.trace(trace_dir):
      for i in range(TRACED_STEPS):
        with jax.profiler.StepTraceAnnotation(program_lib.TRACE_STEP_NAME, step_num=i):
          state, metrics, _ = one_step(state)
  loss = float(metrics["loss"])
  if not np.isfinite(loss):
    raise RuntimeError(f"non-finite loss {loss} in the benchmark step")
  del state
  return {
      "compile_s": compile_s, "temp_bytes": temp_bytes, "remat": train_program.config.model.remat,
      "grad_accum": train_program.config.train.grad_accum, "first_step_s": first_s, "step_times_s": times,
      "median_s": statistics.median(times), "min_s": min(times), "loss": loss,
      "num_targets": float(metrics["num_targets"])}


def case_summary(c: plan_lib.Settings, timing: dict[str, Any]) -> dict[str, Any]:
  """Throughput and analytic FLOP numbers of one case from its timing."""
  b, seq_len = c.train.batch_size, c.data.seq_len
  med, best = timing["median_s"], timing["min_s"]
  flops_step = flops.train_flops_per_step(c)
  views, visible, slots = objectives.get(c.objective).encoder_shape(c)
  decoder = "reconstructor" in objectives.get(c.objective).spec.sections
  return {
      **timing,
      "objective": c.objective,
      "ratio": c.masking.ratio,
      "views": views,
      "attention": c.model.attention,
      "encoder_tokens_per_view": visible,
      "predicted_slots_per_view": slots,
      "reconstructor_embed_dim": c.reconstructor.embed_dim if decoder else None,
      "reconstructor_mlp_dim": c.reconstructor.mlp_dim if decoder else None,
      "reconstructor_num_heads": c.reconstructor.num_heads if decoder else None,
      "steps_per_s": 1.0 / med,
      "sequences_per_s": b / med,
      "tokens_per_s": b * seq_len / med,
      "sequences_per_s_best": b / best,
      "train_flops_per_step": flops_step,
      "forward_flops_per_sequence": flops.forward_flops_breakdown(c),
      "achieved_tflops": flops.achieved_tflops_per_device(flops_step, med, 1),
      "achieved_tflops_best": flops.achieved_tflops_per_device(flops_step, best, 1),}


def _status(ok: bool) -> str:
  return "PASS" if ok else "MISS"


def evaluate(results: dict[str, dict[str, Any]], matmul: dict[str, float], seq_len: int,
             reference: str = REFERENCE) -> list[dict]:
  """Adds ratios to every case (in place) and returns the target checks."""
  ref = results[reference]
  for r in results.values():
    r["seq_per_s_ratio_vs_bert"] = r["sequences_per_s"] / ref["sequences_per_s"]
    r["cost_per_sequence_vs_bert"] = r["median_s"] / ref["median_s"]
    # What the ratio would be if every case ran at the same FLOP/s: the FLOP-count bound.
    r["analytic_seq_per_s_ratio_vs_bert"] = ref["train_flops_per_step"] / r["train_flops_per_step"]
    r["fraction_of_matmul"] = r["achieved_tflops"] / matmul["tflops_median"]
  checks = []
  if "cb_r0.5_k1_half" in results:
    target = SPEEDUP_TARGET.get(seq_len, SPEEDUP_TARGET[512] if seq_len > 512 else SPEEDUP_TARGET[256])
    got = results["cb_r0.5_k1_half"]["seq_per_s_ratio_vs_bert"]
    checks.append({
        "target": f"CrossBERT r=0.5 K=1 rec d/2 sequences/s >= {target}x BERT r=0.15 (L={seq_len})", "value": got,
        "threshold": target, "pass": got >= target})
  for name, r in results.items():
    if r["objective"] != ref["objective"]:  # Every case of another objective than the reference's.
      got = r["seq_per_s_ratio_vs_bert"] / r["analytic_seq_per_s_ratio_vs_bert"]
      checks.append({
          "target": f"{name}: speed-up >= {FLOP_BOUND_FRACTION_TARGET} of its FLOP bound", "value": got,
          "threshold": FLOP_BOUND_FRACTION_TARGET, "pass": got >= FLOP_BOUND_FRACTION_TARGET})
  for name, r in results.items():
    got = r["fraction_of_matmul"]
    checks.append({
        "target": f"{name}: achieved FLOP/s >= {MATMUL_FRACTION_TARGET:.0%} of the matmul's", "value": got,
        "threshold": MATMUL_FRACTION_TARGET, "pass": got >= MATMUL_FRACTION_TARGET})
  return checks


def format_table(results: dict[str, dict[str, Any]], descriptions: dict[str, str]) -> str:
  """A plain, aligned text table of every case."""
  header = ("case", "attention", "enc tok", "compile s", "median ms", "min ms", "temp MiB", "seq/s", "tok/s",
            "GFLOP/step", "TFLOP/s", "% matmul", "seq/s vs BERT", "FLOP bound")
  rows = [header]
  for name, r in results.items():
    enc = f"{r['views']}x{r['encoder_tokens_per_view']}"
    rows.append((descriptions[name], r["attention"], enc, f"{r['compile_s']:.1f}", f"{1e3 * r['median_s']:.0f}",
                 f"{1e3 * r['min_s']:.0f}", f"{r['temp_bytes'] / 2**20:.0f}", f"{r['sequences_per_s']:.2f}",
                 f"{r['tokens_per_s']:.0f}", f"{r['train_flops_per_step'] / 1e9:.0f}", f"{r['achieved_tflops']:.4f}",
                 f"{100 * r['fraction_of_matmul']:.0f}%", f"{r['seq_per_s_ratio_vs_bert']:.2f}x",
                 f"{r['analytic_seq_per_s_ratio_vs_bert']:.2f}x"))
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  lines = []
  for j, row in enumerate(rows):
    cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]
    lines.append("  ".join(cells))
    if j == 0:
      lines.append("  ".join("-" * w for w in widths))
  return "\n".join(lines)


def run_long(base: plan_lib.Settings, long_len: int, long_batch: int, steps: int,
             warmup: int) -> dict[str, dict[str, Any]]:
  """BERT r=0.15 and CrossBERT r=0.5 K=1 at `long_len`, dense vs chunked attention: time and memory."""
  results = {}
  for name, edit in LONG_CASES:
    for attention in ("xla", "chunked"):
      c = case_config(base, edit, long_len, attention=attention, batch_size=long_batch)
      results[f"{name}_{attention}"] = r = case_summary(c, time_case(c, steps, warmup))
      print(
          f"L={long_len} {name} {attention}: median step {1e3 * r['median_s']:.0f} ms, "
          f"temporaries {r['temp_bytes'] / 2**20:.0f} MiB", flush=True)
  return results


def run(base: plan_lib.Settings, *, seq_len: int, steps: int, warmup: int, out: str, case_names: list[str],
        matmul_size: int, matmul_repeats: int, long_len: int = 0, long_batch: int = 2) -> dict[str, Any]:
  """Runs every case and the reference matmul; prints the table and writes JSON to `out`."""
  if steps < 1 or warmup < 0:
    raise UserError(f"--steps must be >= 1 and --warmup >= 0, got steps={steps} warmup={warmup}")
  if seq_len < 0 or long_len < 0:
    raise UserError(f"--seq_len and --long_len must be >= 0 (0: the config's / skip), got {seq_len}, {long_len}")
  known = [name for name, _, _ in CASES]
  unknown = [n for n in case_names if n not in known]
  if unknown:
    raise UserError(f"--cases: unknown {unknown}; use names from {known}")
  selected = [case for case in CASES if not case_names or case[0] in case_names or case[0] == REFERENCE]
  configs = {name: case_config(base, edit, seq_len) for name, _, edit in selected}
  descriptions = {name: desc for name, desc, _ in selected}
  load_start = os.getloadavg()
  started = datetime.datetime.now(datetime.timezone.utc)

  matmul = machine.time_matmul(matmul_size, matmul_repeats)
  print(
      f"matmul {matmul_size}^3 float32: {1e3 * matmul['median_s']:.1f} ms median, "
      f"{matmul['tflops_median']:.4f} TFLOP/s", flush=True)
  results = {}
  for name, c in configs.items():
    timing = time_case(c, steps, warmup)
    results[name] = case_summary(c, timing)
    print(
        f"{descriptions[name]}: compile {timing['compile_s']:.1f} s, median step "
        f"{1e3 * timing['median_s']:.0f} ms", flush=True)
  long = run_long(base, long_len, long_batch, steps, warmup) if long_len else {}
  matmul_end = machine.time_matmul(matmul_size, matmul_repeats)
  load_end = os.getloadavg()

  length = configs[REFERENCE].data.seq_len
  checks = evaluate(results, matmul, length)
  if long:
    evaluate(long, matmul, long_len, reference=f"{REFERENCE}_xla")
  _print_summary(configs[REFERENCE], results, descriptions, checks, long, matmul, matmul_end, steps=steps,
                 warmup=warmup, load=(load_start[0], load_end[0]), long_len=long_len, long_batch=long_batch)
  report = {
      **_machine(started, load_start, load_end),
      "seq_len": length,
      "steps": steps,
      "warmup": warmup,
      "matmul": matmul,
      "matmul_end": matmul_end,
      "cases": results,
      "checks": checks,
      "long": long,
      "configs": {name: c.to_dict() for name, c in configs.items()},}
  path = epath.Path(out)
  if str(path.parent) not in ("", "."):
    path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(_dumps(report))
  print(f"wrote {path}")
  return report


def _machine(started: datetime.datetime, load_start: tuple[float, ...], load_end: tuple[float, ...]) -> dict[str, Any]:
  """Where and when the benchmark ran: the head of its JSON."""
  return {
      "date": started.isoformat(timespec="seconds"),
      "jax_version": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "device_kind": jax.devices()[0].device_kind,
      "platform": jax.devices()[0].platform,
      "cpu_model": host.cpu_model(),
      "cpu_count": os.cpu_count(),
      "load_avg_start": list(load_start),
      "load_avg_end": list(load_end),}


def _print_summary(c0: plan_lib.Settings, results: dict[str, dict[str, Any]], descriptions: dict[str, str],
                   checks: list[dict], long: dict[str, dict[str, Any]], matmul: dict[str,
                                                                                     float], matmul_end: dict[str,
                                                                                                              float], *,
                   steps: int, warmup: int, load: tuple[float, float], long_len: int, long_batch: int) -> None:
  """The shape line, the case table, the PASS/MISS lines and the long-context table."""
  print()
  print(f"L={c0.data.seq_len} batch={c0.train.batch_size} d={c0.model.embed_dim} heads={c0.model.num_heads} "
        f"layers={c0.model.num_layers} rec_layers={c0.reconstructor.num_layers} vocab={c0.model.vocab_size} "
        f"float32, {steps} timed steps after {warmup} warmup; {jax.devices()[0].device_kind} "
        f"({os.cpu_count()} CPUs), load avg {load[0]:.2f} -> {load[1]:.2f}")
  print(format_table(results, descriptions))
  print(f"reference matmul {matmul['n']}^3: {matmul['tflops_median']:.4f} TFLOP/s at start, "
        f"{matmul_end['tflops_median']:.4f} at end")
  if "cb_r0.5_k2" in results:
    print(f"CrossBERT r=0.5 K=2 cost per sequence vs BERT r=0.15: "
          f"{results['cb_r0.5_k2']['cost_per_sequence_vs_bert']:.2f}x")
  for check in checks:
    print(f"{_status(check['pass'])}  {check['target']}: {check['value']:.2f}")
  if long:
    print(f"\nL={long_len} batch={long_batch}: dense (xla) vs chunked attention")
    print(format_table(long, {n: n for n in long}))


def _dumps(obj: Any) -> str:
  import json

  def default(x):
    if isinstance(x, (np.generic,)):
      return x.item()
    if isinstance(x, (tuple, set)):
      return list(x)
    return str(x)

  def clean(x):
    if isinstance(x, float) and not np.isfinite(x):
      return None
    if isinstance(x, dict):
      return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
      return [clean(v) for v in x]
    return x

  return json.dumps(clean(obj), indent=1, default=default)

r"""The peer in the accelerator check: transformers' ModernBertForMaskedLM (torch) trained at our bench's shape.

  python tools/peer_modernbert.py --out=OUT/peer.json [--shape=base] [--batch=32] [--seq_len=1024]
      [--attn=sdpa,flash_attention_2] [--compile=eager,compiled] [--steps=10] [--warmup=3] [--budget_s=240]

ModernBERT-base's layout (22 layers, d=768, GeGLU 1152, vocab 50368, global attention every 3rd
layer, the others a 128-token window), full rows of random ids, BERT's 15% of each row as labels
and the head on those only (`sparse_prediction`), AdamW (fused on a GPU) with global-norm clipping
at 1.0 (as our step), bf16 autocast over float32 params. One variant per attention implementation
(flash_attention_2 only where `flash_attn` is installed) with and without `torch.compile`; each:
the first step (compile included) timed apart, `--warmup` untimed steps, the median of `--steps`.
Tokens/s count row slots (B x L, as our bench); MFU uses OUR FLOP formula (training/flops.py: 3x the
forward's matmuls, full L x L attention in every layer, the head on the masked slots) for the same
shape, over the chip's dense bf16 peak (perf/roofline.py), so the two sides' MFU compare directly.
`--budget_s`: variants that would start after it are recorded as skipped. `--shape=tiny` with
`--device=cpu` is the suite's run (tests/unit/test_peer_modernbert.py). Writes one JSON; exit 0 when
a variant was measured.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # JAX only counts FLOPs here: the GPU is torch's.
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crossbert_jax.core import config as config_lib  # noqa: E402
from crossbert_jax.core import plan as plan_lib  # noqa: E402
from crossbert_jax.perf import benchmark, roofline  # noqa: E402
from crossbert_jax.training import flops  # noqa: E402

RATIO = 0.15
GLOBAL_EVERY, WINDOW = 3, 128


def our_plan(shape: str, batch: int, seq_len: int) -> plan_lib.RunPlan:
  """Our BERT r=0.15 bench case at this shape with ModernBERT's layer pattern (the FLOP count's input)."""
  c = benchmark.case_config(config_lib.get_config("crossbert", shape), benchmark.CASES[0][2], seq_len, batch_size=batch,
                            dtype="bfloat16")
  return plan_lib.with_keys(c, {"model.global_every": GLOBAL_EVERY, "model.local_window": WINDOW})


def hf_config(c: plan_lib.Settings, attn: str):
  from transformers import ModernBertConfig  # pylint: disable=g-import-not-at-top

  m = c.model
  return ModernBertConfig(vocab_size=m.vocab_size, hidden_size=m.embed_dim, intermediate_size=m.mlp_dim,
                          num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                          global_attn_every_n_layers=m.global_every, local_attention=m.local_window,
                          max_position_embeddings=max(8192,
                                                      c.data.seq_len), pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          cls_token_id=1, sep_token_id=2, sparse_prediction=True, attn_implementation=attn)


def _inputs(c: plan_lib.Settings, device, seed: int = 0):
  import torch  # pylint: disable=g-import-not-at-top

  b, seq_len, vocab = c.train.batch_size, c.data.seq_len, c.model.vocab_size
  g = torch.Generator().manual_seed(seed)
  ids = torch.randint(5, vocab, (b, seq_len), generator=g)
  masked = round(RATIO * seq_len)  # Per row, as our masking.
  picked = torch.rand((b, seq_len), generator=g).argsort(dim=1)[:, :masked]
  labels = torch.full_like(ids, -100).scatter(1, picked, ids.gather(1, picked))
  ids = ids.scatter(1, picked, torch.full_like(picked, 4))  # [MASK]
  return ids.to(device), torch.ones_like(ids).to(device), labels.to(device)


def run_variant(c: plan_lib.Settings, attn: str, compiled: bool, device, steps: int, warmup: int) -> dict[str, Any]:
  """Step time, tokens/s and peak memory of one variant (the model built anew)."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import ModernBertForMaskedLM  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  model = ModernBertForMaskedLM(hf_config(c, attn)).to(device)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                          fused=device.type == "cuda")
  forward = torch.compile(model) if compiled else model
  ids, mask, labels = _inputs(c, device)
  sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
  if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats()

  def step() -> float:
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16):
      loss = forward(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    step.loss = float(loss.detach())
    return time.perf_counter() - t0

  first_s = step()
  for _ in range(warmup):
    step()
  times = [step() for _ in range(steps)]
  median = statistics.median(times)
  return {
      "attn_implementation": attn, "torch_compile": compiled, "first_step_s": first_s, "step_times_s": times,
      "median_step_s": median, "tokens_per_s": c.train.batch_size * c.data.seq_len / median, "loss": step.loss,
      "params": sum(p.numel() for p in model.parameters()),
      "peak_bytes_allocated": torch.cuda.max_memory_allocated() if device.type == "cuda" else None}


def _version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="the JSON to write")
  parser.add_argument("--shape", default="base", help="our variant whose encoder shape to use (base, tiny, ...)")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=1024)
  parser.add_argument("--attn", default="sdpa,flash_attention_2", help="attention implementations to try")
  parser.add_argument("--compile", default="eager,compiled", help="eager and/or compiled (torch.compile)")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--budget_s", type=float, default=240.0, help="no variant starts after this many seconds")
  parser.add_argument("--device", default="", help="cuda or cpu (default: cuda when available)")
  a = parser.parse_args(argv)
  modes = a.compile.split(",")
  bad = [m for m in modes if m not in ("eager", "compiled")]
  if bad or a.shape not in config_lib.VARIANTS or min(a.batch, a.seq_len, a.steps) < 1 or a.warmup < 0:
    print(
        f"error: --compile={a.compile} --shape={a.shape} --batch={a.batch} --seq_len={a.seq_len} --steps={a.steps}: "
        f"use eager/compiled, one of {', '.join(config_lib.VARIANTS)}, positive sizes", file=sys.stderr)
    return 2
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("error: torch is not importable here: the peer needs torch and transformers", file=sys.stderr)
    return 2
  device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
  kind = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
  chip = roofline.chip_for(kind)
  c = our_plan(a.shape, a.batch, a.seq_len)
  step_flops = flops.train_flops_per_step(c)
  report: dict[str, Any] = {
      "model": "transformers ModernBertForMaskedLM", "shape": a.shape, "batch_size": a.batch, "seq_len": a.seq_len,
      "global_every": GLOBAL_EVERY, "local_window": WINDOW, "mask_ratio": RATIO, "device": kind,
      "chip": chip.name if chip else None, "train_flops_per_step": step_flops,
      "versions": {n: _version(n) for n in ("torch", "transformers", "flash-attn")}, "variants": {}}
  t_start = time.perf_counter()
  for attn in a.attn.split(","):
    for mode in modes:
      name = f"{attn}{'+compile' if mode == 'compiled' else ''}"
      if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        report["variants"][name] = {"skipped": "flash_attn is not installed"}
        continue
      if time.perf_counter() - t_start > a.budget_s:
        report["variants"][name] = {"skipped": f"past --budget_s={a.budget_s:g}"}
        continue
      try:
        row = run_variant(c, attn, mode == "compiled", device, a.steps, a.warmup)
        row["achieved_tflops"] = step_flops / row["median_step_s"] / 1e12
        row["mfu"] = step_flops / row["median_step_s"] / chip.peak_flops if chip else None
      except Exception as e:  # noqa: BLE001 - a variant this machine cannot run is recorded, not fatal.
        row = {"error": f"{type(e).__name__}: {e}"[:500]}
      report["variants"][name] = row
      print(
          f"peer {name}: " + (f"{1e3 * row['median_step_s']:.1f} ms, {row['tokens_per_s']:,.0f} tok/s" +
                              (f", MFU {100 * row['mfu']:.1f}%" if row.get("mfu") else "")
                              if "median_step_s" in row else row.get("error", "")), flush=True)
      if device.type == "cuda":
        torch.cuda.empty_cache()
  measured = {n: r for n, r in report["variants"].items() if "tokens_per_s" in r}
  if measured:
    best = max(measured, key=lambda n: measured[n]["tokens_per_s"])
    report["best"], report["best_tokens_per_s"] = best, measured[best]["tokens_per_s"]
  report["seconds"] = time.perf_counter() - t_start
  path = pathlib.Path(a.out)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(report, indent=1))
  return 0 if measured else 1


if __name__ == "__main__":
  sys.exit(main())

"""The data benchmark: what one input process supplies against what each host's chips consume.

  python -m crossbert_jax.bench --data --out=FILE.json      (table on stdout, JSON in FILE)

Supply (data/throughput.py): tokens/s and fill ratio of one process for every format at each
length and worker count (a SentencePiece model), and for text and pre-tokenized shards through a
Hugging Face BPE (workers=0). Demand: analytic training FLOPs per token (training/flops.py, at that
length) x chips per host x the chip's dense bf16 peak x 50% MFU, for `base` and `large`,
CrossBERT and BERT (MLM). Headroom = supply / demand; below 1 the input caps the run. GPUs run
one process per GPU, so their "host" is one chip.
"""

import json
import os
import pathlib
import platform
import tempfile
import time
from typing import Any

from etils import epath

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import throughput
from crossbert_jax.training import flops

MFU = 0.5
# (accelerator, flops.PEAK_TFLOPS key, chips per host or per process).
HOSTS = (("v5p", "TPU v5p", 4), ("v5e", "TPU v5e", 4), ("v6e", "TPU v6e", 4), ("H100", "H100", 1), ("H200", "H200", 1))
SIZES = ("base", "large")
OBJECTIVES = {"crossbert": "crossbert", "bert": "mlm"}


def demand(seq_len: int) -> list[dict[str, Any]]:
  """Tokens/s each host (or GPU process) consumes at 50% MFU, per size and objective."""
  rows = []
  for size in SIZES:
    for name, objective in OBJECTIVES.items():
      c = config_lib.get_config(objective, size)
      c.data.seq_len = seq_len
      c = plan_lib.build(c)
      per_token = flops.train_flops_per_sequence(c) / seq_len
      for accel, key, chips in HOSTS:
        peak = flops.PEAK_TFLOPS[key]["bfloat16"] * 1e12
        rows.append({
            "size": size, "objective": name, "accelerator": accel, "chips": chips, "seq_len": seq_len,
            "flops_per_token": per_token, "tokens_per_s": chips * peak * MFU / per_token})
  return rows


def supply(paths: dict[str, str], tok, seq_lens: list[int], worker_counts: list[int], seconds: float,
           tokenizer: str = "sentencepiece") -> list[dict[str, Any]]:
  """One process's rate for every format (of `paths`) x length x worker count."""
  rows = []
  for seq_len in seq_lens:
    for fmt in [f for f in throughput.FORMATS if f in paths]:
      for workers in worker_counts:
        r = throughput.measure(throughput.data_config(paths[fmt], seq_len, workers), tok, seconds=seconds)
        rows.append({"format": fmt, "tokenizer": tokenizer, "seq_len": seq_len, "worker_count": workers, **r})
        print(
            f"  {fmt:<20} {tokenizer:<13} L={seq_len:<5} workers={workers}  {r['tokens_per_s'] / 1e6:7.3f} M tokens/s  "
            f"fill {r['fill_ratio']:.3f}", flush=True)
  return rows


def _table(supply_rows: list[dict[str, Any]], demand_rows: list[dict[str, Any]], seq_len: int) -> str:
  best = {
      r["format"]: r["tokens_per_s"]
      for r in supply_rows
      if r["seq_len"] == seq_len and r["worker_count"] == 0 and r["tokenizer"] == "sentencepiece"}
  lines = [
      f"demand per host at L={seq_len} (50% MFU) and headroom = supply (workers=0) / demand",
      f"{'size':<6} {'objective':<10} {'accel':<6} {'chips':>5} {'demand M/s':>11} {'text x':>8} "
      f"{'pretok x':>9}"]
  for d in demand_rows:
    if d["seq_len"] != seq_len:
      continue
    lines.append(f"{d['size']:<6} {d['objective']:<10} {d['accelerator']:<6} {d['chips']:>5} "
                 f"{d['tokens_per_s'] / 1e6:>11.3f} {best.get('text', 0) / d['tokens_per_s']:>8.2f} "
                 f"{best.get('arrayrecord_tokens', 0) / d['tokens_per_s']:>9.2f}")
  return "\n".join(lines)


def run(out: str, *, books: int = 20, seq_lens: tuple[int, ...] = (512, 8192), worker_counts: tuple[int,
                                                                                                    ...] = (0, 1, 2),
        seconds: float = 1.0, tokenizer: str = "", corpus: str = "") -> dict[str, Any]:
  """Builds the corpora (in a temporary folder), measures, prints the tables and writes `out`."""
  corpus = corpus or os.path.join(os.environ.get("CROSSBERT_DATA", "../shared/data"), "gutenberg")
  files = sorted(pathlib.Path(corpus).glob("*.txt"))[:books]
  if not files:
    raise UserError(f"--data: no *.txt books in {corpus}: set CROSSBERT_DATA to the shared data folder")
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="crossbert-feed-") as tmp:
    paths, tok = throughput.corpora(files, pathlib.Path(tmp), tokenizer_path=tokenizer)
    print(f"corpora: {len(files)} books in 5 formats ({time.perf_counter() - t0:.0f} s)", flush=True)
    supply_rows = supply(paths, tok, list(seq_lens), list(worker_counts), seconds)
    # The same text through a Hugging Face BPE (ModernBERT's kind), in one process.
    hf_paths, hf_tok = throughput.hf_corpora(paths, pathlib.Path(tmp) / "hf")
    supply_rows += supply(hf_paths, hf_tok, list(seq_lens), [0], seconds, tokenizer="hf_bpe")
  demand_rows = [d for L in seq_lens for d in demand(L)]
  for L in seq_lens:
    print(_table(supply_rows, demand_rows, L))
  result = {
      "supply": supply_rows, "demand": demand_rows, "mfu": MFU, "books": len(files), "vocab_size": tok.vocab_size,
      "host": platform.node(), "load_avg": list(_load()), "wall_s": time.perf_counter() - t0}
  epath.Path(out).write_text(json.dumps(result, indent=1))
  print(f"wrote {out}")
  return result


def main(out: str) -> None:
  """`bench --data`: the defaults above (about 2 minutes on an idle 2-core host)."""
  run(out)


def _load() -> tuple[float, ...]:
  try:
    return os.getloadavg()
  except OSError:
    return ()

"""sha256 of the lowered train step (StableHLO text, no debug info) for a fixed set of configs.

A refactor that only moves code must leave every hash unchanged: the step computes exactly what
it computed before. `python tools/lowered_hashes.py --out=F.json` writes {case: hash}; with
`--against=F.json` it compares and exits 1 naming every case that differs.

Each case is built the way the train command builds its program (the config validated, phases
expanded, the first phase's program on a one-device mesh), so the hash covers the config front
end, the objective seam and the program.
"""

import argparse
import hashlib
import json
import sys

import jax

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.training import program as program_lib
from crossbert_jax.training import sharding

CASES = {
    "crossbert_tiny": ("crossbert", "tiny", {}),
    "mlm_tiny": ("mlm", "tiny", {}),
    "crossbert_tiny_k2_accum2": ("crossbert", "tiny", {"masking.views": 2, "train.grad_accum": 2}),
    "crossbert_tiny_rec_self_attn":
        ("crossbert", "tiny", {"reconstructor.self_attention": True, "reconstructor.feature_mixing": True}),
    "mlm_tiny_scan_remat_bf16":
        ("mlm", "tiny", {"model.scan_layers": True, "model.remat": "full", "model.dtype": "bfloat16"}),
    "crossbert_small_wsd": ("crossbert", "small", {"train.decay": "wsd", "data.seq_len": 128}),}


def lowered_hash(objective: str, variant: str, overrides: dict) -> str:
  c = config_lib.get_config(objective, variant)
  for key, value in overrides.items():
    section, name = key.split(".")
    c[section][name] = value
  phase = plan_lib.build(c).phases[0]
  mesh = sharding.make_mesh(phase.config.mesh, devices=jax.devices()[:1])
  lowered = program_lib.TrainProgram(phase.config, mesh).lower()
  return hashlib.sha256(lowered.as_text(debug_info=False).encode()).hexdigest()


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="", help="write {case: sha256} here")
  ap.add_argument("--against", default="", help="compare with a file written by --out")
  args = ap.parse_args()
  hashes = {name: lowered_hash(*case) for name, case in CASES.items()}
  for name, h in hashes.items():
    print(f"{name:32s} {h}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"jax": jax.__version__, "hashes": hashes}, f, indent=1)
  if args.against:
    with open(args.against) as f:
      want = json.load(f)["hashes"]
    differ = [n for n in want if hashes.get(n) != want[n]]
    if differ:
      print(f"lowered train step changed: {', '.join(differ)}")
      return 1
    print(f"all {len(want)} lowered train steps hash identically")
  return 0


if __name__ == "__main__":
  sys.exit(main())

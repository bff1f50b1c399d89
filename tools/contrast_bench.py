"""The contrastive stage's train step: examples/s on this machine, and a projected recipe time from FLOPs.

  python tools/contrast_bench.py [--steps=5]

Times the real jitted step (`training.program.TrainProgram` of objective=contrast: the encoder on every
text, InfoNCE over the batch, AdamW) of `configs/contrast.py:tiny_pairs` at the `tiny` and `small`
encoder shapes, on one device, float32, random ids in full rows (`perf/benchmark.time_case`); then
projects ModernBERT's train_st.py recipe (`base_pairs`: 1.25M triplets at batch 512, L = 256, GradCache)
from the analytic FLOPs (`training/flops.py`: 3x the forward per text for the step, plus GradCache's
second forward) at an assumed MFU on an H100 / H200 (989 dense bf16 TFLOP/s).
"""

import argparse
import importlib.util
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crossbert_jax.core import plan as plan_lib  # noqa: E402  (after the path set-up)
from crossbert_jax.core import sections  # noqa: E402
from crossbert_jax.perf import benchmark  # noqa: E402
from crossbert_jax.training import flops  # noqa: E402

TRIPLETS, H100_BF16_TFLOPS = 1_250_000, 989.0


def _config(variant: str):
  spec = importlib.util.spec_from_file_location("contrast_configs", ROOT / "configs" / "contrast.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(variant)
  c.contrast.init_from = "unused"  # The shape is set here; nothing is loaded.
  return c


def _shaped(c, shape: str, batch: int, seq_len: int):
  d, heads, layers, mlp, vocab = sections.ENCODER_SHAPES[shape]
  for k, v in dict(embed_dim=d, num_heads=heads, num_layers=layers, mlp_dim=mlp, vocab_size=vocab).items():
    c.model[k] = v
  c.train.batch_size, c.data.seq_len = batch, seq_len
  return plan_lib.build(c)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args()
  rows = {}
  for shape, batch, seq_len in (("tiny", 32, 32), ("small", 32, 128)):
    plan = _shaped(_config("tiny_pairs"), shape, batch, seq_len)
    timing = benchmark.time_case(plan.phases[0].config, steps=args.steps, warmup=1)
    rows[f"{shape} B={batch} L={seq_len} triplets"] = {
        "median_step_s": timing["median_s"], "examples_per_s": batch / timing["median_s"],
        "texts_per_s": 3 * batch / timing["median_s"], "loss": timing["loss"]}
  base = plan_lib.build(_config("base_pairs").copy_and_resolve_references()).phases[0].config
  per_step = flops.train_flops_per_step(base) * 4 / 3  # GradCache: one more forward of every text.
  steps = -(-TRIPLETS // base.train.batch_size)
  for mfu in (0.3, 0.4):
    rows[f"base_pairs projected at MFU {mfu:.0%}"] = {
        "flops_per_step": per_step, "steps": steps, "hours": steps * per_step / (mfu * H100_BF16_TFLOPS * 1e12) / 3600}
  print(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()

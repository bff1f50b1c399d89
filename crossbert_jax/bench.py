r"""Train-step throughput of flat BERT vs CrossBERT on one device, or with --data the input pipeline.

  python -m crossbert_jax.bench --config=configs/crossbert.py:small --out=bench.json
  python -m crossbert_jax.bench --data --out=feed.json

Prints tables (PASS/MISS per target) and writes JSON; what the cases are and the current figures:
docs/benchmarks.md. Library: crossbert_jax.perf.benchmark and crossbert_jax.perf.feed_bench.
"""

from absl import app, flags
from ml_collections import config_flags

from crossbert_jax.core import config as config_lib, outputs, xla_flags
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError, exit_on_user_error, no_positional, parse_flags_or_exit
from crossbert_jax.perf import benchmark, feed_bench

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/crossbert.py:small.",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", "bench_results.json", "Where to write the JSON results (any epath).")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 0, "Sequence length override (0: the config's data.seq_len).")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per case.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps per case after compilation.")
_MATMUL = flags.DEFINE_integer("matmul_size", 2048, "N of the N x N @ N x N float32 reference matmul.")
_MATMUL_REPEATS = flags.DEFINE_integer("matmul_repeats", 10, "Timed runs of the reference matmul.")
_CASES = flags.DEFINE_list(
    "cases", [], "Subset of case names to run (default: all). The reference "
    "case bert_r0.15 is always run.")
_LONG_LEN = flags.DEFINE_integer("long_len", 2048, "Length of the dense-vs-chunked attention rows (0: skip).")
_LONG_BATCH = flags.DEFINE_integer("long_batch", 2, "Batch of the dense-vs-chunked attention rows.")
_PHASE = flags.DEFINE_integer("phase", 0, "Of a phased config: the phase whose batch, length, RoPE to time.")
_DATA = flags.DEFINE_bool("data", False, "Run the input-pipeline benchmark instead (perf/feed_bench.py).")
_FORCE = flags.DEFINE_bool("force", False, "Replace an existing --out file.")
# The train-step flags `--data` has no use for: given with it, they are refused rather than ignored.
_TRAIN_STEP_ONLY = ("config", "seq_len", "steps", "warmup", "cases", "long_len", "long_batch", "phase", "matmul_size",
                    "matmul_repeats")


@exit_on_user_error
def main(argv: list[str]) -> None:
  no_positional(argv, ": use --flag=value")
  outputs.check_output_file(_OUT.value, "--out", force=_FORCE.value)  # Before minutes of timing, not after.
  if _DATA.value:
    given = [f"--{name}" for name in _TRAIN_STEP_ONLY if flags.FLAGS[name].present]
    if given:
      raise UserError(f"{given[0]} does nothing with --data (the input-pipeline benchmark has its own fixed "
                      "cases): drop it, or drop --data to time train steps")
    return feed_bench.main(_OUT.value)
  xla_flags.set_cpu_flags()
  xla_flags.set_gpu_flags()
  plan = plan_lib.build(config_lib.from_flag(_CONFIG.value))
  phase = plan.phase(_PHASE.value, "--phase")
  if len(plan.phases) > 1 or plan.train.phases:
    print(f"timing {phase.describe()}; --phase=N picks another", flush=True)
  benchmark.run(phase.config, seq_len=_SEQ_LEN.value, steps=_STEPS.value, warmup=_WARMUP.value, out=_OUT.value,
                case_names=_CASES.value, matmul_size=_MATMUL.value, matmul_repeats=_MATMUL_REPEATS.value,
                long_len=_LONG_LEN.value, long_batch=_LONG_BATCH.value)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)

r"""Pre-flight: compile the real train step for a TPU topology (or the local devices) and report.

  python -m crossbert_jax.compile --config=configs/crossbert.py:base --topology=v5p:4x4x8 \
      [--config.key=value ...] [--out=compile.json [--force]]

Prints per-device memory (arguments, temporaries, outputs, total against the chip's HBM),
FLOPs per device, the collectives per step, a roofline estimate (compute, memory and
communication bound step times, which binds, the MFU it allows: an upper bound, not a
measurement; perf/roofline.py), the param sharding table and the compile time, and writes
them as JSON with --out. Exits 2 with one line when the step does not fit, the mesh does not divide the devices
or the batch does not shard. A TPU topology needs libtpu (`make setup-tpu`), not a TPU: run it
with JAX_PLATFORMS=cpu on any host. Topologies: v5p:4x4x8 is v5p-256 (128 chips), v5e:4x4 is
v5e-16, v4:2x2x2 is v4-16.
"""

import json

from absl import app, flags
from ml_collections import config_flags

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError, exit_on_user_error, no_positional, parse_flags_or_exit
from crossbert_jax.hf import import_config
from crossbert_jax.run import fork
from crossbert_jax.perf import aot, machine

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file and variant, e.g. configs/crossbert.py:base.",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string(
    "topology", "", "TPU topology GENERATION:SHAPE, e.g. v5p:4x4x8 (v5p-256) or "
    "v5e:4x4; empty: the local devices.")
_OUT = flags.DEFINE_string("out", "", "Write the report as JSON here (any epath); an existing file only with --force.")
_FORCE = flags.DEFINE_bool("force", False, "Replace an existing --out file.")
_CHIP = flags.DEFINE_string(
    "chip", "", "The roofline's chip: v4, v5e, v5p, v6e, h100, h200, or 'measured' (this "
    "machine's matmul FLOP/s and memory bandwidth); empty: the topology's or the device's.")
_PARAMS = flags.DEFINE_bool("print_params", True, "Print the param sharding table.")


@exit_on_user_error
def main(argv: list[str]) -> None:
  no_positional(argv, ": use --flag=value")
  # from_hf: the imported model's shape, a fork's through its source's train.init_from.
  c = plan_lib.build(import_config.resolve(fork.with_source_init(config_lib.from_flag(_CONFIG.value))))
  # Before the slow compile.
  path = outputs.check_output_file(_OUT.value, "--out", force=_FORCE.value) if _OUT.value else None
  chip = machine.measured_chip() if _CHIP.value == "measured" else _CHIP.value
  # Progress lines, flushed: stdout to a file is block-buffered, and the compile takes minutes at pod scale.
  report = aot.compile_train_step(c, _TOPOLOGY.value, chip, log=lambda msg: print(msg, flush=True))
  print(aot.format_report(report, params=_PARAMS.value), flush=True)
  if path is not None:
    try:
      path.write_text(json.dumps(report, indent=1))
    except OSError as e:
      raise UserError(f"--out={path} could not be written ({e.strerror or type(e).__name__}); "
                      "choose a writable path") from None
    print(f"wrote {path}", flush=True)
  aot.check_fits(report, c)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)

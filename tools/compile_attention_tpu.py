r"""Compile the real train step for a TPU topology with each attention backend; per-chip memory.

  JAX_PLATFORMS=cpu PYTHONPATH=. .venv-tpu/bin/python tools/compile_attention_tpu.py \
      --variant=base --seq_len=8192 --topology=v5p:2x2x1 --attention=xla,splash --out=/tmp/mem.json

Needs libtpu (jax[tpu], the pod-ready venv), not a TPU: the topology's compile-only devices run
the same SPMD partitioner, Mosaic (Pallas) compiler and memory planner as the pod. One sequence
per chip, bf16 compute, scan over layers and full remat (the pod settings); prints
`compiled.memory_analysis()` per chip for every backend side by side and writes JSON.
"""

import json
import os
import time

import jax
from absl import app, flags
from jax.experimental import topologies

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.training import program as program_lib, sharding

_TOPOLOGY = flags.DEFINE_string("topology", "v5p:2x2x1", "TPU topology GENERATION:SHAPE.")
_VARIANT = flags.DEFINE_string("variant", "base", "Config variant.")
_OBJECTIVE = flags.DEFINE_string("objective", "crossbert", "crossbert | mlm.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 8192, "Sequence length.")
_ATTENTION = flags.DEFINE_list("attention", ["xla", "splash"], "Backends to compile.")
_GLOBAL_EVERY = flags.DEFINE_integer("global_every", 1, "model.global_every (3: ModernBERT's local layers).")
_OUT = flags.DEFINE_string("out", "", "JSON output path.")

_CHIP = {"v5p": "megacore", "v4": "megacore"}  # Both TensorCores as one device, as on the pod.


def compile_case(c, devices):
  mesh = jax.make_mesh(sharding.mesh_shape(c.mesh, len(devices)), sharding.MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices)
  train_program = program_lib.TrainProgram(c, mesh)
  t0 = time.perf_counter()
  compiled = train_program.lower().compile()
  m = compiled.memory_analysis()
  hlo = compiled.as_text()
  return {
      "compile_s": time.perf_counter() - t0, "argument_bytes": m.argument_size_in_bytes,
      "output_bytes": m.output_size_in_bytes, "alias_bytes": m.alias_size_in_bytes, "temp_bytes": m.temp_size_in_bytes,
      "total_bytes": (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes +
                      m.generated_code_size_in_bytes), "splash_kernels_in_hlo": hlo.count("splash") > 0}


def main(argv):
  del argv
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  generation = _TOPOLOGY.value.split(":")[0]
  kwargs = {"chip_config_name": _CHIP[generation]} if generation in _CHIP else {}
  devices = list(topologies.get_topology_desc(_TOPOLOGY.value, "tpu", **kwargs).devices)
  results = {}
  for backend in _ATTENTION.value:
    c = config_lib.get_config(_OBJECTIVE.value, _VARIANT.value)
    c.unlock()
    c.data.seq_len = _SEQ_LEN.value
    c.train.batch_size = len(devices)  # One sequence per chip.
    c.model.dtype, c.model.scan_layers, c.model.remat = "bfloat16", True, "full"
    c.model.attention = backend
    c.model.global_every = _GLOBAL_EVERY.value
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.lock()
    c = plan_lib.build(c)
    r = compile_case(c, devices)
    results[backend] = r
    print(
        f"{backend:8s} compile {r['compile_s']:6.1f} s  temp {r['temp_bytes'] / 2**30:6.2f} GiB  "
        f"total {r['total_bytes'] / 2**30:6.2f} GiB per chip  (splash in HLO: {r['splash_kernels_in_hlo']})",
        flush=True)
  report = {
      "topology": _TOPOLOGY.value, "device_kind": devices[0].device_kind, "variant": _VARIANT.value,
      "objective": _OBJECTIVE.value, "seq_len": _SEQ_LEN.value, "global_every": _GLOBAL_EVERY.value,
      "jax": jax.__version__, "results": results}
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  app.run(main)

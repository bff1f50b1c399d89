"""XLA:CPU flags that the train step runs faster with, set before JAX creates its CPU backend.

XLA:CPU (jaxlib 0.10) hands every dot to YNNPACK as an `individual_dot` fusion. The projections
and MLP run at the large matmul's rate either way, but YNNPACK runs the attention core's small
batched matmuls (B*H blocks of T x K @ K x S) at 35-85 GFLOP/s, against 150-200 for XLA's own
dot (Eigen). Measured on the small config at L=256 (2 cores, see docs/benchmarks.md): BERT
r=0.15's step 4.4 s -> 3.86 s, CrossBERT r=0.5 K=1 2.77 s -> 2.61 s. YNNPACK's reduce fusions
are kept (removing them as well was slower). The flags only concern the CPU backend; XLA_FLAGS is
read once, when JAX creates its first backend, so `set_cpu_flags` must run before any JAX
computation (the commands call it first thing in main).
"""

import importlib.metadata
import os

CPU_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=-individual_dot",)
OPT_OUT = "CROSSBERT_DEFAULT_XLA_FLAGS"  # "0": leave XLA_FLAGS as it is.
# XLA aborts on a flag it does not know, and experimental flags come and go: set them only for
# the jaxlib releases they were measured with (requirements*.txt pin 0.10.2).
KNOWN_JAXLIB = ("0.10.",)


def _jaxlib_version() -> str:
  try:
    return importlib.metadata.version("jaxlib")
  except importlib.metadata.PackageNotFoundError:
    return ""


def set_cpu_flags(environ=os.environ) -> str:
  """Appends each of CPU_FLAGS to XLA_FLAGS unless that flag is already set there (an explicit
  choice wins), CROSSBERT_DEFAULT_XLA_FLAGS=0, or jaxlib is not a KNOWN_JAXLIB release; returns
  the resulting XLA_FLAGS."""
  flags = environ.get("XLA_FLAGS", "")
  if environ.get(OPT_OUT, "1") != "0" and _jaxlib_version().startswith(KNOWN_JAXLIB):
    for flag in CPU_FLAGS:
      if flag.split("=")[0] not in flags:
        flags = f"{flags} {flag}".strip()
    environ["XLA_FLAGS"] = flags
  return flags

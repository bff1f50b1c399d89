"""XLA:CPU flags that the train step runs faster with, set before JAX creates its CPU backend.

XLA:CPU (jaxlib 0.10) hands every dot to YNNPACK as an `individual_dot` fusion. The projections
and MLP run at the large matmul's rate either way, but YNNPACK runs the attention core's small
batched matmuls (B*H blocks of T x K @ K x S) at 35-85 GFLOP/s, against 150-200 for XLA's own
dot (Eigen). Measured on the small config at L=256 (2 cores, see docs/benchmarks.md): BERT
r=0.15's step 4.4 s -> 3.86 s, CrossBERT r=0.5 K=1 2.77 s -> 2.61 s. YNNPACK's reduce fusions
are kept (removing them as well was slower). The flags only concern the CPU backend; XLA_FLAGS is
read once, when JAX creates its first backend, so `set_cpu_flags` must run before any JAX
computation (the commands call it first thing in main).

XLA:GPU presets (`set_gpu_flags`, opt-in through CROSSBERT_XLA_GPU_PRESET=NAME): the flags the
JAX GPU anchors set (MaxText's, Pax's): the latency-hiding scheduler, Triton GEMMs off (cuBLAS for
every GEMM), command buffers off. Not measured on our step yet (the accelerator check's
`--xla_gpu_preset=NAME` call measures a preset against the defaults): nothing is set by default.
They are appended only where JAX will run on a GPU (a CUDA plugin is installed and JAX_PLATFORMS
does not rule it out). Every flag is known to the pinned jaxlib (tests/integration/test_xla_flags.py starts
XLA with them: it aborts on a flag it does not know); the device image's jaxlib (0.11.2) is
checked by the first check run with the preset.
"""

import importlib.metadata
import os

from crossbert_jax.core.errors import UserError

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


GPU_PRESET_ENV = "CROSSBERT_XLA_GPU_PRESET"
GPU_PRESETS: dict[str, tuple[str, ...]] = {
    "anchors": ("--xla_gpu_enable_latency_hiding_scheduler=true", "--xla_gpu_enable_triton_gemm=false",
                "--xla_gpu_enable_command_buffer="),
    "lhs": ("--xla_gpu_enable_latency_hiding_scheduler=true",),
    "no_triton_gemm": ("--xla_gpu_enable_triton_gemm=false",),
    "no_command_buffer": ("--xla_gpu_enable_command_buffer=",),}
CUDA_PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin")


def _runs_on_gpu(environ) -> bool:
  platforms = environ.get("JAX_PLATFORMS", "")
  if platforms and not {"cuda", "gpu"} & set(platforms.split(",")):
    return False
  for name in CUDA_PLUGINS:
    try:
      importlib.metadata.version(name)
      return True
    except importlib.metadata.PackageNotFoundError:
      pass
  return False


def set_gpu_flags(environ=os.environ) -> str:
  """Appends the flags of the preset CROSSBERT_XLA_GPU_PRESET names (none when unset) to XLA_FLAGS,
  each unless already set there, when JAX will run on a GPU; returns the resulting XLA_FLAGS.
  UserError for an unknown preset name."""
  flags = environ.get("XLA_FLAGS", "")
  preset = environ.get(GPU_PRESET_ENV, "")
  if not preset:
    return flags
  if preset not in GPU_PRESETS:
    raise UserError(f"{GPU_PRESET_ENV}={preset}: use one of {', '.join(GPU_PRESETS)} (or leave it unset)")
  if _runs_on_gpu(environ):
    for flag in GPU_PRESETS[preset]:
      if flag.split("=")[0] not in flags:
        flags = f"{flags} {flag}".strip()
    environ["XLA_FLAGS"] = flags
  return flags

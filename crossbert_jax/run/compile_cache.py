"""JAX's persistent compilation cache, on by default under the workdir.

A restarted (preempted, resized) pod then loads its train step from `workdir/compilation_cache`
instead of recompiling it: XLA keys entries by the program, the devices and the compile options,
so a changed mesh or config simply misses. The folder may be gs:// (JAX writes it through epath).
"""

import jax
from etils import epath

CACHE_DIR = "compilation_cache"
# Only compiles that take at least this long are stored: the train step and the init, not the
# hundreds of tiny host-side jits whose entries would cost more to fetch than to rebuild.
MIN_COMPILE_SECONDS = 1.0


def enable(workdir: str, cache_dir: str = "") -> str | None:
  """Points JAX's persistent cache at `cache_dir` (default: workdir/compilation_cache); "none": off."""
  if cache_dir == "none":
    return None
  path = str(epath.Path(cache_dir) if cache_dir else epath.Path(workdir) / CACHE_DIR)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  return path

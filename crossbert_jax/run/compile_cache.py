"""JAX's persistent compilation cache, on by default under the workdir.

A restarted (preempted, resized) pod then loads its train step from `workdir/compilation_cache`
instead of recompiling it: XLA keys entries by the program, the devices and the compile options,
so a changed mesh or config simply misses. The folder may be gs:// (JAX writes it through epath).
"""

import os

import jax
from etils import epath

CACHE_DIR = "compilation_cache"
ENV_VAR = "JAX_COMPILATION_CACHE_DIR"  # JAX reads it too; here it replaces the per-workdir default.
# Only compiles that take at least this long are stored: the train step and the init, not the
# hundreds of tiny host-side jits whose entries would cost more to fetch than to rebuild. JAX's own
# variable, when set, wins (the test suite sets 0: its tiny models' steps compile in under a second).
MIN_COMPILE_SECONDS = 1.0
MIN_COMPILE_ENV_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def enable(workdir: str, cache_dir: str = "") -> str | None:
  """Points JAX's persistent cache at `cache_dir`; "none": off.

  The default is JAX's own $JAX_COMPILATION_CACHE_DIR when it is set (one cache shared by many
  runs: a sweep's, a test suite's), else workdir/compilation_cache.
  """
  if cache_dir == "none":
    return None
  cache_dir = cache_dir or os.environ.get(ENV_VAR, "")
  path = str(epath.Path(cache_dir) if cache_dir else epath.Path(workdir) / CACHE_DIR)
  jax.config.update("jax_compilation_cache_dir", path)
  if MIN_COMPILE_ENV_VAR not in os.environ:  # Else JAX read it at import.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  return path

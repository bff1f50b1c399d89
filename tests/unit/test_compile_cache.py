"""run/compile_cache.enable: the cache folder it chooses, and the minimum compile time of a stored program
(ours, unless JAX's own variable is set: the suite sets 0)."""

import jax
import pytest

from crossbert_jax.run import compile_cache


@pytest.fixture(name="jax_cache_config")
def _jax_cache_config():
  """Restores the session's cache settings after the test."""
  saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
  yield
  jax.config.update("jax_compilation_cache_dir", saved[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def test_folder_and_minimum_compile_time(tmp_path, monkeypatch, jax_cache_config):  # pylint: disable=unused-argument
  monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
  monkeypatch.delenv(compile_cache.MIN_COMPILE_ENV_VAR, raising=False)
  assert compile_cache.enable(str(tmp_path)) == str(tmp_path / "compilation_cache")
  assert jax.config.jax_persistent_cache_min_compile_time_secs == compile_cache.MIN_COMPILE_SECONDS == 1.0
  assert compile_cache.enable(str(tmp_path), "none") is None

  monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "shared"))
  monkeypatch.setenv(compile_cache.MIN_COMPILE_ENV_VAR, "0")
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # What JAX read from it at import.
  assert compile_cache.enable(str(tmp_path)) == str(tmp_path / "shared")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "shared")
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0  # JAX's variable wins over ours.

"""Test setup: 8 fake CPU devices, strict rank promotion, absl flags parsed, shared data location."""

import os

# Must happen before jax is imported anywhere: 8 fake CPU devices for the sharding tests.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole session (this process and every command the tests
# start, through run/compile_cache.py): the tiny models' init and steps compile once, not per trainer.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  import tempfile  # noqa: E402

  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="crossbert-tests-jit-")

import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
# Grain's multiprocess prefetch reads absl flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()

DATA_ENV = "CROSSBERT_DATA"


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """Root of ../shared/data. Skips when CROSSBERT_DATA is unset; fails when it is set but missing."""
  root = os.environ.get(DATA_ENV)
  if not root:
    pytest.skip(f"{DATA_ENV} is not set (make test / .ci/run set it to ../shared/data)")
  path = pathlib.Path(root)
  if not (path / "SOURCES.md").is_file():
    pytest.fail(f"{DATA_ENV}={root} is set but holds no shared data (no SOURCES.md there)")
  return path


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory) -> str:
  """A small SentencePiece model trained on the built-in corpus."""
  from crossbert_jax.data import corpus, tokenizer  # pylint: disable=g-import-not-at-top

  path = tmp_path_factory.mktemp("tok") / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:4000], 512, path)
  return str(path)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, spm_model) -> pathlib.Path:
  """A tiny CrossBERT run of 5 steps (one checkpoint), for the commands that read a run; it also
  traces steps 3-4 (profile.*) and logs to an offline W&B run (tests/test_observe.py reads both)."""
  from tests.helpers import cpu_env, run_module  # pylint: disable=g-import-not-at-top

  workdir = tmp_path_factory.mktemp("tiny_run") / "run"
  proc = run_module([
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
      f"--config.data.tokenizer={spm_model}", "--config.model.vocab_size=512", "--config.train.steps=5",
      "--config.metrics.progress_bar=False", "--config.profile.start_step=3", "--config.profile.steps=2",
      "--config.metrics.wandb=True"], env=cpu_env(WANDB_MODE="offline", WANDB_SILENT="true"))
  (workdir.parent / "train.out").write_text(proc.stdout + proc.stderr)
  return workdir


@pytest.fixture
def two_processes(tmp_path):
  """Runs a tiny training through launch/local_multiprocess.sh: 2 processes x 2 CPU devices."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  from crossbert_jax.data import corpus, tokenizer  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).resolve().parents[1]
  spm = tmp_path / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:2000], 400, spm)
  env = {
      **os.environ, "PYTHONPATH": str(root), "DEVICES_PER_PROCESS": "2",
      "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}

  def run(*overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([
        "bash", "launch/local_multiprocess.sh", "2", "--config=configs/crossbert.py:tiny",
        f"--workdir={tmp_path / 'run'}", f"--config.data.tokenizer={spm}", "--config.metrics.progress_bar=False",
        *overrides], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)

  return run


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  if _OWN_CACHE:
    import shutil  # pylint: disable=g-import-not-at-top

    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

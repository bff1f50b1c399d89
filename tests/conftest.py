"""Test setup: the tiers (unit / integration / slow, from each test's folder), 8 fake CPU devices,
strict rank promotion, absl flags parsed, the shared data location and the runs several files read.

Tiers (docs/testing.md): a test's folder under tests/ is its tier's marker; an explicit
`@pytest.mark.integration` or `@pytest.mark.slow` on a test overrides its folder's. A unit-tier test
that starts a process or trains fails by name (`_GuardedPopen`, `_guard_training`); every test has a time limit by tier
(pytest-timeout), so a hung one fails by name too.
"""

import os

from tests.helpers import TEST_XLA_FLAGS  # noqa: E402  (imports no JAX)

# Must happen before jax is imported anywhere: 8 fake CPU devices for the sharding tests, and the suite's
# XLA:CPU code generation (helpers.TEST_XLA_FLAGS).
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole session (this process and every command the tests
# start, through run/compile_cache.py): the tiny models' init and steps compile once, not per trainer.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  import tempfile  # noqa: E402

  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="crossbert-tests-jit-")
# Every program is stored, not only those over run/compile_cache.MIN_COMPILE_SECONDS: at -O0 the tiny models'
# steps compile in under a second, so they were compiled again in every trainer (the unit tier: 114 s -> 102 s).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import gc  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
# Python's cyclic GC in the test processes: the objects imported so far (jax, pytest, absl) moved out of its
# reach, and a young generation 70x larger (the older ones' thresholds as before), so tracing's many short-lived
# objects cost fewer collections. Three unit files serially (test_attention, test_contrastive,
# test_embedder_packing): 129.0 and 130.0 user CPU-seconds with Python's defaults, 120.4 with these (2026-12-08);
# the unit tier on 2 workers: 4 min 57 s -> 4 min 54 s of user CPU. The commands the tests start keep the defaults.
gc.freeze()
gc.set_threshold(50_000, 10, 10)
# Grain's multiprocess prefetch reads absl flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()

DATA_ENV = "CROSSBERT_DATA"
TESTS = pathlib.Path(__file__).resolve().parent
# Each tier's folder, and its per-test time limit in seconds (set-up of the session's runs included, on
# 2 loaded cores): past it the test fails by name (pytest-timeout's SIGALRM) and the session goes on.
TIMEOUTS = {"unit": 300, "integration": 900, "slow": 1800}


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Marks each test with its folder's tier unless it names one itself; a test outside the tier
  folders is refused (a new file goes to tests/unit, tests/integration or tests/slow)."""
  misplaced = set()
  for item in items:
    rel = pathlib.Path(str(item.path)).resolve().relative_to(TESTS)
    folder = rel.parts[0] if len(rel.parts) > 1 else None
    if folder not in TIMEOUTS:
      misplaced.add(str(rel))
      continue
    named = [m.name for m in item.iter_markers() if m.name in TIMEOUTS]
    tier = "slow" if "slow" in named else (named[0] if named else folder)
    if not named:
      item.add_marker(getattr(pytest.mark, tier))
    if item.get_closest_marker("timeout") is None:
      item.add_marker(pytest.mark.timeout(TIMEOUTS[tier]))
  _keep_xdist_groups_on_one_worker(config, items)
  if misplaced:
    raise pytest.UsageError(f"tests/{', tests/'.join(sorted(misplaced))}: outside the tier folders; move it to "
                            "tests/unit, tests/integration or tests/slow (docs/testing.md)")


def _keep_xdist_groups_on_one_worker(config, items) -> None:
  """`--dist loadgroup` sends the tests of one `xdist_group` to one worker by the '@group' suffix of their node ids,
  which pytest-xdist 3.8 appends to `item._nodeid`; pytest 9.2 keeps the id in `item._id` and no longer reads
  `_nodeid`, so the suffix was lost and the group's tests spread over the workers (each then built the group's
  session fixture: two README tours a session). The suffix is set here where xdist's did not take."""
  if not getattr(config.option, "loadgroup", False):  # Set on xdist's workers only (xdist/remote.py).
    return
  from _pytest.nodeid import NodeId  # pylint: disable=g-import-not-at-top

  for item in items:
    groups = sorted({
        str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
    if groups and "@" not in item.nodeid.rpartition("]")[2]:
      item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")  # pylint: disable=protected-access


_UNIT_TEST = None  # The node id of the unit-tier test being set up, run or torn down.


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
  global _UNIT_TEST
  _UNIT_TEST = item.nodeid if item.get_closest_marker("unit") is not None else None
  try:
    yield
  finally:
    _UNIT_TEST = None


def _refuse(what: str) -> None:
  pytest.fail(
      f"{_UNIT_TEST} {what}: the unit tier starts no process and trains nothing; call the library or the "
      "command's main in-process, or move the test to tests/integration (docs/testing.md)", pytrace=False)


class _GuardedPopen(subprocess.Popen):
  """subprocess.Popen (and so subprocess.run), refused inside a unit-tier test."""
  def __init__(self, args, *rest, **kwargs):
    if _UNIT_TEST is not None:
      _refuse(f"starts a subprocess ({' '.join(map(str, args)) if isinstance(args, (list, tuple)) else args})")
    super().__init__(args, *rest, **kwargs)


subprocess.Popen = _GuardedPopen


def _guard_training() -> None:
  """Trainer.train (every run: trainer.run, the train command's main) refused inside a unit-tier test."""
  from crossbert_jax.run import trainer  # pylint: disable=g-import-not-at-top

  train = trainer.Trainer.train

  def guarded(self, *args, **kwargs):
    if _UNIT_TEST is not None:
      _refuse(f"trains ({self.workdir})")
    return train(self, *args, **kwargs)

  trainer.Trainer.train = guarded


_guard_training()


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """Root of ../shared/data. Skips when CROSSBERT_DATA is unset; fails when it is set but missing."""
  root = os.environ.get(DATA_ENV)
  if not root:
    pytest.skip(f"{DATA_ENV} is not set (make test / .ci/run set it to ../shared/data)")
  path = pathlib.Path(root).resolve()  # Absolute: `make`'s default is relative, and tests link to it from tmp_path.
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
  traces steps 3-4 (profile.*) and logs to an offline W&B run (tests/integration/test_observe.py reads both)."""
  from tests.helpers import cpu_env, run_module  # pylint: disable=g-import-not-at-top

  workdir = tmp_path_factory.mktemp("tiny_run") / "run"
  proc = run_module([
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
      f"--config.data.tokenizer={spm_model}", "--config.model.vocab_size=512", "--config.train.steps=5",
      "--config.metrics.progress_bar=False", "--config.profile.start_step=3", "--config.profile.steps=2",
      "--config.metrics.wandb=True"], env=cpu_env(WANDB_MODE="offline", WANDB_SILENT="true"))
  (workdir.parent / "train.out").write_text(proc.stdout + proc.stderr)
  return workdir


@pytest.fixture(scope="session")
def tiny_bert_run(tmp_path_factory, spm_model):
  """A tiny flat-BERT run of 2 steps (one checkpoint, no TensorBoard; local attention on every other
  layer, so its export exercises both kinds and the MLM head), started in the background at the first
  use so its compile overlaps other tests: `tiny_bert_run.finished()` waits and returns its workdir.
  Read-only, as `tiny_run`."""
  from tests.helpers import BackgroundRun  # pylint: disable=g-import-not-at-top

  run = BackgroundRun(
      tmp_path_factory.mktemp("tiny_bert_run") / "run", [
          "--config=configs/bert.py:tiny", f"--config.data.tokenizer={spm_model}", "--config.model.vocab_size=512",
          "--config.model.global_every=2", "--config.model.local_window=16", "--config.train.steps=2",
          "--config.checkpoint.every_steps=2", "--config.metrics.progress_bar=False",
          "--config.metrics.tensorboard=False", "--config.checkpoint.async_save=False"])
  yield run
  run.stop()


@pytest.fixture(scope="session")
def tour_clone(tmp_path_factory, shared_data) -> pathlib.Path:
  """A folder laid out like a fresh clone after the README's tour ran in it as written (tests/tour.py): the README
  tour test checks what the tour wrote, and the docs commands test goes on in it (the docs assume the tour ran)."""
  from tests import tour  # pylint: disable=g-import-not-at-top

  return tour.run_tour(tmp_path_factory.mktemp("tour"), shared_data)


@pytest.fixture
def command():
  """Runs a command in this process as `python -m` would (tests/helpers.py's `run_command`):
  command("crossbert_jax.compile", "--config=...") is a CompletedProcess (returncode, stdout, stderr)."""
  from tests.helpers import run_command  # pylint: disable=g-import-not-at-top

  return run_command


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

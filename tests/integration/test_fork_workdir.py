"""Where a run may write and what it leaves when it cannot: a fork never resumes, trains or deletes its
source (nor a run it was not), a workdir path below a file is one line, a refused start leaves no
empty folder, later phases' data is read before step 1 and a phase-boundary save never depends on
the next phase's data, a damaged or vanishing source step is one truthful line.

Runs are subprocesses through the real CLI on one CPU device (the refusals are launched together,
so their start-ups overlap); the source step removed mid-read is an in-process fork.restore.
"""

import hashlib
import json
import pathlib
import shutil
import time

import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.run import feed as feed_lib
from crossbert_jax.run import checkpoint, fork, resume
from crossbert_jax.training import program as program_lib
from crossbert_jax.training import sharding
from tests.helpers import cpu_env, run_module, users_cache_env

WSD = ["--config.train.decay=wsd", "--config.train.warmup_steps=2", "--config.metrics.tensorboard=False"]


def _args(workdir, spm, *overrides) -> list[str]:
  return [
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
      f"--config.data.tokenizer={spm}", "--config.metrics.progress_bar=False", *WSD, *overrides]


def _snapshot(root: pathlib.Path) -> dict[str, str]:
  return {
      str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
      for p in sorted(root.rglob("*"))}


def _run_all(cases: dict[str, list[str]], env: dict[str, str] | None = None) -> dict[str, tuple[int, str]]:
  """Runs every command at once; {name: (returncode, stderr)}."""
  procs = {name: run_module(args, env=env, wait=False) for name, args in cases.items()}
  return {name: (p.wait(timeout=600), p.communicate()[1]) for name, p in procs.items()}


def _one_error_line(result: tuple[int, str], *needles: str) -> str:
  code, stderr = result
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, stderr[-3000:])
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  return lines[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory, spm_model) -> pathlib.Path:
  """A finished 4-step WSD run with checkpoints at steps 2 and 4."""
  workdir = tmp_path_factory.mktemp("fork_workdir") / "src"
  run_module(_args(workdir, spm_model, "--config.train.steps=4", "--config.checkpoint.every_steps=2"))
  return workdir


def test_refused_starts_are_one_line_and_leave_nothing(tmp_path, source, spm_model):
  own = tmp_path / "own"  # A copy: a fork into its own source would train it on and delete its steps.
  shutil.copytree(source, own)
  before = _snapshot(own)
  damaged = tmp_path / "damaged"
  shutil.copytree(source, damaged)
  (damaged / "checkpoints" / "2" / "state" / "manifest.ocdbt").write_bytes(b"")
  afile = tmp_path / "afile"
  afile.write_text("not a folder")
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  cases = {
      "own": _args(own, spm_model, "--config.train.steps=8", f"--config.train.fork_from={own}:2"),
      "inside": _args(own / "checkpoints" / "branch", spm_model, "--config.train.steps=8",
                      f"--config.train.fork_from={own}:2"),
      "file": _args(afile, spm_model),
      "below_file": _args(afile / "sub", spm_model),
      "stop_at_fork": _args(tmp_path / "stop_at_fork", spm_model, "--config.train.steps=8",
                            "--config.train.stop_at_step=2", f"--config.train.fork_from={source}:2"),
      "seed": _args(tmp_path / "seed", spm_model, "--config.train.steps=8", "--config.train.seed=3",
                    f"--config.train.fork_from={source}:2"),
      "damaged": _args(tmp_path / "from_damaged", spm_model, "--config.train.steps=8",
                       f"--config.train.fork_from={damaged}:2"),
      "empty_phase": _args(tmp_path / "empty_phase", spm_model, "--config.train.steps=4",
                           f"--config.train.phases=({{'steps': 2}}, {{'data.path': '{empty}'}})"),}
  # The user's default cache, under WORKDIR: a refused start must not leave WORKDIR/compilation_cache behind either.
  # (With the suite's minimum compile time of 0 s, a refusal's small jits would store entries there.)
  env = users_cache_env(cpu_env())
  results = _run_all(cases, env=env)
  _one_error_line(results["own"], "is the source itself")
  _one_error_line(results["inside"], "is inside the source")
  assert _snapshot(own) == before, "the fork's source was written to"
  _one_error_line(results["file"], "is a file, not a folder")
  _one_error_line(results["below_file"], f"{afile} is a file, so no folder can be made below it")
  _one_error_line(results["stop_at_fork"], "step 2 is not before train.stop_at_step=2", "would train nothing")
  _one_error_line(results["seed"], "train.seed=0 (config: 3)", "use the source's values or fork from a compatible")
  line = _one_error_line(results["damaged"], "checkpoint step 2 in", "is unreadable", "fork from another step")
  assert "bound method" not in line, line
  _one_error_line(results["empty_phase"], "holds no documents", "(in phase 1 (steps 3-4")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "damaged", "empty.txt", "own"], (
      "a refused start left its workdir (empty checkpoints/, compilation_cache/)")


def test_a_workdir_resumes_only_as_the_run_it_holds(tmp_path, source, spm_model):
  plain = tmp_path / "plain"  # A run that was not forked.
  shutil.copytree(source, plain)
  branch = tmp_path / "branch"
  fork_at_2 = f"--config.train.fork_from={source}:2"
  run_module(_args(branch, spm_model, "--config.train.steps=6", "--config.train.stop_at_step=3", fork_at_2))
  results = _run_all({
      "plain": _args(plain, spm_model, "--config.train.steps=6", fork_at_2),
      "other": _args(branch, spm_model, "--config.train.steps=6", f"--config.train.fork_from={source}:4"),})
  _one_error_line(results["plain"], "of a run that was not forked", "drop train.fork_from to resume it")
  _one_error_line(results["other"], f"of a fork from {source}:2", f"give train.fork_from={source}:2")
  again = run_module(_args(branch, spm_model, "--config.train.steps=6", fork_at_2))
  assert "resuming from step 3" in again.stdout and "forked from" not in again.stdout + again.stderr, again.stdout
  assert json.loads((branch / "config.json").read_text())["train"]["fork_from"] == f"{source}:2"


def _metrics_rows(workdir: pathlib.Path) -> int:
  path = workdir / "metrics.jsonl"
  return len(path.read_bytes().splitlines()) if path.exists() else 0


def test_a_phase_boundary_save_never_reads_the_next_phases_data(tmp_path, spm_model):
  later = tmp_path / "later.txt"
  later.write_text("A later phase's text, readable when the run starts.\n" * 200)
  workdir = tmp_path / "run"
  proc = run_module(
      _args(workdir, spm_model, "--config.train.steps=32", "--config.checkpoint.every_steps=30",
            "--config.metrics.log_every=1", f"--config.train.phases=({{'steps': 30}}, {{'data.path': '{later}'}})"),
      wait=False)
  deadline = time.monotonic() + 300
  while _metrics_rows(workdir) < 1 and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  later.write_text("")  # The later phase's data goes bad while phase 0 trains.
  code, (_, stderr) = proc.wait(timeout=600), proc.communicate()
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert code == 2 and len(errors) == 1 and "holds no documents" in errors[0], stderr[-3000:]
  assert "(in phase 1 (steps 31-32" in errors[0], errors
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["30"], "the boundary save was lost"


def test_a_source_step_removed_while_it_is_read(tmp_path, source, spm_model):
  """The running source's cleanup deletes the step between listing and reading it: the newest is
  asked for, so the fork retries with the (new) newest; an explicit step says it was removed."""
  c = config_lib.from_dict(json.loads((source / "config.json").read_text()))
  c.train.steps = 8
  tok = tokenizer_lib.Tokenizer.load(spm_model)
  program = program_lib.TrainProgram(c, sharding.make_mesh(c.mesh))
  tok_id = resume.tokenizer_identity(spm_model, tok)
  feed = feed_lib.PhaseFeed(tok, seed=c.train.seed, process_index=0, process_count=1)

  def removing_first(src: pathlib.Path):
    removed = []

    def iterator_of(step: int):
      if not removed:  # Called just before Orbax reads the step's items.
        shutil.rmtree(src / "checkpoints" / str(step))
        removed.append(step)
      return feed.enter(phases_lib.phase_at(list(plan_lib.build(c).phases), step))  # The plan's typed phases.

    return iterator_of, removed

  newest = tmp_path / "newest"
  shutil.copytree(source, newest)
  iterator_of, removed = removing_first(newest)
  c.train.fork_from = str(newest)
  found, pinned = fork.restore(plan_lib.build(c), tmp_path / "fork", tok_id, program.abstract, program.shardings,
                               iterator_of, print)
  assert removed == [4] and found.step == 2 and pinned.train.fork_from == f"{newest}:2"
  assert found.meta.tokens_seen == 2 * c.train.batch_size * c.data.seq_len

  explicit = tmp_path / "explicit"
  shutil.copytree(source, explicit)
  iterator_of, removed = removing_first(explicit)
  c.train.fork_from = f"{explicit}:4"
  with pytest.raises(UserError, match=r"step 4 was removed from .* while it was read"):
    fork.restore(plan_lib.build(c), tmp_path / "fork2", tok_id, program.abstract, program.shardings, iterator_of, print)
  feed.close()


def test_checkpoint_meta_reads_what_older_runs_wrote():
  tok = {"path": "t.model", "sha256": "0" * 64, "vocab_size": 512}
  oldest = checkpoint.CheckpointMeta.from_json(None)  # Written before the meta item existed.
  assert oldest == checkpoint.CheckpointMeta() and oldest.tokens_at(
      10, {"train": {"batch_size": 4}, "data": {"seq_len": 8}}) == 320
  older = checkpoint.CheckpointMeta.from_json({"tokenizer": tok, "tokens_seen": 99})  # Before process_count.
  assert (older.tokenizer, older.tokens_seen, older.process_count, older.source_tokens_before) == (tok, 99, None, {})
  now = {"tokenizer": tok, "tokens_seen": 99, "process_count": 2, "source_tokens_before": {"a": 5.0}}
  assert checkpoint.CheckpointMeta.from_json(now).to_json() == now

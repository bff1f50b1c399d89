"""Reliability of training runs: resume checks, finite checkpoints, damaged checkpoints,
workdir locks, exit codes, orphaned data workers, full and read-only disks.

Training runs are the train command in this process (tests/integration/test_train.py's `_train`), or a
subprocess (`_start`) where the process is the point: a second trainer beside a live one, SIGTERM, the data
workers of a killed trainer, a full disk. One base run (4 steps, a checkpoint every step) is shared: tests
copy its workdir.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import EXIT_STOPPED, UserError
from crossbert_jax.data import corpus, tokenizer
from crossbert_jax.data import workers as workers_lib
from crossbert_jax.run import lock as lock_lib
from crossbert_jax.run import metrics
from tests.helpers import cpu_env
from tests.integration.test_train import _losses, _start, _train

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _args(spm, *extra):
  return [
      f"--config.data.tokenizer={spm}", "--config.train.steps=4", "--config.train.warmup_steps=2",
      "--config.checkpoint.every_steps=1", "--config.metrics.tensorboard=False", *extra]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, spm_model):
  """A finished 4-step run with checkpoints at steps 2, 3, 4 (keep=3)."""
  workdir = tmp_path_factory.mktemp("base") / "run"
  _train(workdir, *_args(spm_model))
  return workdir


def _copy(base, tmp_path) -> pathlib.Path:
  out = tmp_path / "run"
  shutil.copytree(base, out)
  return out


def _error_lines(proc) -> list[str]:
  return [l for l in proc.stderr.splitlines() if l.startswith("error:")]


def _saved_steps(workdir) -> list[int]:
  return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints").iterdir() if p.name.isdigit())


def test_other_tokenizer_is_refused_naming_both_files(tmp_path, base_run, spm_model):
  other = tmp_path / "other.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[4000:6000], 400, other)
  workdir = _copy(base_run, tmp_path)
  proc = _train(workdir, *_args(other, "--config.train.steps=6"), check=False)
  err = _error_lines(proc)
  assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
  assert spm_model in err[0] and str(other) in err[0] and "400 pieces" in err[0], err[0]
  assert "Traceback" not in proc.stderr
  # The same content under another path is the same tokenizer: accepted.
  copy = tmp_path / "copy.model"
  shutil.copy(spm_model, copy)
  proc = _train(workdir, *_args(copy, "--config.train.steps=4"), check=False)
  assert proc.returncode == 0 and "nothing to train" in proc.stderr, proc.stderr[-2000:]


def test_shape_changes_are_refused_in_one_line(tmp_path, base_run, spm_model):
  workdir = _copy(base_run, tmp_path)
  proc = _train(workdir, *_args(spm_model, "--config.data.seq_len=32", "--config.model.num_layers=3"), check=False)
  err = _error_lines(proc)
  assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
  assert "data.seq_len=64" in err[0] and "model.num_layers=2" in err[0], err[0]


def test_nothing_to_train_says_so(tmp_path, base_run, spm_model):
  proc = _train(_copy(base_run, tmp_path), *_args(spm_model, "--config.train.steps=3"), check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "nothing to train" in proc.stderr and "step 4" in proc.stderr and "train.steps=3" in proc.stderr
  assert "done:" not in proc.stdout


@pytest.mark.slow  # 37 s.
def test_runtime_changes_resume_with_warnings_and_running_tokens_seen(tmp_path, base_run, spm_model):
  """worker_count (was KeyError 'exhausted'), remat, log_every, cadence and batch size may change."""
  workdir = _copy(base_run, tmp_path)
  proc = _train(
      workdir,
      *_args(spm_model, "--config.train.steps=6", "--config.data.worker_count=2", "--config.model.remat=full",
             "--config.metrics.log_every=2", "--config.checkpoint.every_steps=2", "--config.train.batch_size=8"))
  for key in ("data.worker_count", "model.remat", "metrics.log_every", "checkpoint.every_steps", "train.batch_size",
              "train.steps"):
    assert f"warning: resuming with {key}=" in proc.stderr, (key, proc.stderr[-2000:])
  assert "learning-rate schedule" in proc.stderr
  rows = metrics.read_metrics(str(workdir))
  seen = {r["step"]: r["tokens_seen"] for r in rows}
  # 4 steps of 16 x 64 tokens, then 2 of 8 x 64 (the old formula gave 6 x 8 x 64 = 3072).
  assert seen[4] == 4 * 16 * 64 and seen[6] == 4 * 16 * 64 + 2 * 8 * 64, seen


def test_damaged_latest_checkpoints_fall_back_to_the_last_complete_one(tmp_path, base_run, spm_model):
  workdir = _copy(base_run, tmp_path)
  ckpts = workdir / "checkpoints"
  for f in (ckpts / "4" / "state").rglob("*"):  # Truncated array files.
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(b"")
  shutil.rmtree(ckpts / "3" / "data")  # A step folder missing a part.
  first = _losses(workdir)
  proc = _train(workdir, *_args(spm_model, "--config.train.steps=5", "--config.metrics.log_every=1"))
  warnings = [l for l in proc.stderr.splitlines() if "is damaged" in l]
  assert len(warnings) == 2 and "step 4" in warnings[0] and "step 3" in warnings[1], proc.stderr[-3000:]
  assert "resuming from step 2" in proc.stdout + proc.stderr
  rows = metrics.read_metrics(str(workdir))
  rerun = {r["step"]: r["loss"] for r in rows[len(first):]}
  assert sorted(rerun) == [3, 4, 5]
  for s in (3, 4):
    assert rerun[s] == first[s], f"step {s}: {rerun[s]} after the fallback != {first[s]}"
  assert (ckpts / "damaged-4").is_dir() and 5 in _saved_steps(workdir)


def test_export_and_evaluate_read_the_newest_readable_checkpoint(tmp_path, base_run, capfd):
  from crossbert_jax.run import load  # pylint: disable=g-import-not-at-top

  workdir = _copy(base_run, tmp_path)
  for f in (workdir / "checkpoints" / "4" / "state").rglob("*"):  # Truncated array files.
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(b"")
  _, params, step = load.load_run(workdir)
  assert step == 3 and params["encoder"]
  assert "warning: checkpoint step 4" in capfd.readouterr().err
  assert (workdir / "checkpoints" / "4").is_dir(), "a reader leaves the run as it is"
  with pytest.raises(UserError, match=r"checkpoint step 4 in .* is unreadable .*; pick another --step"):
    load.load_run(workdir, step=4)


@pytest.mark.slow  # make test keeps test_train.py::test_divergence_stops_and_keeps_last_good_checkpoint.
def test_diverged_run_keeps_only_checkpoints_whose_next_loss_is_finite(tmp_path, spm_model):
  """A warmup towards lr 1e6 (step i runs at 10(i + 1)): the last params before the NaN are finite but diverge."""
  args = [
      f"--config.data.tokenizer={spm_model}", "--config.train.learning_rate=1e6", "--config.train.warmup_steps=100000",
      "--config.train.clip_norm=0", "--config.train.steps=40", "--config.checkpoint.every_steps=1",
      "--config.metrics.tensorboard=False"]
  proc = _train(tmp_path, *args, check=False)
  assert proc.returncode == 2 and len(_error_lines(proc)) == 1, proc.stderr[-2000:]
  saved = _saved_steps(tmp_path)
  assert saved, "the steps before the divergence must be kept"
  kept, logged = max(saved), len(metrics.read_metrics(str(tmp_path)))
  # Resuming from the kept checkpoint: its first step (the loss of the kept params) is finite.
  proc = _train(tmp_path, *args, check=False)
  assert f"resuming from step {kept}" in proc.stdout + proc.stderr, proc.stderr[-2000:]
  rerun = metrics.read_metrics(str(tmp_path))[logged:]
  assert rerun and rerun[0]["step"] == kept + 1 and rerun[0]["loss"] is not None, (rerun, proc.stderr[-2000:])


def check_two_breakers_of_one_dead_lease(workdir: str, write_lease) -> None:
  """B judges the dead lease breakable, A breaks it and takes the workdir first: B's break then
  removes nothing (A's fresh lease stays) and B is refused, however slow B was."""
  write_lease(
      json.dumps({"owner": "someone", "host": "elsewhere", "pid": 1, "heartbeat": time.time() - lock_lib.STALE_S - 5}))
  a, b = lock_lib.WorkdirLock(workdir, warn=lambda _: None), lock_lib.WorkdirLock(workdir, warn=lambda _: None)
  generation = lock_lib._gcs_generation(b.path) if workdir.startswith("gs://") else None  # pylint: disable=protected-access
  judged = b._read()  # pylint: disable=protected-access
  a.acquire()
  try:
    assert not b._remove_if_unchanged(judged, generation), "B removed A's fresh lease"  # pylint: disable=protected-access
    assert json.loads(a.path.read_text())["token"] == a._token  # pylint: disable=protected-access
    with pytest.raises(UserError, match="is in use by"):
      b.acquire()
  finally:
    a.release()


def test_of_two_breakers_of_a_dead_lease_one_takes_it(tmp_path):
  check_two_breakers_of_one_dead_lease(str(tmp_path), (tmp_path / lock_lib.LOCK_FILE).write_text)
  assert sorted(p.name for p in tmp_path.iterdir()) == [], "no lease and nothing set aside is left"


def test_lock_refuses_a_live_holder_and_breaks_dead_or_stale_ones(tmp_path):
  warnings = []
  holder = lock_lib.WorkdirLock(tmp_path).acquire()
  try:
    with pytest.raises(UserError, match="is in use by .* pid %d" % os.getpid()):
      lock_lib.WorkdirLock(tmp_path, warn=warnings.append).acquire()
    lock_lib.WorkdirLock(tmp_path, break_lock=True, warn=warnings.append).acquire().release()
    assert "--break_lock was given" in warnings[-1]
  finally:
    holder.release()
  assert not (tmp_path / lock_lib.LOCK_FILE).exists()
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  cases = {
      "gone": {"host": socket.gethostname(), "pid": int(dead.stdout), "heartbeat": time.time()},
      "old": {"host": "elsewhere", "pid": 1, "heartbeat": time.time() - lock_lib.STALE_S - 5}}
  for why, info in cases.items():
    (tmp_path / lock_lib.LOCK_FILE).write_text(json.dumps({"owner": "someone", **info}))
    lock_lib.WorkdirLock(tmp_path, warn=warnings.append).acquire().release()
    assert "breaking the lock" in warnings[-1] and why in warnings[-1], warnings[-1]
  (tmp_path / lock_lib.LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "heartbeat": time.time()}))
  with pytest.raises(UserError, match="elsewhere"):
    lock_lib.WorkdirLock(tmp_path).acquire()


def _wait_for_first_metrics(proc, workdir, timeout: float = 300) -> None:
  """Until the running trainer `proc` has logged a metrics row in `workdir` (it is past compiling)."""
  jsonl, deadline = workdir / "metrics.jsonl", time.time() + timeout
  while time.time() < deadline and (not jsonl.exists() or not jsonl.read_text().strip()):
    assert proc.poll() is None, f"training exited early: {proc.stderr.read()[-2000:]}"
    time.sleep(0.5)


def test_second_trainer_is_refused_and_sigterm_exits_resumable(tmp_path, spm_model):
  args = [
      f"--config.data.tokenizer={spm_model}", "--config.train.steps=100000", "--config.checkpoint.every_steps=100000",
      "--config.metrics.tensorboard=False"]
  first = _start(tmp_path, *args)
  try:
    _wait_for_first_metrics(first, tmp_path)
    second = _train(tmp_path, *args, check=False)
    err = _error_lines(second)
    assert second.returncode == 2 and len(err) == 1 and "is in use by" in err[0], second.stderr[-2000:]
    assert f"pid {first.pid}" in err[0]
  finally:
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=300)
  assert first.returncode == EXIT_STOPPED, f"a stop must exit {EXIT_STOPPED}, got {first.returncode}: {stderr[-2000:]}"
  assert "done:" not in stdout and "stopped: step" in stderr
  assert _saved_steps(tmp_path) == [max(_losses(tmp_path))]
  assert not (tmp_path / lock_lib.LOCK_FILE).exists(), "the lock is released on a stop"


def test_data_workers_exit_when_the_trainer_is_killed(tmp_path, spm_model):
  proc = _start(tmp_path, f"--config.data.tokenizer={spm_model}", "--config.train.steps=100000",
                "--config.data.worker_count=2", "--config.metrics.tensorboard=False")
  try:
    _wait_for_first_metrics(proc, tmp_path)
    workers = workers_lib.child_pids(proc.pid)
    assert len(workers) >= 2, f"expected 2 Grain workers under {proc.pid}, found {workers}"
  finally:
    proc.kill()
    proc.communicate()
  deadline = time.time() + 30
  while time.time() < deadline and any(workers_lib.alive(w) for w in workers):
    time.sleep(0.2)
  assert not [w for w in workers if workers_lib.alive(w)], "data workers outlived the killed trainer"


@pytest.mark.slow
def test_full_and_read_only_disks_are_one_line_and_keep_checkpoints(tmp_path, spm_model):
  if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
    pytest.skip("needs `unshare -m` (root) to mount a private tmpfs")
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  train = (f"{sys.executable} -m crossbert_jax.train --config=configs/crossbert.py:tiny --workdir={mnt}/run "
           f"--config.data.tokenizer={spm_model} --config.metrics.progress_bar=False "
           "--config.metrics.tensorboard=False --config.checkpoint.every_steps=2 --config.train.warmup_steps=2")
  script = f"""
set -u
mount -t tmpfs -o size=16m tmpfs {mnt}
{train} --config.train.steps=2 >/dev/null 2>&1 || echo FIRST_FAILED
# Leave ~1 MB: the run starts, a checkpoint (~3 MB) does not fit.
dd if=/dev/zero of={mnt}/filler bs=1M count=100 2>/dev/null
rm {mnt}/filler; dd if=/dev/zero of={mnt}/filler bs=1M count=$(( $(df -m --output=avail {mnt} | tail -1) - 1 )) 2>/dev/null
{train} --config.train.steps=6 2>{tmp_path}/full.err; echo "full rc=$?"
rm -f {mnt}/filler; mount -o remount,ro {mnt}
{train} --config.train.steps=6 2>{tmp_path}/ro.err; echo "ro rc=$?"
ls {mnt}/run/checkpoints
"""
  env = cpu_env()
  proc = subprocess.run(["unshare", "-m", "bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=900)
  assert "FIRST_FAILED" not in proc.stdout, proc.stdout + proc.stderr[-2000:]
  for name, what in (("full", "disk is full"), ("ro", "read-only")):
    err = (tmp_path / f"{name}.err").read_text()
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert f"{name} rc=2" in proc.stdout, (name, err[-3000:])
    assert len(lines) == 1 and what in lines[0] and err.strip().splitlines()[-1] == lines[0], (name, err[-3000:])
    # No traceback through our code, and the error line is the last one: after it the command's stderr
    # is closed (errors.exit_on_user_error), so Orbax's async writer thread, still winding down after
    # a failed save, cannot print its "Event loop is closed" traceback after the line (seen once in
    # session 6). It may still print one before the line: not ours to silence.
    assert "crossbert_jax/" not in err, (name, err[-3000:])
    assert "error: the disk is full while saving the checkpoint" in err or name == "ro", err[-3000:]
  assert "2" in proc.stdout.split(), f"the step-2 checkpoint must survive: {proc.stdout}"


def test_resume_policy_per_key():
  """In-process: which config changes are refused, which warn, which are silent."""
  import json as json_lib

  from crossbert_jax.core import config as config_lib
  from crossbert_jax.run import checkpoint, resume

  def saved_and(**changes):
    base = config_lib.get_config("crossbert", "tiny")
    saved = json_lib.loads(json_lib.dumps(base.to_dict()))
    now = config_lib.get_config("crossbert", "tiny")
    for key, value in changes.items():
      section, name = key.split("__")
      now[section][name] = value
    return saved, now

  tok = {"path": "a.model", "sha256": "0" * 64, "vocab_size": 512}
  for key, value in (("model__embed_dim", 128), ("masking__ratio", 0.25), ("train__seed", 1), ("data__path", "x.txt"),
                     ("reconstructor__num_layers", 3), ("data__shuffle_seed", 3)):
    saved, now = saved_and(**{key: value})
    with pytest.raises(UserError, match=key.replace("__", ".")):
      resume.check("w", 10, saved, None, plan_lib.build(now), tok, 1)
  for key, value in (("model__remat", "full"), ("data__worker_count", 2), ("metrics__log_every", 5),
                     ("checkpoint__every_steps", 7), ("mesh__fsdp", 1), ("train__learning_rate", 1e-4),
                     ("model__attention", "chunked"), ("model__loss_chunk", 64)):
    saved, now = saved_and(**{key: value})
    warnings, _ = resume.check("w", 10, saved, None, plan_lib.build(now), tok, 1)
    assert any(key.replace("__", ".") in w for w in warnings), (key, warnings)
  saved, now = saved_and(train__stop_at_step=20, metrics__progress_bar=False)
  assert resume.check("w", 10, saved, None, plan_lib.build(now), tok, 1) == ([], True)
  saved, now = saved_and(train__batch_size=256)  # 64 -> 128 packing bins per process on 2 processes.
  assert resume.check("w", 10, saved, None, plan_lib.build(now), tok,
                      2)[1] is False  # Same processes: the stream starts over.
  assert resume.check("w", 10, saved, None, plan_lib.build(now), tok, 2,
                      saved_process_count=4)[1] is True  # Re-sharded instead.
  saved, now = saved_and(train__steps=600)
  warnings, _ = resume.check("w", 100, saved, None, plan_lib.build(now), tok, 1)
  assert "step 101 runs at lr" in warnings[-1], warnings
  other = {"path": "b.model", "sha256": "1" * 64, "vocab_size": 400}
  saved, now = saved_and()
  with pytest.raises(UserError, match="a.model .* data.tokenizer=b.model"):
    resume.check("w", 10, saved, checkpoint.CheckpointMeta.from_json({"tokenizer": tok}), plan_lib.build(now), other, 1)

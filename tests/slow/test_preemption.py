"""Preemption across processes: SIGTERM reaching one of two processes stops both at the same step.

Two CPU processes on localhost through jax.distributed (as launch/local_multiprocess.sh starts
them); the signal goes to process 1 only, which is not the one writing metrics.
"""

import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from crossbert_jax.core.errors import EXIT_STOPPED
from crossbert_jax.data import corpus, tokenizer
from crossbert_jax.run import metrics
from tests.helpers import TEST_XLA_FLAGS, cpu_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _start(workdir, spm, *extra) -> list[subprocess.Popen]:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = cpu_env(XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {TEST_XLA_FLAGS}")
  return [
      subprocess.Popen([
          sys.executable, "-m", "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
          f"--config.data.tokenizer={spm}", "--config.train.steps=1000", "--config.checkpoint.every_steps=1000",
          "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False", "--config.metrics.log_every=1",
          *extra, "--jax_distributed", f"--coordinator_address=localhost:{port}", "--num_processes=2",
          f"--process_id={i}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]


def _wait(procs) -> list[tuple[int, str]]:
  out = []
  for p in procs:
    _, err = p.communicate(timeout=600)
    out.append((p.returncode, err))
  return out


def _losses(workdir) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in metrics.read_metrics(str(workdir))}


@pytest.mark.slow  # Over 75 s on 2 idle cores: `make test-slow` and CI run it.
def test_sigterm_to_one_process_stops_all_at_one_step_and_resumes_exactly(tmp_path):
  spm = tmp_path / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:2000], 400, spm)
  run = tmp_path / "run"
  procs = _start(run, spm)
  try:
    jsonl = run / "metrics.jsonl"
    deadline = time.time() + 400
    while time.time() < deadline and (not jsonl.exists() or len(jsonl.read_text().splitlines()) < 2):
      assert all(p.poll() is None for p in procs), f"a process exited early: {procs[0].stderr.read()[-2000:]}"
      time.sleep(0.2)
    procs[1].send_signal(signal.SIGTERM)
    results = _wait(procs)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for rc, err in results:
    assert rc == EXIT_STOPPED, f"each process must exit {EXIT_STOPPED} (stopped, resumable), got {rc}: {err[-2000:]}"
  saved = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
  stopped = max(_losses(run))
  assert saved == [stopped], f"both processes save the step they stopped at ({stopped}) once, got {saved}"
  target = stopped + 2
  for rc, err in _wait(_start(run, spm, f"--config.train.stop_at_step={target}")):
    assert rc == 0, err[-2000:]
  straight = tmp_path / "straight"
  for rc, err in _wait(_start(straight, spm, f"--config.train.stop_at_step={target}")):
    assert rc == 0, err[-2000:]
  resumed, reference = _losses(run), _losses(straight)
  assert sorted(resumed) == sorted(reference) == list(range(1, target + 1))
  for s in reference:
    assert resumed[s] == reference[s], f"step {s}: {resumed[s]} (stopped and resumed) != {reference[s]}"

"""Two processes on localhost through jax.distributed: per-process shards, one global batch."""

import pathlib

import pytest

from crossbert_jax.run import metrics


@pytest.mark.slow  # Over 75 s on 2 idle cores: `make test-slow` and CI run it.
def test_two_processes_train_checkpoint_and_agree_on_a_damaged_checkpoint(tmp_path, two_processes):
  """A 2-process run, then its newest step made unreadable for process 1 only (its iterator state
  truncated; process 0 reads the step fine): both processes set the step aside together, one
  warning naming process 1, and resume from the previous step as the first run went (without the
  agreement: a traceback or a hang). One test, to pay for the 2-process start-up once less."""
  first = two_processes("--config.train.steps=4", "--config.checkpoint.every_steps=2")
  assert first.returncode == 0, f"2-process run failed:\n{first.stderr[-3000:]}"
  run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
  rows = metrics.read_metrics(str(run))
  assert [r["step"] for r in rows] == [1, 2, 3, 4], "process 0 alone writes each step once"
  losses = {r["step"]: r["loss"] for r in rows}
  mine = ckpts / "4" / "data" / "process_1-of-2.json"
  assert mine.is_file() and (ckpts / "4" / "data" / "process_0-of-2.json").is_file(), list(ckpts.rglob("*.json"))
  mine.write_text(mine.read_text()[:10])

  second = two_processes("--config.train.steps=5", "--config.checkpoint.every_steps=2", timeout=300)
  assert second.returncode == 0, f"2-process resume failed:\n{second.stderr[-3000:]}"
  assert "Traceback" not in second.stderr, second.stderr[-3000:]
  warnings = [l for l in second.stderr.splitlines() if "is damaged" in l]
  assert len(warnings) == 1, second.stderr[-3000:]
  assert "step 4" in warnings[0] and "process 1:" in warnings[0] and "falling back to step 2" in warnings[0], warnings
  assert "resuming from step 2" in second.stdout + second.stderr, second.stdout[-2000:] + second.stderr[-2000:]
  rerun = {r["step"]: r["loss"] for r in metrics.read_metrics(str(run))[len(rows):]}
  assert sorted(rerun) == [3, 4, 5], rerun
  for s in (3, 4):
    assert rerun[s] == losses[s], f"step {s}: {rerun[s]} after the fallback != {losses[s]}"
  assert (ckpts / "damaged-4").is_dir() and (ckpts / "5").is_dir()


@pytest.mark.slow  # Two 2-process runs: about a minute on 2 cores.
def test_per_batch_padding_on_two_processes_trains_as_padding_to_max(tmp_path, tiny_run, shared_data):
  """contrast.padding=batch on 2 processes x 2 devices: each process pads its rows to its batch's length and the
  run's feed pads both to the longer (run/feed.same_length), so the global batch has one shape; the losses equal
  the same run's at contrast.padding=max (padding is masked: float sums of another length only)."""
  import json
  import os
  import subprocess
  import sys

  from crossbert_jax.data import pairs
  from tests.helpers import ROOT

  rows = pairs.nli_triplets(pairs.read_senteval_nli(shared_data / "senteval/downstream/SNLI", "dev"))[:256]
  data = tmp_path / "triplets.jsonl"
  data.write_text("".join(
      json.dumps({"anchor": r.anchor, "positive": r.positive, "negative": r.negative}) + "\n" for r in rows))
  env = {
      **os.environ, "PYTHONPATH": str(ROOT), "DEVICES_PER_PROCESS": "2", "MODULE": "crossbert_jax.contrast",
      "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
  losses = {}
  for padding in ("batch", "max"):
    run = tmp_path / padding
    proc = subprocess.run([
        "bash", "launch/local_multiprocess.sh", "2", "--config=configs/contrast.py:tiny_pairs", f"--workdir={run}",
        f"--config.contrast.init_from={tiny_run}", f"--config.data.path={data}", f"--config.contrast.padding={padding}",
        "--config.data.seq_len=128", "--config.train.batch_size=8", "--config.train.steps=6",
        "--config.metrics.log_every=1", "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"2-process contrast ({padding}) failed:\n{proc.stderr[-3000:]}"
    losses[padding] = [r["loss"] for r in metrics.read_metrics(str(run)) if "positive_cosine" in r]
  assert len(losses["batch"]) == 6
  assert losses["batch"] == pytest.approx(losses["max"], rel=1e-5), losses

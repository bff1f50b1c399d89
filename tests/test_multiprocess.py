"""Two processes on localhost through jax.distributed: per-process shards, one global batch."""

import os
import pathlib
import subprocess
import sys

from crossbert_jax.data import corpus, tokenizer
from crossbert_jax.training import metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_two_processes_train_and_checkpoint(tmp_path):
  spm = tmp_path / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:2000], 400, spm)
  env = {**os.environ, "PYTHONPATH": str(ROOT), "DEVICES_PER_PROCESS": "2", "PATH":
         f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
  proc = subprocess.run(
      ["bash", "launch/local_multiprocess.sh", "2", "--config=configs/crossbert.py:tiny",
       f"--workdir={tmp_path / 'run'}", f"--config.data.tokenizer={spm}", "--config.train.steps=3",
       "--config.metrics.progress_bar=False"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, f"2-process run failed:\n{proc.stderr[-3000:]}"
  rows = metrics.read_metrics(str(tmp_path / "run"))
  assert [r["step"] for r in rows] == [1, 2, 3], "process 0 alone writes each step once"
  assert (tmp_path / "run" / "checkpoints" / "3").is_dir()
  assert proc.stdout.count("done: step 3") == 1, "only process 0 prints the summary"

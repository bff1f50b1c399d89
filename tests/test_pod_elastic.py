"""A checkpoint written by N processes, restarted on M != N: one line, before anything is loaded."""

import os
import pathlib
import subprocess
import sys

from crossbert_jax.data import corpus, tokenizer
from crossbert_jax.training import elastic

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_two_process_checkpoint_on_one_process_is_refused(tmp_path):
  spm = tmp_path / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:2000], 400, spm)
  args = ["--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}", f"--config.data.tokenizer={spm}",
          "--config.metrics.progress_bar=False", "--config.model.vocab_size=400"]
  env = {**os.environ, "PYTHONPATH": str(ROOT), "DEVICES_PER_PROCESS": "2", "PATH":
         f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
  proc = subprocess.run(["bash", "launch/local_multiprocess.sh", "2", *args, "--config.train.steps=2"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert elastic.saved_process_count(tmp_path / "run") == (2, 2)
  proc = subprocess.run([sys.executable, "-m", "crossbert_jax.train", *args, "--config.train.steps=4"],
                        cwd=ROOT, env={**env, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = proc.stderr.strip().splitlines()[-1]
  assert "written by 2 process(es) but this run has 1" in line and "Traceback" not in proc.stderr, line
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]

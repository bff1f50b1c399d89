"""Two processes on localhost through jax.distributed: per-process shards, one global batch."""

from crossbert_jax.run import metrics


def test_two_processes_train_and_checkpoint(tmp_path, two_processes):
  proc = two_processes("--config.train.steps=3")
  assert proc.returncode == 0, f"2-process run failed:\n{proc.stderr[-3000:]}"
  rows = metrics.read_metrics(str(tmp_path / "run"))
  assert [r["step"] for r in rows] == [1, 2, 3], "process 0 alone writes each step once"
  assert (tmp_path / "run" / "checkpoints" / "3").is_dir()

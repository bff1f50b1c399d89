"""tools/fault_inject_prepare.py with two kills: every shard once, every document once, no orphaned workers."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_random_kills_of_prepare_resume_exactly(tmp_path):
  proc = subprocess.run([
      sys.executable, "tools/fault_inject_prepare.py", "--kills=2", "--documents=4000", "--shards=6", "--max_delay=5",
      f"--workdir={tmp_path / 'fi'}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "fault_inject_prepare: passed: 2 kills" in proc.stdout, proc.stdout[-3000:]

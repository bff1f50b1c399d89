"""tools/fault_inject.py with a handful of kills: the resumed run equals the uninterrupted one bitwise."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # Over 75 s on 2 idle cores: `make test-slow` and CI run it.
def test_random_kills_resume_bitwise(tmp_path):
  proc = subprocess.run([
      sys.executable, "tools/fault_inject.py", "--kills=3", "--steps=30", f"--workdir={tmp_path / 'fi'}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "fault_inject: passed: 3 kills" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow  # Two runs of several trainer processes each.
def test_random_kills_of_a_contrastive_run_resume_bitwise(tmp_path, tiny_run):
  """SimCSE (dropout on, so its random stream must resume too) from the session's tiny pretraining run."""
  proc = subprocess.run([
      sys.executable, "tools/fault_inject.py", "--command=contrast", f"--init_from={tiny_run}", "--kills=2",
      "--steps=16", f"--workdir={tmp_path / 'fi'}"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "fault_inject: passed: 2 kills" in proc.stdout, proc.stdout[-3000:]

"""evaluate on a read-only run: the embedding cache falls back to the user cache, and says so."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from crossbert_jax.evaluation import columns

ROOT = pathlib.Path(__file__).resolve().parents[2]

_READ_ONLY = r"""
import pathlib, subprocess, sys
sys.path.insert(0, sys.argv[2])
from crossbert_jax.evaluation import columns
run = pathlib.Path(sys.argv[1]) / "run"
run.mkdir()
subprocess.run(["mount", "-o", "remount,ro", sys.argv[1]], check=True)
print("cache:", columns.run_cache_dir(str(run)))
"""


def test_writable_run_caches_in_its_workdir(tmp_path):
  assert columns.run_cache_dir(str(tmp_path / "run")) == tmp_path / "run" / "eval_cache"
  assert not list((tmp_path / "run" / "eval_cache").iterdir()), "the write probe is removed"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a private tmpfs")
def test_read_only_run_caches_in_the_user_cache(tmp_path):
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
  script = f"mount -t tmpfs tmpfs {mnt} && {sys.executable} -c '{_READ_ONLY}' {mnt} {ROOT}"
  proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
  if proc.returncode and "Operation not permitted" in proc.stderr:
    pytest.skip(f"no private mounts here: {proc.stderr.strip()[:200]}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  note, cache = proc.stdout.strip().splitlines()
  assert note.startswith(f"note: {mnt}/run/eval_cache is not writable (Read-only file system)"), note
  assert cache.startswith(f"cache: {tmp_path}/xdg/crossbert_jax/eval_cache/"), cache

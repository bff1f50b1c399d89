"""Export safety: --force never deletes a run, atomic replacement, killed exports, full/read-only disks."""

import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus, tokenizer
from crossbert_jax.hf import convert
from crossbert_jax.training import objectives

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = 512


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok") / "spm.model"
  tokenizer.train_tokenizer(corpus.builtin_documents()[:4000], VOCAB, path)
  return tokenizer.Tokenizer.load(path)


def _config():
  c = config_lib.get_config("crossbert", "tiny")
  c.unlock()
  c.model.vocab_size = VOCAB
  c.lock()
  return c


def _params(c):
  abstract = jax.eval_shape(lambda k: objectives.init_params(c, k), jax.random.key(0))
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda x: 0.05 * rng.standard_normal(getattr(x, "value", x).shape).astype(np.float32), abstract,
                      is_leaf=lambda x: hasattr(x, "value"))


def _fake_run(root: pathlib.Path) -> pathlib.Path:
  (root / "checkpoints" / "3").mkdir(parents=True)
  (root / "checkpoints" / "3" / "state").write_text("weights")
  return root


@pytest.mark.parametrize("where", ["workdir", "inside", "above"])
def test_force_never_deletes_the_workdir(tmp_path, tok, where):
  run = _fake_run(tmp_path / "runs" / "cb")
  output = {"workdir": run, "inside": run / "hf", "above": tmp_path / "runs"}[where]
  c = _config()
  with pytest.raises(UserError, match="workdir") as err:
    convert.export(c, _params(c), tok, output, force=True, workdir=run)
  assert "\n" not in str(err.value)
  assert (run / "checkpoints" / "3" / "state").read_text() == "weights"


def test_force_refuses_any_folder_holding_checkpoints(tmp_path, tok):
  other = _fake_run(tmp_path / "other_run")
  c = _config()
  for output in (other / "hf", tmp_path):
    with pytest.raises(UserError, match="checkpoints"):
      convert.export(c, _params(c), tok, output, force=True)
  assert (other / "checkpoints" / "3" / "state").exists()


def test_killed_export_is_recovered_by_the_next(tmp_path, tok):
  """What a kill leaves (old folder set aside, new one half-written) is undone by the next export."""
  c = _config()
  out = tmp_path / "hf"
  convert.export(c, _params(c), tok, out)
  first = (out / "model.safetensors").read_bytes()
  # A kill between "rename old aside" and "rename new in", during a later export.
  out.rename(tmp_path / ".hf.old-0123abcd")
  (tmp_path / ".hf.tmp-89abcdef").mkdir()
  (tmp_path / ".hf.tmp-89abcdef" / "model.safetensors").write_bytes(b"half")
  (tmp_path / ".hf.tmp-deadbeef").mkdir()  # From an even earlier kill.
  with pytest.raises(UserError, match="not empty"):
    convert.export(c, _params(c), tok, out)  # Restored first, so without --force it is refused.
  assert (out / "model.safetensors").read_bytes() == first
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"], "staging folders of killed exports are removed"
  convert.export(c, _params(c), tok, out, force=True)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


_ENV_FAULTS = r"""
import pathlib, subprocess, sys
sys.path.insert(0, sys.argv[2])
from tests.integration import test_pod_export as t
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer
from crossbert_jax.hf import convert
root = pathlib.Path(sys.argv[1])
c = t._config()
tok = tokenizer.Tokenizer.load(sys.argv[3])
prev = root / "hf"
prev.mkdir()
(prev / "model.safetensors").write_text("previous export")
for case in ("full", "readonly"):
  if case == "readonly":
    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
  try:
    convert.export(c, t._params(c), tok, prev, force=True)
    print(case, "no error")
  except UserError as e:
    print(case, "error:", e)
  print(case, "kept:", (prev / "model.safetensors").read_text(), sorted(p.name for p in root.iterdir()))
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a private tmpfs")
def test_full_and_read_only_disk_are_one_line_and_keep_the_previous_export(tmp_path, tok):
  """A 300 KiB tmpfs (the export needs ~1 MB), then the same tmpfs remounted read-only."""
  tok_path = tmp_path / "spm.model"
  tok_path.write_bytes(tok.serialized_proto)
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  script = (f"mount -t tmpfs -o size=300k tmpfs {mnt} && "
            f"{sys.executable} -c '{_ENV_FAULTS}' {mnt} {ROOT} {tok_path}")
  proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], env={**os.environ, "JAX_PLATFORMS": "cpu"},
                        capture_output=True, text=True, timeout=300)
  if proc.returncode and "mount" in proc.stderr and "Operation not permitted" in proc.stderr:
    pytest.skip(f"no private mounts here: {proc.stderr.strip()[:200]}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "full error: could not write" in out and "No space left on device" in out, out
  assert "readonly error: could not write" in out and "Read-only file system" in out, out
  assert out.count("kept: previous export ['hf']") == 2, f"the previous export must survive untouched:\n{out}"

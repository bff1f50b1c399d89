"""Forked runs (`train.fork_from`) and WSD decay branches: a branch equals a straight WSD run bitwise,
the source run is only read (local disk and gs://), and a fork resumes from its own checkpoints.

The train command runs in this process (`run_command`: its flags and main, the tests' 8 fake CPU
devices); the gs:// case in a subprocess.
"""

import hashlib
import json
import pathlib

import numpy as np
import orbax.checkpoint as ocp
import pytest

from crossbert_jax.run import metrics
from tests.helpers import run_command, run_module
from tests.integration.test_pod_gcs import BUCKET, GS, gcs  # noqa: F401 - the module-scoped GCS emulator fixture.

WSD = [
    "--config.train.decay=wsd", "--config.train.decay_fraction=0.2", "--config.train.warmup_steps=2",
    "--config.checkpoint.every_steps=100", "--config.metrics.tensorboard=False"]


def _train(workdir, *overrides, env=None, check=True):
  """The train command: in this process (`run_command`), or in a subprocess when `env` is given (the GCS
  emulator's address, which a storage client reads when it is made)."""
  args = [
      "--config=configs/crossbert.py:tiny", f"--workdir={workdir}", "--config.metrics.progress_bar=False", *overrides]
  if env is not None:
    return run_module(["crossbert_jax.train", *args], env=env, check=check)
  proc = run_command("crossbert_jax.train", *args)
  assert not check or proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _snapshot(root: pathlib.Path) -> dict[str, tuple]:
  """Every path under `root`: (sha256, size, mtime_ns) of files, mtime_ns of folders."""
  out = {}
  for p in sorted(root.rglob("*")):
    st = p.stat()
    out[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir",
                                     st.st_size if p.is_file() else 0, st.st_mtime_ns)
  out["."] = ("dir", 0, root.stat().st_mtime_ns)
  return out


def _params(workdir, step) -> dict[str, np.ndarray]:
  state = ocp.StandardCheckpointer().restore(pathlib.Path(workdir) / "checkpoints" / str(step) / "state")
  leaves = {}

  def walk(tree, prefix=""):
    if isinstance(tree, dict):
      for k, v in tree.items():
        walk(v, f"{prefix}/{k}")
    else:
      leaves[prefix] = np.asarray(tree)

  walk(state["params"])
  return leaves


def _rows(workdir) -> dict[int, dict]:
  return {r["step"]: r for r in metrics.read_metrics(str(workdir))}


@pytest.mark.slow  # 70 s: make test keeps the gs:// and refusal cases; CI runs it (make test-slow).
def test_wsd_branch_equals_a_straight_run_and_leaves_its_source_untouched(tmp_path, spm_model):
  tok = f"--config.data.tokenizer={spm_model}"
  # Straight: a 10-step WSD run (stable to step 8, decay over 9-10).
  _train(tmp_path / "straight", tok, *WSD, "--config.train.steps=10")
  # Stable: the 20-step schedule stopped at its own decay start (16); it keeps step 8, budget 10's fork point,
  # although checkpoint.keep=1 would garbage-collect it.
  stable = tmp_path / "stable"
  _train(stable, tok, *WSD, "--config.train.steps=20", "--config.train.stop_at_step=16", "--config.checkpoint.keep=1",
         "--config.checkpoint.keep_steps=(8,)")
  assert sorted(int(p.name) for p in (stable / "checkpoints").iterdir() if p.name.isdigit()) == [8, 16]
  before = _snapshot(stable)

  branch = tmp_path / "branch"
  fork = [tok, *WSD, "--config.train.steps=10", f"--config.train.fork_from={stable}:8"]
  first = _train(branch, *fork, "--config.train.stop_at_step=9")  # Interrupted after one step of its own.
  assert f"forked from {stable} at step 8" in first.stderr, first.stderr[-2000:]
  assert sorted(_rows(branch)) == [9]
  second = _train(branch, *fork)  # Resumes from its own step 9, not the source's step 8.
  assert "forked from" not in second.stderr, second.stderr[-2000:]
  assert _snapshot(stable) == before, "the source run was written to"

  assert json.loads((branch / "config.json").read_text())["train"]["fork_from"] == f"{stable}:8"
  straight, forked = _rows(tmp_path / "straight"), _rows(branch)
  assert sorted(forked) == [9, 10]
  for s in (9, 10):
    for key in ("loss", "learning_rate", "tokens_seen", "grad_norm"):
      assert forked[s][key] == straight[s][key], f"step {s} {key}: {forked[s][key]} (branch) != {straight[s][key]}"
  a, b = _params(tmp_path / "straight", 10), _params(branch, 10)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=f"param {k}: the branch differs from the straight run")


@pytest.mark.slow
def test_fork_refusals_are_one_line(tmp_path, spm_model):
  tok = f"--config.data.tokenizer={spm_model}"
  src = tmp_path / "src"
  _train(src, tok, "--config.train.steps=2", "--config.metrics.tensorboard=False")
  for overrides, needle in (([f"--config.train.fork_from={tmp_path / 'nothing'}"], "holds no checkpoints/"),
                            ([f"--config.train.fork_from={src}:1"], "has checkpoints at steps [2], not 1"),
                            ([f"--config.train.fork_from={src}", "--config.train.seed=3"], "train.seed=0")):
    proc = _train(tmp_path / "fork", tok, "--config.train.steps=4", *overrides, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().startswith("error: config train.fork_from=") and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def _refused(proc, needle):
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().startswith("error: config train.fork_from=") and needle in proc.stderr, proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow  # 60 s: two 4-step runs.
def test_fork_into_its_source_or_a_workdir_with_other_checkpoints_is_refused_and_writes_nothing(tmp_path, spm_model):
  """A fork pointed at its source (or inside it), or at a run that is not that fork, exits 2 and leaves
  every checkpoint in place: it used to resume the source and delete its fork points."""
  tok = f"--config.data.tokenizer={spm_model}"
  src, plain = tmp_path / "src", tmp_path / "plain"
  keep = [
      "--config.train.steps=4", "--config.checkpoint.every_steps=2", "--config.checkpoint.keep_steps=(2,)",
      "--config.metrics.tensorboard=False"]
  _train(src, tok, *keep)
  _train(plain, tok, *keep)

  # The refusal inside `plain` comes after its lock was taken (lock.json comes and goes): its checkpoints,
  # config and metrics must not change; `src` is refused before anything is opened.
  def state():
    return _snapshot(src), _snapshot(plain / "checkpoints"), [
        (plain / f).read_bytes() for f in ("config.json", "metrics.jsonl")]

  before = state()
  longer = [
      tok, "--config.train.steps=8", "--config.checkpoint.keep=1", "--config.checkpoint.keep_steps=()",
      "--config.metrics.tensorboard=False"]
  _refused(_train(src, *longer, f"--config.train.fork_from={src}:2", check=False), "the source itself")
  _refused(_train(src / "checkpoints" / "branch", *longer, f"--config.train.fork_from={src}:2", check=False),
           "inside the source")
  _refused(_train(plain, *longer, f"--config.train.fork_from={src}:2", check=False), "a run that was not forked")
  assert state() == before, "a refused fork wrote to a workdir"
  # stop_at_step at the fork step: refused, said of the source's step (the fork would train nothing).
  _refused(
      _train(tmp_path / "fork", *longer, f"--config.train.fork_from={src}:2", "--config.train.stop_at_step=2",
             check=False), "step 2 is not before train.stop_at_step=2, so the fork would train nothing")
  assert not (tmp_path / "fork").exists(), "a refused fork left its workdir behind"


def test_fork_records_decide_a_resume(tmp_path):
  """A workdir's checkpoints resume under the fork_from they record (with or without its step), never another."""
  from crossbert_jax.core import config as config_lib
  from crossbert_jax.core import plan as plan_lib
  from crossbert_jax.core.errors import UserError
  from crossbert_jax.run import fork

  def given(fork_from):
    c = config_lib.get_config("crossbert", "tiny")
    c.train.fork_from = fork_from
    return plan_lib.build(c)

  src = tmp_path / "src"
  recorded = {"train": {"fork_from": f"{src}:20"}}
  fork.check_resumed(given(f"{src}:20"), tmp_path / "b", 30, recorded)
  bare = given(str(src))
  assert fork.check_resumed(bare, tmp_path / "b", 30, recorded
                           ).train.fork_from == f"{src}:20", "a rerun without the step records the resolved SOURCE:STEP"
  for other in (f"{src}:10", str(tmp_path / "other")):
    with pytest.raises(UserError, match=f"of a fork from {src}:20"):
      fork.check_resumed(given(other), tmp_path / "b", 30, recorded)
  with pytest.raises(UserError, match="of a run that was not forked"):
    fork.check_resumed(given(f"{src}:20"), tmp_path / "b", 30, {"train": {"fork_from": ""}})
  for inside in (src, src / "checkpoints" / "branch"):
    with pytest.raises(UserError, match="--workdir"):
      fork.check_workdir(given(f"{src}:20"), inside)
  fork.check_workdir(given(f"{src}:20"), tmp_path / "srcx")  # A sibling whose name starts with the source's.
  with pytest.raises(UserError, match="inside the source"):
    fork.check_workdir(given("gs://b/src:20"), "gs://b/src/branch")
  fork.check_workdir(given("gs://b/src:20"), "gs://b/src2")


def _gcs_objects(url: str, prefix: str) -> dict[str, tuple]:
  import urllib.parse  # pylint: disable=g-import-not-at-top
  import urllib.request  # pylint: disable=g-import-not-at-top
  query = urllib.parse.urlencode({"prefix": prefix})
  with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o?{query}", timeout=10) as r:
    items = json.load(r).get("items", [])
  return {i["name"]: (i.get("md5Hash"), i.get("generation"), i.get("updated"), i.get("size")) for i in items}


@pytest.mark.slow
def test_fork_from_gcs_reads_only(gcs, tmp_path, spm_model):  # noqa: F811 - the fixture.
  env, url = gcs
  tok = f"--config.data.tokenizer={spm_model}"
  src = f"{GS}/fork_src"
  _train(src, tok, *WSD, "--config.train.steps=4", "--config.checkpoint.every_steps=2", env=env)
  before = _gcs_objects(url, "fork_src/")
  assert any("/checkpoints/2/" in n for n in before), sorted(before)[:20]
  _train(tmp_path / "fork", tok, *WSD, "--config.train.steps=6", f"--config.train.fork_from={src}:2", env=env)
  assert _gcs_objects(url, "fork_src/") == before, "the gs:// source run was written to"
  assert sorted(_rows(tmp_path / "fork")) == [3, 4, 5, 6]

"""tools/accelerator_check.sh --dry_run: every step of the accelerator check at tiny shapes on the CPU,
so the script is known to work when a GPU is lent (about 80 s on 2 cores); the wrapper's refusals,
its OUT and flags, and a stop that ends every process it started."""

import gzip
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import pytest

from tests import helpers


@pytest.mark.slow  # Every step of the check in one script: 106-118 s in the integration tier (2026-12-07).
def test_the_accelerator_check_dry_run_passes_every_step(tmp_path, shared_data):
  env = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu", "CROSSBERT_DATA": str(shared_data)}
  env.pop("OUT", None)
  proc = subprocess.run(["bash", "tools/accelerator_check.sh",
                         str(tmp_path / "out"), "--dry_run"], cwd=helpers.ROOT, env=env, capture_output=True, text=True,
                        timeout=900)
  log = (tmp_path / "out" / "accelerator_check.log").read_text()
  assert proc.returncode == 0, log[-4000:]
  assert "== versions found" in log and "  jax " in log
  report = json.loads((tmp_path / "out" / "accelerator_check.json").read_text())
  steps = report["steps"]
  assert report["dry_run"] and list(steps) == [
      "peer", "versions", "attention", "attention_speed", "bench", "resume", "export", "tests", "curves"]
  assert all(r.get("passed", True) for r in steps.values()), json.dumps(steps)[:3000]
  assert set(steps["attention"]["backends"]
            ) == {"chunked", "gpu_flash", "gpu_flash_local", "gpu_flash_gathered", "gpu_flash_cross", "cudnn_bf16"}
  assert {"cudnn", "gpu_flash local 32", "chunked local 32",
          "gpu_flash local 32 gathered"} <= set(steps["attention_speed"]["backends"])
  assert all(r["median_ms"] > 0 for r in steps["attention_speed"]["backends"].values())
  peer = steps["peer"]  # transformers' ModernBERT at the tiny shape, on the CPU.
  assert peer["variants"]["sdpa"]["tokens_per_s"] > 0 and peer["best"] == "sdpa"
  cases = steps["bench"]["cases"]
  assert list(cases) == ["bert_r0.15", "cb_r0.5_k1", "cb_mb_levers", "bert_mb_levers_batch", "bert_mb_attention_cudnn"]
  assert all(case["tokens_per_s"] > 0 for case in cases.values())
  for case in cases.values():
    assert case["vs_peer"] == case["tokens_per_s"] / peer["best_tokens_per_s"]
  every = cases["bert_mb_levers_batch"]
  assert every["global_every"] == 3 and every["head_dtype"] == "bfloat16" and every["batch_size"] == 32
  # remat auto and grad_accum 0 (auto), with no memory size known on a CPU: none, one micro-batch.
  assert every["remat"] == "none" and every["grad_accum"] == 1
  assert "case " in log and "peer sdpa" in log  # The table.
  for case in (c for c in cases.values() if "trace" in c):  # Each case's trace came back and parses with jax's reader.
    xspace = gzip.decompress((tmp_path / "out" / case["trace"]).read_bytes())
    planes = [plane.name for plane in jax.profiler.ProfileData.from_serialized_xspace(xspace).planes]
    assert any(name.startswith("/host:CPU") for name in planes), planes
  curves = steps["curves"]["objectives"]["bert"]  # Two tiny runs: the reference and one lever (chunked here).
  assert list(curves) == ["reference", "cudnn"] and curves["cudnn"]["tracks"], curves
  assert curves["cudnn"]["gap"] < 1e-3 and curves["cudnn"]["tolerance"] == 0.02  # No seed run: the floor.
  assert len(curves["reference"]["loss"]) == 4 and "curves bert" in log
  resumed = steps["resume"]
  assert resumed["killed_before_it_finished"] and resumed["final_steps"] == [12, 12] and resumed["bitwise"]
  assert "verified" in steps["export"]["verify_lines"][0]
  assert sorted(os.listdir(tmp_path / "out")) == [
      "accelerator_check.json", "accelerator_check.log", "profile_bert_r0.15.xplane.pb.gz",
      "profile_cb_mb_levers.xplane.pb.gz", "profile_cb_r0.5_k1.xplane.pb.gz"]


def _wrapper(*args: str, tmp_path, out_env: str | None = None, wait: bool = True):
  """The wrapper on this CPU (JAX_PLATFORMS=cpu), its temporary folders under tmp_path/tmp."""
  (tmp_path / "tmp").mkdir(exist_ok=True)
  env = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu", "TMPDIR": str(tmp_path / "tmp")}
  env.pop("OUT", None)
  if out_env:
    env["OUT"] = out_env
  cmd = ["bash", "tools/accelerator_check.sh", *args]
  if not wait:
    return subprocess.Popen(cmd, cwd=helpers.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  return subprocess.run(cmd, cwd=helpers.ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_refusals_are_one_line_before_anything_is_written(tmp_path):
  """OUT a file, an unknown option, and no GPU without --dry_run (not minutes of full-size steps on the CPU)."""
  a_file = tmp_path / "a_file"
  a_file.write_text("mine")
  out = tmp_path / "out"
  for args, line in (([str(a_file),
                       "--dry_run"], f"error: OUT {a_file} is a file: give a folder for the JSON and the log"),
                     ([str(out), "--dry-run"], "error: unknown option --dry-run: use bash tools/accelerator_check.sh "
                      "[OUT] [--dry_run] [--steps=a,b]"),
                     ([str(out)], "error: no GPU found (jax's backend: cpu): run this on the lent GPU machine, or pass "
                      "--dry_run for the tiny shapes on the CPU")):
    proc = _wrapper(*args, tmp_path=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (2, "", [line]), proc.stderr
  assert a_file.read_text() == "mine" and not out.exists() and not any((tmp_path / "tmp").iterdir())


def test_dry_run_alone_is_a_flag_and_out_comes_from_the_environment(tmp_path):
  out = tmp_path / "from_env"
  proc = _wrapper("--dry_run", "--steps=versions", tmp_path=tmp_path, out_env=str(out))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((out / "accelerator_check.json").read_text())
  assert report["dry_run"] and list(report["steps"]) == ["versions"]
  assert not (helpers.ROOT / "--dry_run").exists() and not any((tmp_path / "tmp").iterdir())  # Its runs' folder: gone.


def test_cases_pick_the_bench_rows_of_a_second_call(tmp_path):
  """--cases runs those bench rows only (a second call measures what the first left past its budget); a name
  that is no case is one line in the log, exit 2, before any step (as an unknown --steps)."""
  out = tmp_path / "out"
  proc = _wrapper(str(out), "--dry_run", "--steps=bench", "--cases=nope,cb_mb", tmp_path=tmp_path)
  assert proc.returncode == 2 and "error: --cases nope: use some of bert_r0.15," in proc.stdout, proc.stdout[-2000:]
  assert sorted(os.listdir(out)) == ["accelerator_check.log"]
  proc = _wrapper(str(out), "--dry_run", "--steps=bench", "--cases=cb_mb", tmp_path=tmp_path)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  cases = json.loads((out / "accelerator_check.json").read_text())["steps"]["bench"]["cases"]
  assert list(cases) == ["cb_mb"] and cases["cb_mb"]["global_every"] == 3 and cases["cb_mb"]["tokens_per_s"] > 0


def _ours(tmp_path) -> list[str]:
  """Command lines of the live processes that name tmp_path (the check, its runs; not zombies)."""
  found = []
  for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
    try:
      text = cmdline.read_bytes().replace(b"\0", b" ").decode()
    except OSError:
      continue
    if str(tmp_path) in text:
      found.append(text)
  return found


def test_a_stopped_wrapper_stops_the_check_and_its_runs(tmp_path):
  """SIGTERM to the wrapper while the check trains its runs: every process it started ends, exit 143."""
  out = tmp_path / "out"
  proc = _wrapper(str(out), "--dry_run", "--steps=versions,resume", tmp_path=tmp_path, wait=False)
  deadline = time.time() + 120
  while not (out / "accelerator_check.json").exists() and time.time() < deadline:  # After the versions step.
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    time.sleep(0.2)
  while not any("crossbert_jax" in p for p in _ours(tmp_path)) and time.time() < deadline:  # A run started.
    time.sleep(0.2)
  assert any("crossbert_jax" in p for p in _ours(tmp_path)), _ours(tmp_path)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=60) == 143
  deadline = time.time() + 30
  while _ours(tmp_path) and time.time() < deadline:
    time.sleep(0.2)
  assert not _ours(tmp_path)
  assert "== exit 143 (stopped by SIGTERM)" in (out / "accelerator_check.log").read_text()

"""tools/accelerator_check.sh --dry_run: every step of the accelerator check at tiny shapes on the CPU,
so the script is known to work when a GPU is lent (about 80 s on 2 cores)."""

import json
import os
import subprocess
import sys

from tests import helpers


def test_the_accelerator_check_dry_run_passes_every_step(tmp_path, shared_data):
  env = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu", "CROSSBERT_DATA": str(shared_data)}
  env.pop("OUT", None)
  proc = subprocess.run(["bash", "tools/accelerator_check.sh", str(tmp_path / "out"), "--dry_run"], cwd=helpers.ROOT,
                        env=env, capture_output=True, text=True, timeout=900)
  log = (tmp_path / "out" / "accelerator_check.log").read_text()
  assert proc.returncode == 0, log[-4000:]
  assert "== versions found" in log and "  jax " in log
  report = json.loads((tmp_path / "out" / "accelerator_check.json").read_text())
  steps = report["steps"]
  assert report["dry_run"] and list(steps) == ["versions", "attention", "bench", "resume", "export", "tests"]
  assert all(r.get("passed", True) for r in steps.values()), json.dumps(steps)[:3000]
  assert set(steps["attention"]["backends"]) == {"chunked", "gpu_flash"}
  assert all(case["tokens_per_s"] > 0 for case in steps["bench"]["cases"].values())
  resumed = steps["resume"]
  assert resumed["killed_before_it_finished"] and resumed["final_steps"] == [12, 12] and resumed["bitwise"]
  assert "verified" in steps["export"]["verify_lines"][0]
  assert sorted(os.listdir(tmp_path / "out")) == ["accelerator_check.json", "accelerator_check.log"]

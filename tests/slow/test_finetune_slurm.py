"""finetune --executor=slurm against a real one-node SLURM (tests/slurm_cluster.py): each trial its own batch
job, RTE's after MNLI's (afterok), a rerun while they are held submits nothing, the table once they end equals a
local run's (paths aside), and a trial that ended with exit 2 (its input refused) is named instead of resubmitted. MNLI is a copy of
RTE's rows in MNLI's layout (the shared data has no MNLI). Skips, saying why, where SLURM cannot start; the sbatch
lines and scripts of the same path are checked without SLURM in tests/integration/test_finetune.py."""

import json
import socket
import subprocess
import time

import pytest

from tests import slurm_cluster
from tests.helpers import cpu_env, run_module
from tests.integration.test_finetune import mnli_from_rte
from tests.integration.test_glue import write_hub_copy

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
ARGS = [
    "--task=mnli,rte", "--learning_rates=5e-5", "--epochs=1", "--weight_decays=0", "--seeds=0", "--max_steps=3",
    "--batch_size=16", "--max_length=32"]
TRIAL = "lr5e-05-ep1-wd0-seed0"


@pytest.mark.slow
def test_slurm_trials_run_mnli_first_and_build_the_local_table(tiny_run, shared_data, tmp_path):
  if why := slurm_cluster.available():
    pytest.skip(f"no one-node SLURM here: {why}")
  copy = tmp_path / "glue"
  write_hub_copy(shared_data, copy, ("rte",))
  mnli_from_rte(copy)
  common = [f"--workdir={tiny_run}", f"--data_dir={copy}", *ARGS]
  ref, out = tmp_path / "local", tmp_path / "ft"  # tmp_path/slurm is the cluster's.
  run_module(["crossbert_jax.finetune", f"--output_dir={ref}", *common], env=cpu_env(**OFFLINE))
  cluster = slurm_cluster.OneNode(tmp_path)
  env = cpu_env(**OFFLINE, SLURM_CONF=cluster.env["SLURM_CONF"])
  argv = ["crossbert_jax.finetune", f"--output_dir={out}", *common, "--executor=slurm"]
  try:
    first = run_module(argv, env=env)
    mnli_job = json.loads((out / "slurm" / "mnli" / TRIAL / "job.json").read_text())["job"]
    assert f"mnli {TRIAL}: submitted as job {mnli_job}" in first.stdout, first.stdout
    assert f"rte {TRIAL}: submitted as job" in first.stdout and "(after 1 MNLI job(s))" in first.stdout, first.stdout
    assert "2 trial(s) queued or running on SLURM; rerun the same command" in first.stdout, first.stdout
    assert json.loads((out / "slurm" / "rte" / TRIAL / "job.json").read_text())["after"] == [mnli_job]
    again = run_module(argv, env=env)  # Each trial is held by SLURM or finished: nothing is submitted twice.
    assert "submitted as job" not in again.stdout, again.stdout
    (key,) = [p.name for p in (ref / "trials").iterdir()]  # The encoder's folder (the run's name and step).
    results = [out / "trials" / key / task / TRIAL / "result.json" for task in ("mnli", "rte")]
    deadline = time.time() + 600
    while time.time() < deadline and not all(r.is_file() for r in results):
      time.sleep(2)
    assert all(r.is_file() for r in results), (out / "logs" / "rte" / f"{TRIAL}.log").read_text()[-3000:]
    last = run_module(argv, env=env)
    assert "[slurm]" not in last.stdout, last.stdout
    for name in ("glue_finetuned.json", "glue_finetuned.md"):
      assert (out / name).read_text().replace(str(out), "O") == (ref / name).read_text().replace(str(ref), "O")
    assert json.loads((out / "slurm" / "rte" / TRIAL / "exit.json").read_text())["rc"] == 0

    # A trial that ends with exit 2 is named, not resubmitted: RTE's again (its result gone), queued while the node
    # is drained and its train split moved away, then run: it refuses its input and exits 2.
    results[1].unlink()
    node = ["scontrol", "update", f"nodename={socket.gethostname().split('.')[0]}"]
    subprocess.run([*node, "state=drain", "reason=test"], env=cluster.env, check=True, timeout=60)
    run_module(argv, env=env)
    train = copy / "rte" / "train-00000-of-00001.parquet"
    train.rename(tmp_path / "rte_train.parquet")
    subprocess.run([*node, "state=resume"], env=cluster.env, check=True, timeout=60)
    exit_file = out / "slurm" / "rte" / TRIAL / "exit.json"
    deadline = time.time() + 300
    while time.time() < deadline and not exit_file.is_file():
      time.sleep(1)
    (tmp_path / "rte_train.parquet").rename(train)
    assert json.loads(exit_file.read_text())["rc"] == 2
    refused = run_module(argv, env=env, check=False)
    assert refused.returncode == 1 and f"rte {TRIAL} (failed: exit 2, a bad input" in refused.stderr, refused.stderr
    assert "submitted as job" not in refused.stdout, refused.stdout
  finally:
    cluster.stop()

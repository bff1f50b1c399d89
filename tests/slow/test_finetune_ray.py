"""finetune --executor=ray on a real local Ray cluster: each trial its own process there, the table equal to a
local run's (paths aside); run again, nothing is dispatched."""

from tests import ray_cluster
from tests.helpers import cpu_env, run_module

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
ARGS = [
    "--task=rte,stsb", "--learning_rates=5e-5", "--epochs=1", "--weight_decays=0", "--seeds=0", "--max_steps=3",
    "--batch_size=16", "--max_length=32"]


def test_trials_on_ray_equal_a_local_run_and_are_not_trained_again(tiny_run, shared_data, tmp_path):
  common = [f"--workdir={tiny_run}", f"--data_dir={shared_data}", *ARGS]
  ref, out = tmp_path / "local", tmp_path / "ray"
  run_module(["crossbert_jax.finetune", f"--output_dir={ref}", *common], env=cpu_env(**OFFLINE))
  cluster = ray_cluster.LocalCluster(tmp_path, num_cpus=2, env=OFFLINE)
  try:
    argv = [
        "crossbert_jax.finetune", f"--output_dir={out}", *common, "--executor=ray", f"--ray_address={cluster.address}"]
    proc = run_module(argv, env=cpu_env(**OFFLINE))
    assert "[ray] 2 trial(s) submitted (1 CPU, 0 GPU each)" in proc.stdout, proc.stdout
    assert proc.stdout.count(": done") == 2
    assert sorted(p.name for p in (out / "logs").glob("*/*.log")) == ["lr5e-05-ep1-wd0-seed0.log"] * 2
    for name in ("glue_finetuned.json", "glue_finetuned.md"):
      assert (out / name).read_text().replace(str(out), "O") == (ref / name).read_text().replace(str(ref), "O")
    again = run_module(argv, env=cpu_env(**OFFLINE))
    assert "[ray]" not in again.stdout and "starting" not in again.stdout  # Every trial finished: none dispatched.

  finally:
    cluster.stop()

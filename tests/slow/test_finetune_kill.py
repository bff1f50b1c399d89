"""finetune killed with kill -9 mid-trial (after its first epoch's checkpoint) resumes to the same result table,
byte for byte, as an uninterrupted run's."""

import time

from tests.helpers import cpu_env, run_module

ARGS = [
    "--task=rte", "--learning_rates=5e-5", "--epochs=2", "--weight_decays=0", "--seeds=0", "--batch_size=64",
    "--max_length=32"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def test_kill_9_mid_trial_resumes_to_the_same_table(tiny_run, shared_data, tmp_path):
  common = [f"--workdir={tiny_run}", f"--data_dir={shared_data}", *ARGS]
  env = cpu_env(**OFFLINE)
  ref = tmp_path / "ref"
  run_module(["crossbert_jax.finetune", f"--output_dir={ref}", *common], env=env)
  out = tmp_path / "killed"
  proc = run_module(["crossbert_jax.finetune", f"--output_dir={out}", *common], env=env, wait=False)
  deadline = time.time() + 600
  # RTE's 2,490 rows are 39 steps of 64: the first epoch's checkpoint is step 39, committed when Orbax writes this.
  while not list(out.glob("trials/*/rte/*/checkpoints/39/_CHECKPOINT_METADATA")):
    assert proc.poll() is None and time.time() < deadline, f"no epoch checkpoint:\n{proc.stderr.read()[-2000:]}"
    time.sleep(0.1)
  proc.kill()
  proc.communicate()
  assert not (out / "glue_finetuned.json").exists()
  resumed = run_module(["crossbert_jax.finetune", f"--output_dir={out}", *common], env=env)
  assert "resuming at step 39" in resumed.stdout
  for name in ("glue_finetuned.json", "glue_finetuned.md"):
    assert (out / name).read_bytes() == (ref / name).read_bytes()

"""finetune end to end on CPU: the tiny run fine-tuned on RTE and STS-B from the shared data (the command's one
subprocess smoke test), a finished trial never trained again, SIGTERM then resume equal bit for bit, the export
verified in transformers, the first steps' losses equal to a transformers training loop's from the same init on
the same batches, and bad input refused in one line with nothing written."""

import json
import math
import os
import signal
import struct

import numpy as np
import pytest
from etils import epath

from crossbert_jax.finetuning import batches as batches_lib
from crossbert_jax.finetuning import driver, recipe, sources
from crossbert_jax.finetuning import trial as trial_lib
from crossbert_jax.finetuning.classifier import HeadSpec
from tests.helpers import cpu_env, run_module
from tests.integration.test_observe import wandb_history

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SMALL = [
    "--learning_rates=5e-5", "--epochs=1", "--weight_decays=0", "--seeds=0", "--max_steps=3", "--batch_size=16",
    "--max_length=32"]


@pytest.fixture(scope="module")
def finetuned(tiny_run, shared_data, tmp_path_factory):
  """The smoke test's output: `finetune --task=rte,stsb` on the session's tiny run, 3 steps per task (1 device)."""
  out = tmp_path_factory.mktemp("finetune") / "out"
  args = [
      "crossbert_jax.finetune", "--task=rte,stsb", f"--workdir={tiny_run}", f"--output_dir={out}",
      f"--data_dir={shared_data}", *SMALL, "--wandb", "--wandb_project=ft_smoke"]
  proc = run_module(args, env=cpu_env(**OFFLINE, WANDB_MODE="offline", WANDB_SILENT="true"))
  return out, args[1:], proc


def mnli_from_rte(copy) -> None:
  """copy/mnli (a Hub-layout GLUE copy with rte/): RTE's rows in MNLI's columns and splits (labels 0 and 1 of MNLI's 3)."""
  import pyarrow.parquet as pq

  (copy / "mnli").mkdir()
  for ours, theirs in (("train", ["train"]), ("validation", ["validation_matched", "validation_mismatched"])):
    table = pq.read_table(copy / "rte" / f"{ours}-00000-of-00001.parquet")
    table = table.rename_columns(["premise", "hypothesis", *table.column_names[2:]])
    for split in theirs:
      pq.write_table(table, copy / "mnli" / f"{split}-00000-of-00001.parquet")


def _tensorboard_scalars(logdir) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} from the TFRecord event files in `logdir` (tensorboardX's protos)."""
  from tensorboardX.proto import event_pb2
  scalars = {}
  for path in sorted(logdir.glob("events.out.tfevents*")):
    data, at = path.read_bytes(), 0
    while at < len(data):  # A record: uint64 length, uint32 crc, the event, uint32 crc.
      (length,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
      at += 12 + length + 4
      for value in event.summary.value:
        scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


def _trial(out, task):
  (folder,) = (out / "trials").glob(f"*/{task}/*")
  return folder


def test_smoke_rte_and_stsb_from_the_shared_data(finetuned):
  out, _, proc = finetuned
  assert proc.returncode == 0 and "wrote" in proc.stdout
  lines = [l for l in proc.stdout.splitlines() if "MNLI has no data here" in l]
  assert len(lines) == 2 and any("rte starts from the pretrained encoder" in l for l in lines)
  table = json.loads((out / "glue_finetuned.json").read_text())
  for row in ("rte", "stsb"):
    cell = next(iter(table["rows"][row]["scores"].values()))
    assert cell["start"] == "pretrained" and cell["seeds"] == 1 and math.isfinite(cell["mean"])
  assert table["rows"]["cola"]["scores"] == {}
  rows = [json.loads(l) for l in (_trial(out, "stsb") / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
  assert {"dev/stsb/pearson", "dev/stsb/spearman"} <= set(rows[-1])
  curves = _tensorboard_scalars(_trial(out, "stsb") / "tensorboard")
  assert curves["loss"] == {r["step"]: pytest.approx(r["loss"]) for r in rows if "loss" in r}
  assert curves["dev/stsb/spearman"] == {3: pytest.approx(rows[-1]["dev/stsb/spearman"])}
  ids, history = wandb_history(_trial(out, "stsb"))  # The offline W&B run: the same rows, one per step.
  assert list(ids.values()) == [f"out/{_trial(out, 'stsb').parent.parent.name}/stsb"]
  merged = {}
  for r in rows:
    merged.setdefault(r["step"], {}).update({k: v for k, v in r.items() if k not in ("epoch", "seconds")})
  assert history == [pytest.approx(r) for r in merged.values()]
  assert (out / "glue_finetuned.md").read_text().startswith("| task | metric |")


def test_a_finished_trial_is_not_trained_again(finetuned, command):
  out, args, _ = finetuned
  before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and "checkpoints" not in p.parts}
  proc = command("crossbert_jax.finetune", *args, env=OFFLINE)
  assert proc.returncode == 0, proc.stderr
  assert "starting" not in proc.stdout and "resuming" not in proc.stdout
  after = {p: p.read_bytes() for p in before}
  assert after == before  # Trials, metrics and the table: byte for byte.


def test_export_is_a_sequence_classifier_verified_in_transformers(finetuned, command, tmp_path):
  out, _, _ = finetuned
  proc = command("crossbert_jax.export", f"--workdir={_trial(out, 'rte')}", f"--output={tmp_path / 'hf'}", "--verify")
  assert proc.returncode == 0, proc.stderr
  assert "verified" in proc.stdout and "tolerance 1e-05" in proc.stdout
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["architectures"] == ["ModernBertForSequenceClassification"]
  assert config["id2label"] == {"0": "entailment", "1": "not_entailment"} and config["classifier_pooling"] == "mean"


def _rte(shared_data, tok, rows=64):
  tasks, _, _ = driver.load_tasks(["rte"], True, str(shared_data), lambda _: None)
  data = driver.encode(tasks["rte"], tok, 32)
  cut = lambda e, n: batches_lib.Encoded(e.ids[:n], e.labels[:n], e.pad_id)
  return trial_lib.TaskData("rte", cut(data.train, rows), {"rte": cut(data.dev["rte"], 64)})


def test_sigterm_then_resume_equals_an_uninterrupted_trial(tiny_run, shared_data, tmp_path, monkeypatch):
  """2 epochs of 4 steps; SIGTERM during step 6 (epoch 2): the trial saves and stops, then resumes to the same
  params, result and losses, bit for bit."""
  src = sources.from_workdir(str(tiny_run))
  data = _rte(shared_data, src.tokenizer)
  info = trial_lib.trial_info(recipe.Trial("rte", 5e-5, 2, 0.01, 1), src.spec, HeadSpec(2), start="pretrained",
                              source=driver._source_info(src), batch_size=16, max_length=32)  # pylint: disable=protected-access
  start = {"encoder": src.params["encoder"]}
  ref = trial_lib.run(epath.Path(tmp_path / "ref"), info, data, start, lambda _: None)

  real = batches_lib.train_batch

  def signalled(data_, step, *a):
    if step == 5:
      os.kill(os.getpid(), signal.SIGTERM)  # StopRequest turns it into a flag; the loop stops after this step.
    return real(data_, step, *a)

  monkeypatch.setattr(batches_lib, "train_batch", signalled)
  folder = epath.Path(tmp_path / "cut")
  with pytest.raises(trial_lib.Stopped, match="SIGTERM at step 6"):
    trial_lib.run(folder, info, data, start, lambda _: None)
  assert not (folder / "result.json").exists()
  monkeypatch.setattr(batches_lib, "train_batch", real)
  logs = []
  resumed = trial_lib.run(folder, info, data, start, logs.append)
  assert "resuming at step 6" in logs[0]
  assert resumed == ref
  read = lambda f: [{k: v
                     for k, v in json.loads(l).items()
                     if k != "seconds"}
                    for l in (f / "metrics.jsonl").read_text().splitlines()]
  assert read(folder) == read(epath.Path(tmp_path / "ref"))
  from crossbert_jax.finetuning import classifier
  abstract = classifier.abstract_params(src.spec, HeadSpec(2))
  a, b = (trial_lib.read_params(f, abstract) for f in (folder, epath.Path(tmp_path / "ref")))
  import jax
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_first_steps_losses_equal_a_transformers_loop(shared_data, tmp_path):
  """The same tiny HF classifier (same init), the same batches: our losses of steps 1-3 equal those of a torch
  loop built as transformers' Trainer builds its own (AdamW with its decay groups, get_linear_schedule_with_warmup)."""
  import torch
  import transformers

  from tools import finetune_peer

  folder = finetune_peer.classifier_folder(tmp_path / "init", 2, seed=3)
  tasks, _, _ = driver.load_tasks(["rte"], True, str(shared_data), lambda _: None)
  trial = recipe.Trial("rte", 8e-5, 1, 0.01, 3)
  ours, _ = finetune_peer.ours_run(folder, tasks["rte"], trial, tmp_path / "ours", 16, 32, max_steps=3)
  data = driver.encode(tasks["rte"], sources.from_hf(str(folder)).tokenizer, 32)
  steps = finetune_peer.epoch_batches(len(data.train), 16, 3, 1, max_steps=3)

  model = transformers.ModernBertForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).train()
  no_decay = ("bias", "norm")
  groups = [{
      "params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)], "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=8e-5, betas=recipe.BETAS, eps=recipe.EPS)
  sched = transformers.get_linear_schedule_with_warmup(opt, recipe.warmup_steps(3), 3)
  theirs = []
  for rows in steps:
    b = finetune_peer._pad(data.train, rows, data.train.pad_id)  # pylint: disable=protected-access
    loss = model(**b, labels=torch.tensor(data.train.labels[rows])).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    theirs.append(loss.item())
  assert len(ours) == 3
  np.testing.assert_allclose(ours, theirs, atol=2e-5)
  assert ours[1] != ours[0]  # The params moved: step 2 ran at a non-zero rate.


def test_print_trials_lists_each_trial_as_its_own_command(finetuned, command, tmp_path):
  out, args, _ = finetuned
  grid = [a for a in args if not a.startswith(("--learning_rates", "--seeds", "--output_dir"))]
  proc = command("crossbert_jax.finetune", *grid, "--learning_rates=1e-5,3e-5", "--seeds=0,1",
                 f"--output_dir={tmp_path / 'o'}", "--print_trials", env=OFFLINE)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert len(lines) == 8 and all("-m crossbert_jax.finetune --task=" in l for l in lines)  # 2 tasks x 2 lr x 2 seeds.
  assert "--task=stsb --learning_rates=1e-05 --epochs=1 --weight_decays=0 --seeds=0" in lines[0]
  assert all(l.endswith("--wandb --wandb_project=ft_smoke") for l in lines)
  assert not (tmp_path / "o").exists()


def test_print_trials_for_slurm_gives_each_trial_a_batch_job_and_mnlis_dependants_wait(
    tmp_path, shared_data, tiny_run, command):
  from tests.integration.test_glue import write_hub_copy

  copy = tmp_path / "glue"
  write_hub_copy(shared_data, copy, ("rte", "stsb"))
  mnli_from_rte(copy)
  proc = command("crossbert_jax.finetune", "--task=mnli,rte,stsb", f"--workdir={tiny_run}", f"--data_dir={copy}",
                 f"--output_dir={tmp_path / 'o'}", *SMALL, "--seeds=0,1", "--executor=slurm", "--trial_cpus=2",
                 "--print_trials", env=OFFLINE)
  assert proc.returncode == 0, proc.stderr
  lines = [l for l in proc.stdout.splitlines() if l.startswith("# sbatch")]
  assert len(lines) == 6 and all(l.endswith(".sbatch") for l in lines), proc.stdout  # 3 tasks x 2 seeds.
  assert [l.split("/slurm/")[1].split("/")[0] for l in lines] == ["mnli"] * 2 + ["stsb", "stsb", "rte", "rte"]
  after = "--dependency=afterok:JOB_OF_mnli_lr5e-05-ep1-wd0-seed0:JOB_OF_mnli_lr5e-05-ep1-wd0-seed1 --kill-on-invalid-dep=yes"
  assert [after in l for l in lines] == [False, False, True, True, True, True]  # RTE and STS-B start from MNLI's best.
  script = proc.stdout.split(lines[4], 1)[1].split("# sbatch", 1)[0]
  assert "#SBATCH --cpus-per-task=2" in script and "#SBATCH --requeue" in script and "--gpus" not in script
  assert "--task=rte --learning_rates=5e-05 --epochs=1 --weight_decays=0 --seeds=0" in script
  assert f"--output={tmp_path / 'o'}/logs/rte/lr5e-05-ep1-wd0-seed0.log" in script
  assert "scontrol requeue" in script and "exit.json" in script
  assert not (tmp_path / "o").exists()
  fractional = command("crossbert_jax.finetune", "--task=rte", f"--workdir={tiny_run}", f"--data_dir={copy}",
                       f"--output_dir={tmp_path / 'o'}", "--executor=slurm", "--trial_cpus=0.5", env=OFFLINE)
  assert fractional.returncode == 2 and "--trial_cpus=0.5: --executor=slurm asks for whole CPUs" in fractional.stderr
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case",
                         ["unknown task", "no grid values", "not a run", "task without data", "labels out of range"])
def test_bad_input_is_one_line_exit_2_nothing_written(case, tiny_run, shared_data, tmp_path, command):
  out = tmp_path / "out"
  args = {"--task": "rte", "--workdir": str(tiny_run), "--data_dir": str(shared_data), "--output_dir": str(out)}
  if case == "unknown task":
    args["--task"], want = "wnli", "'wnli' is not a GLUE task"
  elif case == "no grid values":
    args["--learning_rates"], want = ",", "--learning_rates=',' gives no value"
  elif case == "not a run":
    (tmp_path / "empty").mkdir()
    args["--workdir"], want = str(tmp_path / "empty"), "holds no checkpoints/"
  elif case == "task without data":
    args["--task"], want = "qnli", "--task=qnli has no data to fine-tune on (no train split"
  else:
    from tests.integration.test_glue import write_hub_copy

    copy = tmp_path / "glue"
    write_hub_copy(shared_data, copy, ("rte",), label_of=lambda y: np.where(np.arange(len(y)) == 3, 7, y))
    args["--data_dir"], want = str(copy), "has label 7 outside the task's classes"
  proc = command("crossbert_jax.finetune", *(f"{k}={v}" for k, v in args.items()), env=OFFLINE)
  assert proc.returncode == 2
  assert proc.stderr.count("\n") == 1 and want in proc.stderr, proc.stderr
  assert not out.exists()


def test_an_output_dir_of_other_settings_is_refused(finetuned, command):
  out, args, _ = finetuned
  table = (out / "glue_finetuned.json").read_bytes()
  proc = command("crossbert_jax.finetune", *args, "--batch_size=32", env=OFFLINE)
  assert proc.returncode == 2 and "holds trials made with batch_size=16" in proc.stderr, proc.stderr
  assert (out / "glue_finetuned.json").read_bytes() == table

"""The held-out peer of `finetune`: the same tiny Hugging Face ModernBERT classifier fine-tuned by transformers'
`Trainer` and by our command, from the same init, on the same batches, at the same hyperparameters.

The init: a random tiny `ModernBertForSequenceClassification` (tools/tiny_modernbert.py's shape and tokenizer,
torch seed = the trial's seed) saved as a folder that both sides load (`finetune --hf=FOLDER` takes its head and
classifier too). The batches: Trainer is given our trial's batches (finetuning/batches.py: the seeded order per
epoch, the last batch short) through its dataloader, so step i sees the same rows on both sides. Reports each
side's loss per step and dev score per seed, as a table and JSON:

  python tools/finetune_peer.py --data_dir=../shared/data --task=stsb --learning_rate=8e-5 --epochs=2 \
      --seeds=0,1,2 --out=runs/finetune_peer
"""

import argparse
import json
import pathlib
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from crossbert_jax.finetuning import batches as batches_lib  # noqa: E402
from crossbert_jax.finetuning import driver, recipe, sources  # noqa: E402
from crossbert_jax.finetuning import trial as trial_lib  # noqa: E402
from tools.tiny_modernbert import tiny_modernbert  # noqa: E402


def classifier_folder(folder: pathlib.Path, num_labels: int, seed: int, pooling: str = "mean") -> pathlib.Path:
  """A random tiny ModernBertForSequenceClassification (torch seed `seed`) with the tiny BPE tokenizer."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  tiny_modernbert(folder, with_head=False, seed=seed)
  config = transformers.AutoConfig.from_pretrained(str(folder))
  config.num_labels, config.classifier_pooling, config.architectures = num_labels, pooling, None
  torch.manual_seed(seed)
  model = transformers.ModernBertForSequenceClassification(config)
  model.save_pretrained(str(folder))
  return folder


def epoch_batches(num_rows: int, batch_size: int, seed: int, epochs: int, max_steps: int = 0) -> list[list[int]]:
  """The row indices of every step of our trial (finetuning/batches.train_batch's rows)."""
  per_epoch = batches_lib.steps_per_epoch(num_rows, batch_size)
  total = per_epoch * epochs if not max_steps else min(per_epoch * epochs, max_steps)
  out = []
  for step in range(total):
    epoch, i = divmod(step, per_epoch)
    out.append(batches_lib.epoch_order(num_rows, seed, epoch)[i * batch_size:(i + 1) * batch_size].tolist())
  return out


def trainer_run(folder: pathlib.Path, data: trial_lib.TaskData, steps: list[list[int]], learning_rate: float,
                weight_decay: float, seed: int, work: pathlib.Path) -> tuple[list[float], dict]:
  """(loss per step, {row: dev metrics}) of transformers' Trainer fed our batches, in float32 on CPU."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  model = transformers.ModernBertForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32)
  regression = model.config.num_labels == 1
  pad = data.train.pad_id

  def collate(rows):
    length = max(len(data.train.ids[i]) for i in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for j, i in enumerate(rows):
      s = data.train.ids[i]
      ids[j, :len(s)], mask[j, :len(s)] = torch.tensor(s), 1
    labels = torch.tensor(data.train.labels[rows], dtype=torch.float32 if regression else torch.long)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}

  class OurBatches(transformers.Trainer):
    def get_train_dataloader(self):
      return torch.utils.data.DataLoader(list(range(len(data.train))), batch_sampler=steps, collate_fn=collate)

  args = transformers.TrainingArguments(output_dir=str(work), per_device_train_batch_size=max(map(len, steps)),
                                        learning_rate=learning_rate, max_steps=len(steps), weight_decay=weight_decay,
                                        adam_beta1=recipe.BETAS[0], adam_beta2=recipe.BETAS[1], adam_epsilon=recipe.EPS,
                                        lr_scheduler_type="linear", warmup_steps=recipe.WARMUP_FRACTION,
                                        max_grad_norm=0.0, logging_steps=1, seed=seed, report_to=[], save_strategy="no",
                                        use_cpu=True, optim="adamw_torch", disable_tqdm=True)
  trainer = OurBatches(model=model, args=args, train_dataset=list(range(len(data.train))))
  trainer.train()
  losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
  dev = {}
  model.eval()
  for row, split in data.dev.items():
    logits = []
    with torch.no_grad():
      for start in range(0, len(split), 64):
        rows = list(range(start, min(start + 64, len(split))))
        b = {k: v for k, v in _pad(split, rows, pad).items()}
        logits.append(model(**b).logits.numpy())
    dev[row] = trial_lib.scores(data.name, np.concatenate(logits), split.labels)
  return losses, dev


def _pad(split: batches_lib.Encoded, rows: list[int], pad: int) -> dict:
  import torch  # pylint: disable=g-import-not-at-top

  length = max(len(split.ids[i]) for i in rows)
  ids = torch.full((len(rows), length), pad, dtype=torch.long)
  mask = torch.zeros((len(rows), length), dtype=torch.long)
  for j, i in enumerate(rows):
    ids[j, :len(split.ids[i])], mask[j, :len(split.ids[i])] = torch.tensor(split.ids[i]), 1
  return {"input_ids": ids, "attention_mask": mask}


def ours_run(folder: pathlib.Path, task, trial: recipe.Trial, out: pathlib.Path, batch_size: int, max_length: int,
             max_steps: int = 0) -> tuple[list[float], dict]:
  """(loss per step, {row: dev metrics}) of our finetune trial from the same folder."""
  src = sources.from_hf(str(folder))
  data = driver.encode(task, src.tokenizer, max_length)
  start = {k: src.params[k] for k in ("encoder", "head", "classifier")}
  info = trial_lib.trial_info(
      trial,
      src.spec,
      trial_lib.HeadSpec(trial_lib.num_labels(task.name), "mean"),
      start="hf",
      source=driver._source_info(src),  # pylint: disable=protected-access
      batch_size=batch_size,
      max_length=max_length,
      max_steps=max_steps)
  result = trial_lib.run(out, info, data, start, log=lambda _: None)
  rows = [json.loads(l) for l in (out / trial_lib.METRICS_FILE).read_text().splitlines()]
  return [r["loss"] for r in rows if "loss" in r], result["dev"]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data_dir", required=True)
  p.add_argument("--task", default="stsb")
  p.add_argument("--learning_rate", type=float, default=8e-5)
  p.add_argument("--epochs", type=int, default=1)
  p.add_argument("--weight_decay", type=float, default=1e-5)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--batch_size", type=int, default=recipe.BATCH_SIZE)
  p.add_argument("--max_length", type=int, default=128)
  p.add_argument("--out", required=True)
  a = p.parse_args()
  out = pathlib.Path(a.out)
  tasks, _, _ = driver.load_tasks([a.task], True, a.data_dir, print)
  report = {"settings": vars(a), "seeds": {}}
  for seed in [int(s) for s in a.seeds.split(",")]:
    folder = out / f"init-seed{seed}"
    if folder.exists():
      shutil.rmtree(folder)
    classifier_folder(folder, trial_lib.num_labels(a.task), seed)
    trial = recipe.Trial(a.task, a.learning_rate, a.epochs, a.weight_decay, seed)
    t0 = time.perf_counter()
    ours_loss, ours_dev = ours_run(folder, tasks[a.task], trial, out / f"ours-seed{seed}", a.batch_size, a.max_length)
    t1 = time.perf_counter()
    data = driver.encode(tasks[a.task], sources.from_hf(str(folder)).tokenizer, a.max_length)
    steps = epoch_batches(len(data.train), a.batch_size, seed, a.epochs)
    hf_loss, hf_dev = trainer_run(folder, data, steps, a.learning_rate, a.weight_decay, seed, out / f"hf-seed{seed}")
    t2 = time.perf_counter()
    report["seeds"][seed] = {
        "ours": {"loss": ours_loss, "dev": ours_dev, "seconds": t1 - t0},
        "trainer": {"loss": hf_loss, "dev": hf_dev, "seconds": t2 - t1}}
    first = " ".join(f"{o:.5f}/{h:.5f}" for o, h in zip(ours_loss[:5], hf_loss[:5]))
    print(f"seed {seed}: first losses ours/Trainer {first}; dev ours {ours_dev} Trainer {hf_dev}", flush=True)
  (out / "peer.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
  main()

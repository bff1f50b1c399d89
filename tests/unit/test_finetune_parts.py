"""finetune's parts that need no training: the head's layout and logits against transformers'
ModernBertForSequenceClassification, the bucketed batches, the schedule against transformers', the grid and
its refusals, and the table's choice of the best grid point with its seed spread."""

import numpy as np
import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import glue
from crossbert_jax.finetuning import batches, classifier, export, program, recipe, table
from crossbert_jax.model.encoder import EncoderSpec

SPEC = EncoderSpec(vocab_size=97, embed_dim=32, num_heads=4, num_layers=3, mlp_dim=48, global_every=2, local_window=8)


def _init(spec: EncoderSpec, head: classifier.HeadSpec, seed: int = 0):
  import flax.linen as nn
  import jax

  model = classifier.SequenceClassifier(spec, head)
  ones = np.ones((1, 8), np.int32)
  init = jax.jit(lambda k: nn.unbox(model.init(k, ones, np.zeros_like(ones), ones)["params"]))
  # XLA:CPU's backend optimisations take ~25 s on this init (2 busy cores); the values need none.
  compiled = init.lower(jax.random.key(seed)).compile(compiler_options={"xla_backend_optimization_level": 0})
  return jax.tree.map(np.asarray, compiled(jax.random.key(seed)))


def _random_params(head: classifier.HeadSpec, seed: int = 0):
  """Random params of the classifier's shapes (norm scales and biases away from 1 and 0, so a swapped or
  dropped tensor shows)."""
  import jax

  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: np.asarray(0.02 * rng.standard_normal(a.shape) + (a.ndim == 1), np.float32),
                      classifier.abstract_params(SPEC, head))


@pytest.mark.parametrize("pooling,num_labels", [("mean", 3), ("cls", 1)])
def test_logits_equal_transformers_sequence_classifier(pooling, num_labels):
  """Our tree, written as HF tensors, loads into ModernBertForSequenceClassification with no key missing or
  left over, and its logits equal ours (padded rows of different lengths; mean and CLS pooling)."""
  import torch
  import transformers

  from crossbert_jax.data.special_ids import SENTENCEPIECE

  head = classifier.HeadSpec(num_labels, pooling)
  params = _random_params(head)
  config = transformers.ModernBertConfig(
      **export.hf_config(SPEC, head, "mnli" if num_labels == 3 else "stsb", 64, SENTENCEPIECE))
  model = transformers.ModernBertForSequenceClassification(config).eval()
  tensors = export.tensors(params, SPEC)
  missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
  assert not missing and not unexpected, (missing, unexpected)
  rng = np.random.default_rng(1)
  lengths = [5, 19, 12, 30]
  batch = {k: np.zeros((4, 30), np.int32) for k in ("tokens", "segment_ids", "positions")}
  for i, n in enumerate(lengths):
    batch["tokens"][i, :n] = rng.integers(5, SPEC.vocab_size, n)
    batch["segment_ids"][i, :n] = 1
    batch["positions"][i, :n] = np.arange(n)
  ours = export.our_logits(SPEC, head, params, batch)
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(batch["tokens"].astype(np.int64)),
                   attention_mask=torch.from_numpy(batch["segment_ids"].astype(np.int64))).logits.numpy()
  assert ours.shape == (4, num_labels)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_init_follows_transformers_init_weights():
  """head.dense ~ N(0, init_std / sqrt(2 N)), classifier ~ N(0, D ** -0.5), its bias 0 (transformers' _init_weights)."""
  spec = EncoderSpec(vocab_size=97, embed_dim=256, num_heads=4, num_layers=2, mlp_dim=64)
  p = _init(spec, classifier.HeadSpec(64))
  dense, kernel = p["head"]["dense"]["kernel"], p["classifier"]["kernel"]
  # A normal truncated at 2 std has std 0.88 x its scale.
  assert abs(dense.std() / (0.02 / np.sqrt(4) * 0.88) - 1) < 0.05
  assert abs(kernel.std() / (256 ** -0.5 * 0.88) - 1) < 0.05
  assert not np.asarray(p["classifier"]["bias"]).any()
  assert set(p) == {"encoder", "head", "classifier"} and set(p["head"]) == {"dense", "norm"}


def _encoded(n: int = 150, seed: int = 0) -> batches.Encoded:
  rng = np.random.default_rng(seed)
  ids = [[2] + list(rng.integers(5, 50, int(k))) + [3] for k in rng.integers(1, 200, n)]
  return batches.Encoded(ids, rng.integers(0, 2, n), 0)


def test_batches_cover_each_epoch_once_in_a_few_lengths():
  data, lengths = _encoded(), batches.buckets(256)
  assert lengths == (32, 64, 128, 256) and batches.buckets(48) == (32, 48)
  per_epoch = batches.steps_per_epoch(len(data), 64)
  assert per_epoch == 3
  seen, shapes = [], set()
  for step in range(per_epoch):
    b = batches.train_batch(data, step, 64, seed=7, lengths=lengths)
    real = b["weights"] > 0
    shapes.add(b["tokens"].shape)
    assert b["tokens"].shape[0] == 64 and b["tokens"].shape[1] in lengths
    # Each real row is its ids, padded; filler rows are one real token of weight 0.
    assert (b["segment_ids"][~real].sum(1) == 1).all()
    seen += [tuple(r[s > 0]) for r, s in zip(b["tokens"][real], b["segment_ids"][real])]
  assert sorted(seen) == sorted(tuple(s) for s in data.ids)  # Every row once per epoch.
  assert shapes <= {(64, n) for n in lengths}
  # Batch i is a function of (seed, i): the same again, and the next epoch in another order.
  again = batches.train_batch(data, 1, 64, seed=7, lengths=lengths)
  np.testing.assert_array_equal(again["tokens"], batches.train_batch(data, 1, 64, 7, lengths)["tokens"])
  assert not np.array_equal(batches.epoch_order(150, 7, 0), batches.epoch_order(150, 7, 1))


def test_eval_batches_hold_every_row_once():
  data = _encoded(70)
  rows = np.concatenate([b["rows"] for b in batches.eval_batches(data, 32, batches.buckets(256))])
  assert sorted(rows) == list(range(70))


def test_schedule_is_transformers_linear_schedule_with_warmup():
  import torch
  import transformers

  total, peak = 37, 5e-5
  warmup = recipe.warmup_steps(total)
  assert warmup == 4  # ceil(3.7), as TrainingArguments.get_warmup_steps.
  opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
  sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
  theirs = []
  for _ in range(total):
    theirs.append(sched.get_last_lr()[0])
    opt.step()
    sched.step()
  ours = [float(program.linear_schedule(peak, total, warmup)(i)) for i in range(total)]
  np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-12)


def test_grid_and_trials():
  grid = recipe.parse_grid("1e-5,3e-5,5e-5,8e-5", "1,2,3", "1e-6,1e-5", "0,1,2")
  assert grid == recipe.Grid()
  trials = recipe.trials("rte", grid)
  assert len(trials) == 4 * 3 * 2 * 3 and len({t.name for t in trials}) == len(trials)
  argv = recipe.trial_argv(trials[5], ["--workdir=R", "--output_dir=O"])
  flags = dict(a[2:].split("=", 1) for a in argv[3:])
  narrowed = recipe.parse_grid(flags["learning_rates"], flags["epochs"], flags["weight_decays"], flags["seeds"])
  assert recipe.trials("rte", narrowed) == [trials[5]]


@pytest.mark.parametrize("flag,args", [("--learning_rates", ("", "1", "0", "0")), ("--epochs", ("1e-5", ",", "0", "0")),
                                       ("--seeds", ("1e-5", "1", "0", " ")), ("--epochs", ("1e-5", "0", "0", "0")),
                                       ("--learning_rates", ("x", "1", "0", "0"))])
def test_a_grid_with_no_or_bad_values_is_refused(flag, args):
  with pytest.raises(UserError, match=flag):
    recipe.parse_grid(*args)


def _result(task, lr, seed, score):
  dev = {row: {m: score for m in glue.TASKS[task].metrics} for row, _ in glue.TASKS[task].rows}
  return {"trial": {"task": task, "learning_rate": lr, "epochs": 1, "weight_decay": 0.0, "seed": seed}, "dev": dev}


def test_table_reports_the_best_point_with_its_seed_spread_and_the_frozen_score():
  # lr 3e-5 has the best mean (0.7) though lr 1e-5 has the best single seed (0.9).
  rte = [
      _result("rte", 1e-5, 0, 0.9),
      _result("rte", 1e-5, 1, 0.3),
      _result("rte", 3e-5, 0, 0.6),
      _result("rte", 3e-5, 1, 0.8)]
  mnli = [_result("mnli", 1e-5, 0, 0.8)]
  t = table.summary({"a": {"rte": rte, "mnli": mnli}}, {"a": {"rte": "mnli lr=1e-05", "mnli": "pretrained"}},
                    {"a": {"rte": 55.0, "mnli-m": 60.0, "mnli-mm": 61.0}}, {"qqp": "no data"}, {"seeds": 2})
  cell = t["rows"]["rte"]["scores"]["a"]
  assert cell["point"] == "lr=3e-05 epochs=1 wd=0" and cell["mean"] == 70.0 and cell["std"] == 10.0
  assert cell["frozen"] == 55.0 and cell["start"] == "mnli lr=1e-05"
  avg = t["average"]["a"]
  assert avg["glue"] is None and avg["rows_run"] == 3 and avg["mean_of_rows_run"] == pytest.approx(230 / 3, abs=1e-3)
  assert avg["frozen_of_rows_run"] == pytest.approx(176 / 3, abs=1e-3)
  md = table.markdown(t)
  assert "| RTE | acc | 70.0 ± 10.0 | 55.0 |" in md and "qqp (no data)" in md
  assert table.markdown(t) == md  # Deterministic.


def test_glue_average_needs_all_nine_rows():
  by_task = {name: [_result(name, 1e-5, 0, 0.5)] for name in glue.TASKS}
  t = table.summary({"a": by_task}, {"a": {n: "pretrained" for n in glue.TASKS}}, {}, {}, {"seeds": 1})
  assert t["average"]["a"]["glue"] == 50.0

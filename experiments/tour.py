r"""The README tour's sweep: the smallest ladder that shows the whole study on a CPU in minutes.

Two encoder sizes x two objectives (BERT at r = 0.15, CrossBERT with complementary masking), one
seed, each objective of a size at the same training FLOPs, frozen probes twice per run. It reads
WikiText-2 from ../shared/data (SOURCES.md) and trains its own 2,048-piece tokenizer first. Run from
the repo root:

  python -m crossbert_jax.sweep --spec=experiments/tour.py --root=runs/sweeps/tour
  python -m crossbert_jax.report --root=runs/sweeps/tour --output=runs/reports/tour

For the real CPU ladders see experiments/gutenberg_cpu.py (30 runs, about 2 h on 2 cores) and
experiments/gutenberg_wsd.py (docs/scaling_sweeps.md).
"""


def get_spec():
  return dict(
      name="tour",
      variant="tiny",  # The base config; the sizes and `common` override it.
      data_path="../shared/data/wikitext-2/*.txt",
      tokenizer_vocab_size=2048,
      common={
          "model.vocab_size": 2048,
          "data.seq_len": 64,
          "train.batch_size": 16,
          "checkpoint.every_steps": 1000,
          "metrics.log_every": 10,
          "metrics.tensorboard": False,},
      sizes={
          "xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=3e10),
          "s": dict(embed_dim=64, num_heads=4, num_layers=2, mlp_dim=128, flops=1.2e11),},
      objectives={
          "bert_r15": dict(objective="mlm", ratio=0.15, views=1),
          "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2),},
      seeds=[0],
      warmup_fraction=0.1,
      probes=dict(count=2, tasks="sst2,stsb", data_dir="../shared/data", max_examples=500),
  )

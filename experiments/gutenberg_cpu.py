r"""CPU reproduction of CrossBERT's scaling claims on the shared Gutenberg books.

Three encoder sizes x six objectives, one seed (three at the smallest size, to measure the seed
spread), every objective of a size at the same training FLOPs, frozen probes four times per run on
the shared GLUE/SentEval/STS tasks. Run from the repo
root (the paths below are relative to it); the sweep trains the tokenizer first (a 4,096-piece
SentencePiece model on the same books, ROOT/tokenizer/spm.model) if it is not there yet:

  python -m crossbert_jax.sweep --spec=experiments/gutenberg_cpu.py --root=runs/sweeps/gutenberg_cpu
  python -m crossbert_jax.report --root=runs/sweeps/gutenberg_cpu --output=docs/results/gutenberg_cpu

Budgets were sized from measured step times (docs/scaling_sweeps.md) to finish in about 90
minutes on 2 idle CPU cores, probes included (the xs seeds 1 and 2 add about 30 minutes).
"""

# The 379 shared books but one: "Henry David Thoreau___A Week on the Concord and Merrimack Rivers.txt"
# is not UTF-8 (the pipeline stops on it with an error), so these globs name the other 378.
_G = "../shared/data/gutenberg"
DATA = ",".join(f"{_G}/{g}.txt" for g in ("[!H]*", "H[!e]*", "He[!n]*", "Henry [!D]*", "Henry David Thoreau___[!A]*",
                                          "Henry David Thoreau___A [!W]*"))

# Every objective: BERT at two ratios, CrossBERT random masking (K = 1) at two ratios,
# complementary masking (K = 2), and a half-width reconstructor (does a light decoder cost
# representation quality?).
OBJECTIVES = {
    "bert_r15": dict(objective="mlm", ratio=0.15, views=1),
    "bert_r30": dict(objective="mlm", ratio=0.30, views=1),
    "cb_r50_k1": dict(objective="crossbert", ratio=0.5, views=1),
    "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2),
    "cb_r75_k1": dict(objective="crossbert", ratio=0.75, views=1),
    "cb_r50_k1_half": dict(objective="crossbert", ratio=0.5, views=1, reconstructor_width=0.5),}

# Encoder shapes (head dim 16 or 32, even for RoPE) and a FLOPs budget each. A data token costs
# about 1 : 2.6 : 5.6 training MFLOPs across the rungs (BERT r=0.15: 0.93, 2.46, 5.20); budgets
# grow 1 : 3.7 : 10.8 so that the larger models also see more tokens (1 : 1.4 : 2).
SIZES = {
    "xs": dict(embed_dim=64, num_heads=4, num_layers=2, mlp_dim=128, flops=1.2e12, seeds=[0, 1, 2]),
    "s": dict(embed_dim=96, num_heads=6, num_layers=3, mlp_dim=192, flops=4.4e12),
    "m": dict(embed_dim=128, num_heads=4, num_layers=4, mlp_dim=256, flops=1.3e13),}


def get_spec():
  return dict(
      name="gutenberg_cpu",
      variant="tiny",  # The base config; the sizes and `common` override it.
      data_path=DATA,
      tokenizer_vocab_size=4096,
      common={
          "model.vocab_size": 4096,
          "data.seq_len": 128,
          "train.batch_size": 32,
          "train.learning_rate": 2e-3,
          "checkpoint.every_steps": 200,  # Interrupted runs lose at most 200 steps.
          "metrics.log_every": 5,
          "metrics.tensorboard": False,},
      sizes=SIZES,
      objectives=OBJECTIVES,
      seeds=[0],
      warmup_fraction=0.06,
      probes=dict(count=4, tasks="sst2,mrpc,stsb,rte,cola", data_dir="../shared/data", max_examples=1000),
  )

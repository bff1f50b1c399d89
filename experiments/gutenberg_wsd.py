r"""CPU ladder with the power to tell CrossBERT from BERT: WSD decay branches, 3-7 seeds, whole probe sets.

Four objectives (BERT r=0.15 and r=0.30, CrossBERT r=0.5 with K=1 and K=2) x three sizes x three
seeds (seven at m: three, then five left most of its intervals undecided). Each (size, objective,
seed) trains ONE warmup-stable-decay trunk to its largest budget and forks a decay branch (the last
20% of the budget's steps, 1-sqrt shape) for each of its three budgets, so every size gives three
points per (objective, seed) for the cost of about one run
(see branch_contract: the stable runs keep a checkpoint at each budget's decay start and run no
probes; each branch is probed once, at its last step). Probes: whole shared sets (SST-2 fitted on
its 67k training sentences and scored on dev + test, SST-5 likewise, SNLI fitted on dev and scored
on test, QNLI by 5-fold cross-validation, STS-B probes and zero-shot cosine on dev + test), linear
and KNN. Run from the repo root; it resumes where it stopped (one heavy job at a time):

  python -m crossbert_jax.sweep --spec=experiments/gutenberg_wsd.py --root=runs/sweeps/gutenberg_wsd --dry_run
  python -m crossbert_jax.sweep --spec=experiments/gutenberg_wsd.py --root=runs/sweeps/gutenberg_wsd
  python -m crossbert_jax.report --root=runs/sweeps/gutenberg_wsd --output=docs/results/gutenberg_wsd

Cost on 2 idle cores, about 8 hours in all (+-30%; it runs over several 3-hour sessions):
- training, 3.9 h: from the idle `bench` step times at these shapes (docs/results/gutenberg_cpu/
  bench_{xs,s,m}.json; s/step at L=128, batch 32: m 0.32 BERT r=0.15, 0.38 r=0.30, 0.34 K=1,
  0.73 K=2), trunk (80% of the largest budget) plus the three decays (20% of each budget):
  xs 0.6 h, s 1.1 h, m 2.2 h. Independent runs per budget would cost 5.5 h.
- start-up, 0.8 h: 144 processes (36 trunks, 108 branches) of about 20 s (import, compile, restore,
  final checkpoint).
- probes, 3.2 h: 108 probe points. One point at m (d=128 x 4 layers, the five tasks, whole sets,
  121k embedded sequences) measured 268 s of CPU (919 s wall at load average 8-11 on the shared
  machine; embedding 73% of it, the sklearn fits the rest), one at xs 95 s of CPU (409 s wall at
  load 6-8, niced): about 2.7 min idle at m, 1.6 min at s (interpolated) and 1.1 min at xs.
The largest size's largest budget is 3.5e13 training FLOPs per run (1,643 BERT r=0.15 steps of
32 x 128 tokens, 2.7x the gutenberg_cpu m budget).
"""

# The 379 shared books but one (not UTF-8), as in experiments/gutenberg_cpu.py.
_G = "../shared/data/gutenberg"
DATA = ",".join(f"{_G}/{g}.txt" for g in ("[!H]*", "H[!e]*", "He[!n]*", "Henry [!D]*", "Henry David Thoreau___[!A]*",
                                          "Henry David Thoreau___A [!W]*"))

OBJECTIVES = {
    "bert_r15": dict(objective="mlm", ratio=0.15, views=1),
    "bert_r30": dict(objective="mlm", ratio=0.30, views=1),
    "cb_r50_k1": dict(objective="crossbert", ratio=0.5, views=1),
    "cb_r50_k2": dict(objective="crossbert", ratio=0.5, views=2),}

# Budgets (training FLOPs, ascending) grow about 3x per step within a size and with the size, so the
# larger models also see more tokens. The smallest K=2 branch still runs 89 steps.
SIZES = {
    "xs": dict(embed_dim=64, num_heads=4, num_layers=2, mlp_dim=128, flops=[1e12, 3e12, 6e12]),
    "s": dict(embed_dim=96, num_heads=6, num_layers=3, mlp_dim=192, flops=[2e12, 6e12, 1.5e13]),
    "m": dict(embed_dim=128, num_heads=4, num_layers=4, mlp_dim=256, flops=[5e12, 1.5e13, 3.5e13],
              seeds=[0, 1, 2, 3, 4, 5, 6]),  # 3, then 5 seeds left most of m's intervals undecided.
}


def get_spec():
  return dict(
      name="gutenberg_wsd",
      variant="tiny",
      data_path=DATA,
      tokenizer_vocab_size=4096,
      common={
          "model.vocab_size": 4096,
          "data.seq_len": 128,
          "train.batch_size": 32,
          "train.learning_rate": 2e-3,
          "checkpoint.every_steps": 200,  # Interrupted runs lose at most 200 steps.
          "metrics.log_every": 5,
          "metrics.tensorboard": False,
          "eval.splits": "all",  # Score every evaluation split (SST-2 dev + test, ...), size-weighted.
      },
      sizes=SIZES,
      objectives=OBJECTIVES,
      seeds=[0, 1, 2],
      warmup_fraction=0.06,  # Of the smallest budget's steps, the same absolute warmup for every branch.
      wsd=dict(decay_fraction=0.2, shape="1-sqrt"),
      probes=dict(count=1, tasks="sst2,sst5,snli,qnli,stsb", data_dir="../shared/data", max_examples=0),
  )

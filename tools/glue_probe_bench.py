r"""Times frozen GLUE's probes on a big train set: synthetic features of MNLI's shape, all probe seeds.

  python tools/glue_probe_bench.py --train=392702 --dim=512 --dev=9815,9832 --classes=3 --seeds=3

The features are random (a noisy linear labelling), so only the time means anything: the linear probe
(logistic regression, C chosen on the seed's 10% slice, refitted on all of train) and the KNN probe
(k chosen on at most glue_run.KNN_VAL_CAP rows of that slice; the dev splits' neighbours computed once).
"""

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from crossbert_jax.evaluation import glue_run  # noqa: E402  (after the path set-up)
from crossbert_jax.evaluation import probes  # noqa: E402
from crossbert_jax.evaluation import tasks as eval_tasks  # noqa: E402


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--train", type=int, default=392_702)
  p.add_argument("--dim", type=int, default=512)
  p.add_argument("--dev", default="9815,9832", help="Dev split sizes (MNLI: matched, mismatched).")
  p.add_argument("--classes", type=int, default=3)
  p.add_argument("--seeds", type=int, default=3)
  a = p.parse_args()
  rng = np.random.default_rng(0)
  w = rng.normal(size=(a.dim, a.classes)).astype(np.float32)
  sizes = {"train": a.train, **{f"dev{i}": int(n) for i, n in enumerate(a.dev.split(","))}}
  feats, splits = {}, {}
  for name, n in sizes.items():
    x = rng.normal(size=(n, a.dim)).astype(np.float32)
    y = (x @ w + 3 * rng.normal(size=(n, a.classes))).argmax(1)
    feats[name], splits[name] = x, eval_tasks.Split([""] * n, y)
  task = eval_tasks.Task("synthetic", eval_tasks.PAIR_CLASSIFICATION, ("accuracy",), splits, "train",
                         tuple(s for s in sizes if s != "train"))
  neighbours: dict = {}
  total = time.perf_counter()
  for seed in range(a.seeds):
    start = time.perf_counter()
    lin, _ = probes.score_task(task, feats, seed=seed, probes=("linear",))
    mid = time.perf_counter()
    knn, k = glue_run._big_knn(task, feats, seed, neighbours)  # pylint: disable=protected-access
    print(
        f"seed {seed}: linear {mid - start:.1f} s, knn {time.perf_counter() - mid:.1f} s (k={k}); "
        f"linear dev0 acc {lin['linear/dev0/accuracy']:.3f}, knn {knn['knn/dev0/accuracy']:.3f}", flush=True)
  print(f"{a.train:,} x {a.dim} train, dev {a.dev}, {a.seeds} seeds: {time.perf_counter() - total:.1f} s", flush=True)


if __name__ == "__main__":
  main()

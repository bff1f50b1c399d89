r"""Copies the small result files of a sweep's finished runs into a folder the report reads (and git keeps).

  python tools/archive_sweep.py --root=runs/sweeps/gutenberg_wsd --out=docs/results/gutenberg_wsd/sweep
  python -m crossbert_jax.report --root=docs/results/gutenberg_wsd/sweep --output=docs/results/gutenberg_wsd --force

A sweep root holds checkpoints (gigabytes) next to a few kilobytes of results per run; a later
machine may not have the root, so the results are committed as they land and no finished run is
trained twice. For every finished run (ROOT/runs/NAME/sweep_done.json) this copies config.json,
sweep_done.json, sweep_wall.json and the metrics rows, and ROOT/plan.json; WSD stable runs, which
no curve reads, keep only every `--stable_every`-th step's row and their last. Paths under the root
(the tokenizer, the runs' workdirs and fork sources) are written relative to it, so the archive
names no machine's folders. Unfinished runs are left out (the report lists them as missing).
Idempotent: rerun it whenever more runs finish.
"""

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULT_FILES = ("config.json", "sweep_done.json", "sweep_wall.json")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--root", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--stable_every", type=int, default=50)
  args = ap.parse_args()
  from crossbert_jax.run import metrics  # pylint: disable=g-import-not-at-top
  from crossbert_jax.scaling import plan as plan_lib  # pylint: disable=g-import-not-at-top

  root, out = pathlib.Path(args.root), pathlib.Path(args.out)
  if not (root / "plan.json").is_file():
    print(f"error: --root={root} holds no plan.json: give a sweep root", file=sys.stderr)
    return 2
  if out.resolve() == root.resolve():
    print(f"error: --out={out} is the sweep root: give another folder", file=sys.stderr)
    return 2
  out.mkdir(parents=True, exist_ok=True)
  prefix = f"{root.resolve()}/"

  def relative(src: pathlib.Path, dst: pathlib.Path) -> None:
    dst.write_text(src.read_text().replace(prefix, ""))

  relative(root / "plan.json", out / "plan.json")
  _, runs = plan_lib.load_plan(root)
  copied = 0
  for run in runs:
    src, dst = root / "runs" / run.name, out / "runs" / run.name
    if not plan_lib.is_done(src):
      continue
    rows = metrics.read_metrics(str(src))
    if run.kind == "stable":
      last = max(int(r["step"]) for r in rows)
      rows = [r for r in rows if int(r["step"]) % args.stable_every == 0 or int(r["step"]) == last]
    dst.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES:
      if (src / name).is_file():
        relative(src / name, dst / name)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (dst / "metrics.jsonl").write_text(text)
    copied += 1
  print(f"archived {copied} of {len(runs)} runs (the finished ones) from {root} to {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

r"""Copies the small result files of a sweep's finished runs into a folder the report reads (and git
keeps), and puts them back into a sweep root on another machine so no finished run is trained twice.

  python tools/archive_sweep.py --root=runs/sweeps/gutenberg_wsd --out=docs/results/gutenberg_wsd_sweep
  python -m crossbert_jax.report --root=docs/results/gutenberg_wsd_sweep --output=docs/results/gutenberg_wsd --force
  python tools/archive_sweep.py --restore --root=runs/sweeps/gutenberg_wsd --out=docs/results/gutenberg_wsd_sweep

A sweep root holds checkpoints (gigabytes) next to a few kilobytes of results per run; a later
machine may not have the root, so the results are committed as they land. For every finished run
(ROOT/runs/NAME/sweep_done.json) the archive gets config.json, sweep_done.json, sweep_wall.json and
the metrics rows; and ROOT/plan.json and the sweep's tokenizer (ROOT/tokenizer/spm.model, so the
runs still to train use the same pieces). WSD stable runs, which no curve reads, keep only every
`--stable_every`-th step's row and their last. Paths under the root (the tokenizer, the runs'
workdirs and fork sources) are written relative to it, so the archive names no machine's folders.
Unfinished runs are left out (the report lists them as missing). Idempotent: rerun it whenever
more runs finish.

`--restore` goes the other way, into a root that lacks them: the plan, the tokenizer, and every
archived finished run whose folder the root does not have. A WSD stable run comes back only when
all its decay branches are archived too: it has no checkpoints in the archive, so a branch still
to train needs it trained again (deterministically: the same trunk). A root holding another plan
or another tokenizer is refused, and nothing in the root is overwritten. Then rerun the same
sweep command: restored runs are "done, skipped".
"""

import argparse
import json
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crossbert_jax.core.errors import UserError  # noqa: E402  pylint: disable=g-import-not-at-top

RESULT_FILES = ("config.json", "sweep_done.json", "sweep_wall.json")
TOKENIZER = pathlib.Path("tokenizer") / "spm.model"  # As scaling.runner.tokenizer_path, under the root.


def _check_folder(path: pathlib.Path, flag: str) -> None:
  """A folder path that is not a file and has no file on its way up."""
  for p in (path, *path.parents):
    if p.exists():
      if not p.is_dir():
        raise UserError(f"{flag}={path}: {p} is a file, not a folder: give a folder path")
      return


def archive(root: pathlib.Path, out: pathlib.Path, stable_every: int) -> str:
  from crossbert_jax.run import metrics  # pylint: disable=g-import-not-at-top
  from crossbert_jax.scaling import plan as plan_lib  # pylint: disable=g-import-not-at-top

  if out.resolve() == root.resolve():
    raise UserError(f"--out={out} is the sweep root: give another folder")
  if stable_every < 1:
    raise UserError(f"--stable_every={stable_every}: keep every N-th stable-run row with N >= 1, e.g. 50")
  _check_folder(out, "--out")
  _, runs = plan_lib.load_plan(root)
  if (out / plan_lib.PLAN_FILE).exists():  # Checked before anything is written: an archive holds one plan.
    _, theirs = plan_lib.load_plan(out)
    if plan_lib.plan_hash(theirs) != plan_lib.plan_hash(runs):
      raise UserError(f"--out={out} archives another sweep's plan than --root={root}: archive into a new folder")
  out.mkdir(parents=True, exist_ok=True)
  prefix = f"{root.resolve()}/"

  def relative(src: pathlib.Path, dst: pathlib.Path) -> None:
    dst.write_text(src.read_text().replace(prefix, ""))

  relative(root / "plan.json", out / "plan.json")
  if (root / TOKENIZER).is_file():
    (out / TOKENIZER).parent.mkdir(exist_ok=True)
    shutil.copyfile(root / TOKENIZER, out / TOKENIZER)
  copied = 0
  for run in runs:
    src, dst = root / "runs" / run.name, out / "runs" / run.name
    if not plan_lib.is_done(src):
      continue
    rows = metrics.read_metrics(str(src))
    if run.kind == "stable":
      last = max(int(r["step"]) for r in rows)
      rows = [r for r in rows if int(r["step"]) % stable_every == 0 or int(r["step"]) == last]
    dst.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES:
      if (src / name).is_file():
        relative(src / name, dst / name)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (dst / "metrics.jsonl").write_text(text)
    copied += 1
  return f"archived {copied} of {len(runs)} runs (the finished ones) from {root} to {out}"


def restore(archive_dir: pathlib.Path, root: pathlib.Path) -> str:
  from crossbert_jax.scaling import plan as plan_lib  # pylint: disable=g-import-not-at-top

  if archive_dir.resolve() == root.resolve():
    raise UserError(f"--root={root} is the archive (--out): give the sweep root to restore into")
  _check_folder(root, "--root")
  if not (archive_dir / TOKENIZER).is_file():
    raise UserError(f"--out={archive_dir} holds no {TOKENIZER}: rerun the archive on the original root first "
                    "(runs trained with another tokenizer could not be compared)")
  spec, runs = plan_lib.load_plan(archive_dir)
  saved = json.loads((archive_dir / plan_lib.PLAN_FILE).read_text())
  root = root.absolute()  # As the sweep command resolves --root.
  if (root / plan_lib.PLAN_FILE).exists():
    _, theirs = plan_lib.load_plan(root)
    if plan_lib.plan_hash(theirs) != plan_lib.plan_hash(runs):
      raise UserError(f"--root={root} holds another sweep's plan than --out={archive_dir}: restore into a new root")
  if (root / TOKENIZER).exists() and (root / TOKENIZER).read_bytes() != (archive_dir / TOKENIZER).read_bytes():
    raise UserError(f"--root={root} holds another tokenizer than --out={archive_dir}; its runs cannot be mixed "
                    "with the archive's: restore into a new root")
  done = {r.name for r in runs if plan_lib.is_done(archive_dir / "runs" / r.name)}
  branches_of: dict[str, list[str]] = {}
  for r in runs:
    if r.kind == "branch":
      branches_of.setdefault(r.fork_from, []).append(r.name)
  restorable = [
      r for r in runs if r.name in done and (r.kind != "stable" or all(b in done for b in branches_of.get(r.name, [])))]
  retrain = sorted(r.name for r in runs if r.name in done and r not in restorable)
  (root / "runs").mkdir(parents=True, exist_ok=True)
  if not (root / plan_lib.PLAN_FILE).exists():
    for r in runs:  # The archive's tokenizer path is relative to its root: name this root's.
      r.overrides["data.tokenizer"] = str(root / TOKENIZER)
    plan_lib.save_plan(root, spec, runs, saved.get("spec_file", ""))
  if not (root / TOKENIZER).exists():
    (root / TOKENIZER).parent.mkdir(exist_ok=True)
    shutil.copyfile(archive_dir / TOKENIZER, root / TOKENIZER)
  restored = 0
  for r in restorable:
    src, dst = archive_dir / "runs" / r.name, root / "runs" / r.name
    if dst.exists():  # The root's own folder (finished or in progress) wins.
      continue
    tmp = dst.with_name(f".{r.name}.restoring")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    tmp.rename(dst)  # Whole or not at all: a run folder appears with its sweep_done.json.
    restored += 1
  note = (f"; {len(retrain)} finished stable run(s) left to train again, a branch of theirs is not archived: "
          f"{', '.join(retrain)}" if retrain else "")
  return (f"restored {restored} finished run(s) of {len(runs)} into {root} from {archive_dir}{note}; "
          "now rerun the sweep command")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--root", required=True, help="The sweep root (ROOT/plan.json, ROOT/runs/NAME).")
  ap.add_argument("--out", required=True, help="The archive folder.")
  ap.add_argument("--stable_every", type=int, default=50)
  ap.add_argument("--restore", action="store_true", help="Copy the archive's finished runs into --root.")
  args = ap.parse_args()
  root, out = pathlib.Path(args.root), pathlib.Path(args.out)
  source = out if args.restore else root
  if not (source / "plan.json").is_file():
    print(
        f"error: {'--out' if args.restore else '--root'}={source} holds no plan.json: give "
        f"{'an archive' if args.restore else 'a sweep root'}", file=sys.stderr)
    return 2
  try:
    print(restore(out, root) if args.restore else archive(root, out, args.stable_every))
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())

r"""Fault injection for `prepare`: N random `kill -9`s, each followed by a rerun of the same command.

  python tools/fault_inject_prepare.py --kills=20 --workdir=runs/fault_inject_prepare   (make fault-inject)

Writes a corpus of distinct documents, starts `prepare` (text or, with --tokenizer, pre-tokenized
shards), kills it with SIGKILL at a random moment (0-`max_delay` s after it started, often while
workers write), checks within a few seconds that no worker outlived it, and reruns; after
`--kills` kills a last run finishes. Passes (exit 0) when the folder holds every shard of the set
and nothing else, and the shards hold every document exactly once.
"""

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--kills", type=int, default=20)
  ap.add_argument("--workdir", default="runs/fault_inject_prepare")
  ap.add_argument("--documents", type=int, default=20000)
  ap.add_argument("--shards", type=int, default=16)
  ap.add_argument("--max_delay", type=float, default=8.0)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()
  from crossbert_jax.core import config as config_lib  # pylint: disable=g-import-not-at-top
  from crossbert_jax.data import pipeline, shards  # pylint: disable=g-import-not-at-top
  from crossbert_jax.data import workers as workers_lib  # pylint: disable=g-import-not-at-top

  rng = random.Random(args.seed)
  work = pathlib.Path(args.workdir)
  shutil.rmtree(work, ignore_errors=True)
  (work / "in").mkdir(parents=True)
  docs = [
      f"document {i} " + " ".join(rng.choice("abcdefgh") * rng.randint(1, 9)
                                  for _ in range(rng.randint(1, 80)))
      for i in range(args.documents)]
  for k in range(4):
    (work / "in" / f"part{k}.txt").write_text("\n\n".join(docs[k::4]) + "\n")
  out = work / "out"
  cmd = [
      sys.executable, "-m", "crossbert_jax.prepare", f"--input={work / 'in'}", f"--output={out}",
      f"--shards={args.shards}", "--workers=2", "--progress=false"]
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  for kill in range(args.kills):
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    delay = rng.uniform(0, args.max_delay)
    time.sleep(delay)
    workers = workers_lib.child_pids(proc.pid)
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30  # A worker still importing exits as it starts (data/workers.py).
    while any(workers_lib.alive(w) for w in workers) and time.time() < deadline:
      time.sleep(0.1)
    orphans = [w for w in workers if workers_lib.alive(w)]
    done = len(list(out.glob("corpus-*.arrayrecord"))) if out.exists() else 0
    print(f"kill {kill + 1}: after {delay:.1f} s, {done}/{args.shards} shards, orphans {orphans}", flush=True)
    if orphans:
      print(f"fault_inject_prepare: FAILED: workers {orphans} outlived prepare")
      return 1
    proc.stderr.close()
  for attempt in ("last", "repeated"):  # The run that finishes, then the same command on the finished set.
    final = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if final.returncode != 0:
      print(f"fault_inject_prepare: FAILED: the {attempt} run exited {final.returncode}: {final.stderr[-1000:]}")
      return 1
  names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))  # .prepare.json: the finished record.
  want = [shards.shard_name("corpus", k, args.shards) for k in range(args.shards)]
  c = config_lib.get_config("mlm", "tiny").data
  c.path = str(out)
  ds = pipeline.document_dataset(c, seed=0)
  got = sorted(ds[i] for i in range(len(ds)))
  if names != want or got != sorted(docs):
    print(f"fault_inject_prepare: FAILED: files {names[:5]}... ({len(names)}), {len(got)} documents of {len(docs)}, "
          f"{len(set(got))} distinct")
    return 1
  print(json.dumps({"kills": args.kills, "shards": args.shards, "documents": len(got)}))
  print(f"fault_inject_prepare: passed: {args.kills} kills, every shard once, every document once, no orphans")
  return 0


if __name__ == "__main__":
  sys.exit(main())

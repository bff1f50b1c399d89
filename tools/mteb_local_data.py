r"""Converts the MTEB tasks the shared data holds into mteb_eval's local layout (`DIR/<TaskName>/`).

  python tools/mteb_local_data.py --data_dir=../shared/data --out=data/mteb

STSBenchmark: sts/STSBenchmark/sts-test.csv -> STSBenchmark/test.tsv (sentence1, sentence2, score).
SciFact: the BEIR folder beir/scifact -> SciFact/ (corpus.jsonl, queries.jsonl, qrels/test.tsv).
Then `python -m crossbert_jax.mteb_eval ... --data_dir=data/mteb` runs both offline.
"""

import argparse
import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from crossbert_jax.evaluation import tasks as eval_tasks  # noqa: E402  (after the path set-up)


def _clean(text: str) -> str:
  """A field of a tab-separated file: no tab or newline inside."""
  return " ".join(text.replace("\t", " ").splitlines())


def sts_benchmark(data_dir: pathlib.Path, out: pathlib.Path) -> int:
  """STS Benchmark test as STSBenchmark/test.tsv; returns the number of pairs."""
  from etils import epath

  test = eval_tasks.read_sts_benchmark(epath.Path(str(data_dir)), "test")
  folder = out / "STSBenchmark"
  folder.mkdir(parents=True, exist_ok=True)
  lines = ["sentence1\tsentence2\tscore"]
  lines += [f"{_clean(a)}\t{_clean(b)}\t{float(s)!r}" for a, b, s in zip(test.texts, test.pairs, test.labels)]
  (folder / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  return len(test.texts)


def scifact(data_dir: pathlib.Path, out: pathlib.Path) -> int:
  """The BEIR SciFact folder (already mteb's retrieval layout) as SciFact/; returns the corpus size."""
  src, folder = data_dir / "beir" / "scifact", out / "SciFact"
  (folder / "qrels").mkdir(parents=True, exist_ok=True)
  for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
    shutil.copyfile(src / name, folder / name)
  return sum(1 for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines() if line.strip())


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_dir", required=True, help="The shared data root (holds SOURCES.md).")
  parser.add_argument("--out", required=True, help="The local MTEB folder to write (DIR/<TaskName>/).")
  args = parser.parse_args()
  data_dir, out = pathlib.Path(args.data_dir), pathlib.Path(args.out)
  if not (data_dir / "SOURCES.md").is_file():
    print(f"error: --data_dir={data_dir} is not the shared data root (no SOURCES.md there)", file=sys.stderr)
    return 2
  if out.exists() and not out.is_dir():
    print(f"error: --out={out} is a file: give a folder", file=sys.stderr)
    return 2
  print(f"STSBenchmark: {sts_benchmark(data_dir, out)} pairs -> {out / 'STSBenchmark'}")
  print(f"SciFact: {scifact(data_dir, out)} documents -> {out / 'SciFact'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

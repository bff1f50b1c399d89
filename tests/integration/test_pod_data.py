"""Pod data paths: names with commas, per-host reads, elastic iterator, `prepare` shards."""

import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import readers
from crossbert_jax.data import sources


def test_path_with_commas_is_taken_whole(tmp_path, shared_data):
  book = shared_data / "gutenberg" / "Benjamin Franklin___Autobiography of Benjamin Franklin, Version 1.txt"
  assert [str(p) for p in sources.resolve_paths(str(book))] == [str(book)]
  other = tmp_path / "a.txt"
  other.write_text("one\n")
  # Not a path as a whole: split on commas, and the error says so.
  with pytest.raises(UserError, match=r"split on commas because it is not itself an existing path"):
    sources.resolve_paths(f"{tmp_path}/missing, part.txt")
  assert [p.name for p in sources.resolve_paths(f"{other},{other}")] == ["a.txt"]


def test_local_file_with_commas(tmp_path):
  path = tmp_path / "Address, given November 19, 1863.txt"
  path.write_text("Four score and seven years ago.\n\nNow we are engaged.\n")
  assert readers.read_text(sources.resolve_paths(str(path))[0], "paragraph")[1] == "Now we are engaged."


# ----------------------------------------------------------------------------- per-host reads

import json  # noqa: E402

import ml_collections  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from etils import epath  # noqa: E402

from crossbert_jax.data import pipeline  # noqa: E402


def _cfg(path, text_unit="paragraph"):
  return ml_collections.ConfigDict({
      "path": str(path), "format": "auto", "text_field": "text", "text_unit": text_unit, "shuffle_seed": 0})


def _docs(n):
  # Varied lengths and blank-line runs, so split points land inside documents and separators.
  return [" ".join(f"w{i}x{j}" for j in range(1 + (i * 7) % 23)) for i in range(n)]


@pytest.fixture
def bytes_read(monkeypatch):
  """Bytes read through epath per file: every reader in sources/splits opens files this way."""
  counts: dict[str, int] = {}
  gpath = type(epath.Path("/"))
  real_open = gpath.open

  def counting_open(self, mode="r", *args, **kwargs):
    f = real_open(self, mode, *args, **kwargs)
    real_read, real_readline = f.read, getattr(f, "readline", None)

    def read(*a):
      out = real_read(*a)
      counts[str(self)] = counts.get(str(self), 0) + len(out)
      return out

    def readline(*a):
      out = real_readline(*a)
      counts[str(self)] = counts.get(str(self), 0) + len(out)
      return out

    f.read, f.readline = read, readline
    return f

  monkeypatch.setattr(gpath, "open", counting_open)
  return counts


def _write(tmp_path, kind, docs, files):
  for k in range(files):
    share = docs[k::files]
    if kind == "paragraph":
      text = "".join(d + ("\n\n" if i % 3 else "\n \n\n") for i, d in enumerate(share))
      (tmp_path / f"c{k}.txt").write_text(text)
    elif kind == "line":
      (tmp_path / f"c{k}.txt").write_text("\n".join(share) + "\n")
    elif kind == "jsonl":
      (tmp_path / f"c{k}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in share))
    else:
      pq.write_table(pa.table({"text": share}), tmp_path / f"c{k}.parquet", row_group_size=100, compression="none")


@pytest.mark.parametrize("kind,files", [("paragraph", 1), ("line", 1), ("jsonl", 2), ("parquet", 1), ("paragraph", 8)])
def test_each_host_reads_only_its_share(tmp_path, bytes_read, kind, files):
  docs = _docs(4000 if kind == "parquet" else 400)  # Parquet: large next to its 64 KiB footer read.
  _write(tmp_path, kind, docs, files)
  total = sum(p.stat().st_size for p in tmp_path.iterdir())
  cfg = _cfg(tmp_path, "line" if kind == "line" else "paragraph")
  hosts = 4
  seen = []
  for p in range(hosts):
    bytes_read.clear()
    share = pipeline.document_dataset(cfg, seed=0, process_index=p, process_count=hosts)
    seen += [share[i] for i in range(len(share))]
    read = sum(bytes_read.values())
    # Its quarter, plus the lookahead past its two bounds (at most two documents each), or for
    # Parquet the footer and schema. Before per-host reads every host read all `total` bytes.
    longest = max(len(json.dumps({"text": d})) for d in docs) + 4
    slack = (64 << 10) + 4096 if kind == "parquet" else 2 * 2 * longest
    assert read <= total / hosts + slack, f"{kind}: host {p} read {read} of {total} bytes"
    assert read > 0
  assert sorted(seen) == sorted(docs), f"{kind} x {files} files: every document once over the {hosts} hosts"


def test_one_process_reads_everything_in_order(tmp_path):
  docs = _docs(50)
  _write(tmp_path, "paragraph", docs, 1)
  assert list(sources.iter_documents(str(tmp_path))) == docs


# ----------------------------------------------------------------------------- prepare

import subprocess  # noqa: E402
import sys  # noqa: E402
import pathlib  # noqa: E402

from crossbert_jax.data import prepare  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_prepare_writes_shards_that_hold_every_document_once(tmp_path):
  docs = _docs(300)
  (tmp_path / "in").mkdir()
  _write(tmp_path / "in", "paragraph", docs[:200], 1)
  (tmp_path / "in" / "more, with commas.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[200:]))
  out = tmp_path / "corpus"
  counts = prepare.prepare(str(tmp_path / "in"), str(out), 3, workers=2, progress=False)
  names = sorted(p.name for p in out.iterdir())
  assert names == [prepare.MARKER] + [f"corpus-0000{k}-of-00003.arrayrecord" for k in range(3)], names
  assert prepare.finished(str(out)), "the finished record of the set"
  assert sum(counts) == 300 and min(counts) > 0, counts
  # The shards train as they are: read lazily, strided over processes.
  got = [
      d for k in range(2) for share in [pipeline.document_dataset(_cfg(out), seed=0, process_index=k, process_count=2)]
      for d in (share[i] for i in range(len(share)))]
  assert sorted(got) == sorted(docs)
  assert prepare.prepare(str(tmp_path / "in"), str(out), 3, progress=False) == counts  # Finished: writes nothing.
  with pytest.raises(UserError, match="holds a finished prepare of other inputs or flags"):
    prepare.prepare(str(tmp_path / "in"), str(out), 4, progress=False)


def test_prepare_cli(tmp_path):
  (tmp_path / "a.txt").write_text("one doc\n\ntwo doc\n\nthree doc\n")
  cmd = [
      sys.executable, "-m", "crossbert_jax.prepare", f"--input={tmp_path / 'a.txt'}", f"--output={tmp_path / 'out'}",
      "--shards=2"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "wrote 2 shards, 3 documents" in proc.stdout and "shard" in proc.stderr, (proc.stdout, proc.stderr[-500:])
  proc = subprocess.run(cmd[:-1] + ["--shards=5"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: "), proc.stderr[-2000:]

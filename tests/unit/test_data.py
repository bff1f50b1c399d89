"""Data pipeline: paths, readers, packing invariants, sharding, determinism and exact resume."""

import json

from array_record.python import array_record_module
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus
from crossbert_jax.data import packing
from crossbert_jax.data import pipeline
from crossbert_jax.data import sources
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.data.tokenizer import CLS_ID, PAD_ID, SEP_ID

_WORDS = ("the model reads a long document and every token counts toward the packed row while "
          "short lines fill the gaps left by others so padding stays rare").split()


def sentences(n: int, seed: int = 0) -> list[str]:
  """`n` distinct English-like lines of varied length (some longer than a short seq_len)."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    words = rng.choice(_WORDS, size=int(rng.integers(2, 40)))
    out.append(f"Line {i}: " + " ".join(words) + ".")
  return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok") / "tok.model"
  tokenizer_lib.train_tokenizer(sentences(2000) + [" ".join(_WORDS).upper()], 300, path, num_threads=1)
  return tokenizer_lib.Tokenizer.load(path)


def data_cfg(path, **overrides):
  c = config_lib.get_config("mlm", "tiny").data
  c.path = str(path)
  c.text_unit = "line"
  c.seq_len = 32
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture
def lines_file(tmp_path):
  path = tmp_path / "lines.txt"
  path.write_text("\n".join(sentences(400)) + "\n")
  return path


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def expected_chunks(docs, tok, seq_len):
  """Every segment the pipeline may emit: [CLS] ids [SEP] cut into chunks of <= seq_len."""
  chunks = set()
  for ids in tok.encode_batch(docs):
    if ids:
      full = [CLS_ID] + ids + [SEP_ID]
      chunks |= {tuple(full[i:i + seq_len]) for i in range(0, len(full), seq_len)}
  return chunks


# ----------------------------------------------------------------------------- packing


def test_packing_keeps_document_boundaries(lines_file, tok):
  cfg = data_cfg(lines_file)
  it = pipeline.make_iterator(cfg, tok, batch_size=4, seed=0)
  allowed = expected_chunks(lines_file.read_text().splitlines(), tok, cfg.seq_len)
  seen_long = False
  for batch in take(it, 30):
    assert set(batch) == {"tokens", "segment_ids", "positions"}
    for v in batch.values():
      assert v.shape == (4, cfg.seq_len) and v.dtype == np.int32
    for tokens, seg, pos in zip(batch["tokens"], batch["segment_ids"], batch["positions"]):
      n = int((seg > 0).sum())
      assert (seg[n:] == 0).all() and (tokens[n:] == PAD_ID).all() and (pos[n:] == 0).all()
      assert (tokens[:n] != PAD_ID).all()  # Pads only at the row end.
      assert seg[0] == 1 and (np.diff(seg[:n]) >= 0).all() and (np.diff(seg[:n]) <= 1).all()
      for s in range(1, seg.max() + 1):
        where = np.flatnonzero(seg == s)
        np.testing.assert_array_equal(pos[where], np.arange(len(where)))
        segment = tuple(tokens[where].tolist())
        assert segment in allowed, segment  # One whole document or one chunk of one.
        seen_long |= segment[0] != CLS_ID
  assert seen_long, "no document longer than seq_len was chunked; make the test lines longer"


@pytest.mark.integration  # Real data: two Gutenberg books.
def test_well_packed_on_gutenberg_paragraphs(shared_data, tok):
  books = sorted((shared_data / "gutenberg").glob("*.txt"))[:2]
  assert books, "no gutenberg books in the shared data"
  cfg = data_cfg(",".join(map(str, books)), text_unit="paragraph", seq_len=128)
  it = pipeline.make_iterator(cfg, tok, batch_size=8, seed=0)
  batches = take(it, 8)
  fill = np.mean([(b["segment_ids"] > 0).mean() for b in batches])
  assert fill > 0.9, f"only {fill:.1%} of tokens are real: packing leaves too much padding"
  assert max(b["segment_ids"].max() for b in batches) > 1  # Paragraphs share rows.


def test_empty_documents_are_dropped(tmp_path, tok):
  path = tmp_path / "t.txt"
  path.write_text("A short line of text.\n\u200b\nAnother line here.\n")
  # The zero-width space survives reading but tokenizes to nothing (nmt_nfkc drops it).
  assert tok.encode("\u200b") == []
  batch = next(pipeline.make_iterator(data_cfg(path), tok, batch_size=2, seed=0))
  for _tokens, seg in zip(batch["tokens"], batch["segment_ids"]):
    for s in range(1, seg.max() + 1):
      assert (seg == s).sum() > 2  # Never a bare [CLS] [SEP].


# ----------------------------------------------------------------------------- determinism


def test_same_seed_same_batches_other_seed_other_batches(lines_file, tok):
  cfg = data_cfg(lines_file)
  a = take(pipeline.make_iterator(cfg, tok, batch_size=4, seed=0), 3)
  assert_batches_equal(a, take(pipeline.make_iterator(cfg, tok, batch_size=4, seed=0), 3))
  b = take(pipeline.make_iterator(cfg, tok, batch_size=4, seed=1), 3)
  assert not all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(a, b))


@pytest.mark.parametrize("workers", [0, 1])
def test_resume_from_state_reproduces_batches(lines_file, tok, workers):
  cfg = data_cfg(lines_file, worker_count=workers)
  it = pipeline.make_iterator(cfg, tok, batch_size=4, seed=3)
  take(it, 3)
  state = it.get_state()
  json.dumps(state)  # Checkpointable as JSON (what grain's orbax handler writes).
  expected = take(it, 3)
  resumed = pipeline.make_iterator(cfg, tok, batch_size=4, seed=3)
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 3), expected)
  for i in (it, resumed):
    if hasattr(i, "close"):
      i.close()


def test_orbax_saves_and_restores_the_iterator(lines_file, tok, tmp_path):
  import grain  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  cfg = data_cfg(lines_file)
  it = pipeline.make_iterator(cfg, tok, batch_size=4, seed=0)
  take(it, 2)
  with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as mngr:
    mngr.save(2, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
  expected = take(it, 3)
  resumed = pipeline.make_iterator(cfg, tok, batch_size=4, seed=0)
  with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as mngr:
    mngr.restore(2, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(resumed)))
  assert_batches_equal(take(resumed, 3), expected)


def test_resume_mid_document_and_across_epochs(tmp_path, tok):
  path = tmp_path / "few.txt"
  path.write_text("\n".join(sentences(12, seed=5)) + "\n")  # Many epochs within a few batches.
  cfg = data_cfg(path, seq_len=8)  # Most lines span several chunks.
  it = pipeline.make_iterator(cfg, tok, batch_size=3, seed=0)
  for _ in range(12):
    state = it.get_state()
    expected = take(it, 2)
    resumed = pipeline.make_iterator(cfg, tok, batch_size=3, seed=0)
    resumed.set_state(state)
    assert_batches_equal(take(resumed, 2), expected)


@pytest.fixture(params=["small", "grain"])
def shuffle_impl(request, monkeypatch):
  """Both shuffles: a stored permutation (small datasets) and grain's index_shuffle."""
  if request.param == "grain":
    monkeypatch.setattr(pipeline, "SMALL_SHUFFLE_MAX", 0)
  return request.param


def test_epochs_are_reshuffled(tmp_path, shuffle_impl):
  path = tmp_path / "d.txt"
  path.write_text("\n".join(sentences(50)) + "\n")
  ds = pipeline.document_dataset(data_cfg(path), seed=0)
  n = len(ds)
  first, second = [ds[i] for i in range(n)], [ds[i + n] for i in range(n)]
  assert sorted(first) == sorted(second) == sorted(sentences(50))
  assert first != second


# ----------------------------------------------------------------------------- sharding


def test_process_shards_are_disjoint_and_cover_the_data(tmp_path, shuffle_impl):
  path = tmp_path / "d.txt"
  docs = sentences(101)
  path.write_text("\n".join(docs) + "\n")
  cfg = data_cfg(path)
  shards = [pipeline.document_dataset(cfg, seed=7, process_index=i, process_count=3) for i in range(3)]
  seen = [d for s in shards for d in (s[i] for i in range(len(s)))]
  assert len(seen) == len(set(seen)) == len(docs) and set(seen) == set(docs)
  with pytest.raises(UserError, match="process_index"):
    pipeline.document_dataset(cfg, seed=0, process_index=3, process_count=3)


def test_process_streams_differ(lines_file, tok):
  cfg = data_cfg(lines_file)
  a = next(pipeline.make_iterator(cfg, tok, batch_size=4, seed=0, process_index=0, process_count=2))
  b = next(pipeline.make_iterator(cfg, tok, batch_size=4, seed=0, process_index=1, process_count=2))
  assert not np.array_equal(a["tokens"], b["tokens"])


# ----------------------------------------------------------------------------- paths


def test_resolve_paths(tmp_path):
  (tmp_path / "d" / "sub").mkdir(parents=True)
  for name in ("d/b.txt", "d/a.txt", "d/sub/c.txt", "d/.hidden.txt", "e.jsonl", "f.txt"):
    (tmp_path / name).write_text("x\n")
  names = lambda paths: [str(p.relative_to(tmp_path)) for p in paths]
  assert names(sources.resolve_paths(str(tmp_path / "f.txt"))) == ["f.txt"]
  assert names(sources.resolve_paths(str(tmp_path / "d"))) == ["d/a.txt", "d/b.txt", "d/sub/c.txt"]
  assert names(sources.resolve_paths(str(tmp_path / "d" / "*.txt"))) == ["d/a.txt", "d/b.txt"]
  assert names(sources.resolve_paths(
      f"{tmp_path}/f.txt, {tmp_path}/*.jsonl,{tmp_path}/d/sub")) == ["f.txt", "e.jsonl", "d/sub/c.txt"]
  missing = str(tmp_path / "nope.txt")
  with pytest.raises(UserError, match=missing):
    sources.resolve_paths(f"{tmp_path}/f.txt,{missing}")
  with pytest.raises(UserError, match="matches no files"):
    sources.resolve_paths(str(tmp_path / "*.parquet"))


# ----------------------------------------------------------------------------- formats


def test_text_units(tmp_path):
  path = tmp_path / "t.txt"
  path.write_text("First para line one.\nline two.\n  \t\nSecond para.\n\n\nThird.\n")
  read = lambda unit: list(sources.document_source(data_cfg(path, text_unit=unit)))
  assert read("line") == ["First para line one.", "line two.", "Second para.", "Third."]
  assert read("paragraph") == ["First para line one.\nline two.", "Second para.", "Third."]
  assert read("file") == [path.read_text().strip()]


def test_jsonl_parquet_arrayrecord(tmp_path, tok):
  docs = sentences(20)
  (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs[:5])))
  pq.write_table(pa.table({"body": docs[5:10], "n": list(range(5))}), tmp_path / "b.parquet")
  writer = array_record_module.ArrayRecordWriter(str(tmp_path / "c.arrayrecord"), "group_size:1")
  for d in docs[10:15]:
    writer.write(json.dumps({"body": d}).encode())
  writer.close()
  writer = array_record_module.ArrayRecordWriter(str(tmp_path / "d.array_record"), "group_size:1")
  for d in docs[15:]:
    writer.write(d.encode())  # Raw UTF-8 records.
  writer.close()

  jsonl = sources.document_source(data_cfg(tmp_path / "a.jsonl"))
  assert list(jsonl) == docs[:5]
  parquet = sources.document_source(data_cfg(tmp_path / "b.parquet", text_field="body"))
  assert list(parquet) == docs[5:10]
  spec = f"{tmp_path}/c.arrayrecord,{tmp_path}/d.array_record"
  records = sources.document_source(data_cfg(spec, text_field="body"))
  assert [records[i] for i in range(len(records))] == docs[10:]
  # All formats in one pipeline (text_field differs, so jsonl gets its own run).
  batch = next(
      pipeline.make_iterator(data_cfg(f"{tmp_path}/b.parquet,{spec}", text_field="body"), tok, batch_size=2, seed=0))
  assert batch["tokens"].shape == (2, 32)
  with pytest.raises(UserError, match="text_field"):
    sources.document_source(data_cfg(tmp_path / "a.jsonl", text_field="body"))
  with pytest.raises(UserError, match="text_field"):
    sources.document_source(data_cfg(tmp_path / "b.parquet", text_field="text"))


def test_builtin_path_uses_the_corpus(monkeypatch):
  monkeypatch.setattr(corpus, "builtin_documents", lambda: ["One doc here.", "Two docs here."])
  assert list(sources.document_source(data_cfg("builtin"))) == ["One doc here.", "Two docs here."]


# ----------------------------------------------------------------------------- user errors


def test_user_errors_name_the_input(tmp_path, tok):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n  \n")
  with pytest.raises(UserError, match=f"{empty}.*no documents"):
    sources.document_source(data_cfg(empty))

  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes("Caf\u00e9 au lait.\n".encode("latin-1"))
  with pytest.raises(UserError, match=f"{latin1}.*offset 3.*UTF-8"):
    sources.document_source(data_cfg(latin1))

  missing = tmp_path / "missing"
  with pytest.raises(UserError, match=str(missing)):
    pipeline.make_iterator(data_cfg(missing), tok, batch_size=2, seed=0)

  bad = tmp_path / "bad.parquet"
  bad.write_bytes(b"definitely not parquet")
  with pytest.raises(UserError, match=f"{bad}.*Parquet"):
    sources.document_source(data_cfg(bad))

  odd = tmp_path / "x.csv"
  odd.write_text("a,b\n")
  with pytest.raises(UserError, match="data.format"):
    sources.document_source(data_cfg(odd))

  for err in (UserError,):
    try:
      sources.document_source(data_cfg(latin1))
    except err as e:
      assert "\n" not in str(e)  # One line.


@pytest.mark.parametrize("kind", ["text", "arrayrecord"])
def test_packer_fetch_reads_the_grain_datasets_documents(tmp_path, tok, shuffle_impl, kind):
  """The packer's batched fetch (vectorised order, one read, one encode) gives, for any stream
  indices over several epochs and processes, the documents the Grain dataset chain gives."""
  del shuffle_impl  # Both shuffles run.
  docs = sentences(37)
  if kind == "text":
    path = tmp_path / "d.txt"
    path.write_text("\n".join(docs) + "\n")
  else:
    path = tmp_path / "d.arrayrecord"
    writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for d in docs:
      writer.write(d.encode())
    writer.close()
  rng = np.random.default_rng(0)
  for p in range(3):
    layout = pipeline.Layout(data_cfg(path), tok, bins=4, seed=5, process_index=p, process_count=3)
    grain_docs = layout.documents()  # Shuffle, stride, repeat, tokenize: Grain's MapDatasets.
    indices = rng.permutation(4 * layout.epoch_length()).tolist()
    got = layout._fetch(indices)  # pylint: disable=protected-access
    want = packing.flatten([grain_docs[i] for i in indices])
    np.testing.assert_array_equal(got.lengths_D, want.lengths_D)
    np.testing.assert_array_equal(got.ids_N, want.ids_N)

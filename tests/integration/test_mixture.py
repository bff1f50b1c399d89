"""Weighted mixtures (data.mixture): realised proportions, exact resume, per-source tokens, refusals, a train."""

import dataclasses
import collections
import json
import math

import numpy as np
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import mixture, pipeline, prepare, tokenizer as tokenizer_lib
from crossbert_jax.run import elastic, metrics, resume
from tests.helpers import run_command

_WORDS = "the model reads every document of each source and counts the tokens it packs in rows".split()


def _lines(tag: str, n: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [f"{tag} {i}: " + " ".join(rng.choice(_WORDS, size=int(rng.integers(2, 14)))) for i in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Three sources (two text files, one JSONL with its own text field), their documents, a tokenizer."""
  root = tmp_path_factory.mktemp("mix")
  docs = {"alpha": _lines("alpha", 50, 1), "beta": _lines("beta", 30, 2), "gamma": _lines("gamma", 20, 3)}
  (root / "alpha.txt").write_text("\n".join(docs["alpha"]) + "\n")
  (root / "beta.txt").write_text("\n".join(docs["beta"]) + "\n")
  (root / "gamma.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs["gamma"]))
  tokenizer_lib.train_tokenizer([d for v in docs.values() for d in v] * 4, 300, root / "tok.model", num_threads=1)
  return root, docs, tokenizer_lib.Tokenizer.load(root / "tok.model")


def _cfg(root, weights=(5, 3, 2), **overrides):
  c = config_lib.get_config("mlm", "tiny")
  c.data.path, c.data.text_unit, c.data.seq_len = "", "line", 32
  c.data.mixture = tuple(src for src, w in zip((
      {"path": str(root / "alpha.txt"), "weight": weights[0]},
      {"path": str(root / "beta.txt"), "weight": weights[1], "name": "b"},
      {"path": str(root / "gamma.jsonl"), "weight": weights[2], "text_field": "body"}), weights) if w)
  for k, v in overrides.items():
    c.data[k] = v
  return plan_lib.build(c).data


def _mixed(cfg, tok, n, process_index=0, process_count=1):
  """The first n documents of the mixed stream, as token-id tuples."""
  layout = pipeline.Layout(cfg, tok, bins=64, seed=0, process_index=process_index, process_count=process_count)
  docs = layout.mixed_fetch()(list(range(n)))
  return [tuple(d.tolist()) for d in np.split(docs.ids_N, np.cumsum(docs.lengths_D)[:-1])]


def _source_of(docs, tok):
  return {tuple(ids): name for name, v in docs.items() for ids in tok.encode_batch(v)}


def test_realised_proportions_match_the_weights(corpus):
  root, docs, tok = corpus
  source_of = _source_of(docs, tok)
  weights = {"alpha": 0.5, "beta": 0.3, "gamma": 0.2}
  n = 3000
  mixed = _mixed(_cfg(root), tok, 2 * mixture.BLOCK)
  got = [source_of[d] for d in mixed]
  for name, p in weights.items():
    count = got[:n].count(name)
    sd = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) < 4 * sd, f"{name}: {count} of {n} documents, weight {p}"
    # At a block boundary each source has its share to within one document.
    assert abs(got.count(name) - len(got) * p) <= 1, name
    # Within a source, its documents come epoch by epoch: each one equally often (to within one).
    counts = collections.Counter(d for d, s in zip(mixed, got) if s == name).values()
    assert len(counts) == len(docs[name]) and max(counts) - min(counts) <= 1, name


def test_one_source_mixture_is_the_data_path_stream(corpus):
  root, _, tok = corpus
  one = _cfg(root, weights=(1, 0, 0))
  single = config_lib.get_config("mlm", "tiny").data
  single.path, single.text_unit, single.seq_len = str(root / "alpha.txt"), "line", 32
  a = pipeline.make_iterator(one, tok, batch_size=4, seed=3)
  b = pipeline.make_iterator(single, tok, batch_size=4, seed=3)
  for _ in range(20):
    x, y = next(a), next(b)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_resume_mid_stream_is_bitwise(corpus, tmp_path):
  import grain  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  root, _, tok = corpus
  cfg = _cfg(root, seq_len=16)  # Documents span several chunks: a state mid-document.
  it = pipeline.make_iterator(cfg, tok, batch_size=4, seed=1)
  for _ in range(21):
    next(it)
  with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as mngr:
    mngr.save(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
  expected = [(next(it), mixture.source_tokens(it)) for _ in range(40)]
  assert expected[-1][1] != expected[0][1], "the counts must move within 40 batches"
  resumed = pipeline.make_iterator(cfg, tok, batch_size=4, seed=1)
  with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as mngr:
    mngr.restore(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(resumed)))
  for (x, counts), y in zip(expected, ((next(resumed), mixture.source_tokens(resumed)) for _ in range(40))):
    for k in x:
      np.testing.assert_array_equal(x[k], y[0][k], err_msg=k)
    assert counts == y[1]


@pytest.mark.parametrize("seq_len", [256, 8])
def test_source_tokens_are_the_tokens_of_completed_rounds(corpus, seq_len):
  """At each round boundary the counts are the non-padding tokens handed out, by source (L=256: documents
  whole, classified by their tokens; L=8: cut into chunks, the total)."""
  root, docs, tok = corpus
  source_of = _source_of(docs, tok)
  whole = seq_len == 256
  assert max(map(len, source_of)) + 2 <= 256
  names = {"alpha": "alpha", "beta": "b", "gamma": "gamma"}
  it = pipeline.make_iterator(_cfg(root, seq_len=seq_len), tok, batch_size=1, seed=0)
  truth, boundaries = {"alpha": 0, "b": 0, "gamma": 0}, 0
  for _ in range(400):
    row = next(it)
    tokens, segs = row["tokens"][0], row["segment_ids"][0]
    for s in set(segs.tolist()) - {0}:
      seg = tokens[segs == s].tolist()
      truth[names[source_of[tuple(seg[1:-1])]] if whole else "alpha"] += len(seg)
    if it.get_state()["rows"]["next_row"] == 0:  # A round ended with this row.
      boundaries += 1
      counts = mixture.source_tokens(it)
      assert (counts if whole else sum(counts.values())) == (truth if whole else truth["alpha"])
  assert boundaries >= 4


def test_processes_read_disjoint_shares_of_each_source(corpus):
  root, docs, tok = corpus
  source_of = _source_of(docs, tok)
  shares = [_mixed(_cfg(root), tok, 600, process_index=p, process_count=2) for p in range(2)]
  for name in docs:
    a, b = ({d for d in share if source_of[d] == name} for share in shares)
    assert a and b and not a & b and len(a | b) == len(docs[name]), name


def test_pretokenized_source_needs_the_run_tokenizer(corpus, tmp_path):
  root, docs, tok = corpus
  prepare.prepare(str(root / "beta.txt"), str(tmp_path / "beta_tok"), 1, text_unit="line", workers=1, progress=False,
                  tokenizer=tok)
  c = config_lib.get_config("mlm", "tiny")
  c.data.path, c.data.text_unit, c.data.seq_len = "", "line", 32
  c.data.mixture = ({"path": str(root / "alpha.txt"), "weight": 1}, {"path": str(tmp_path / "beta_tok"), "weight": 1})
  got = [_source_of(docs, tok)[d] for d in _mixed(plan_lib.build(c).data, tok, mixture.BLOCK)
        ]  # Ids read from the shards.
  assert got.count("alpha") == got.count("beta") == mixture.BLOCK // 2
  other = tmp_path / "other.model"
  tokenizer_lib.train_tokenizer(docs["alpha"] * 4, 320, other, num_threads=1)
  with pytest.raises(UserError, match=r"data\.mixture\[1\] \(beta_tok\): data.path=.* was tokenized with"):
    pipeline.make_iterator(plan_lib.build(c).data, tokenizer_lib.Tokenizer.load(other), batch_size=4, seed=0)


@pytest.mark.parametrize("mix, key", [
    (({"path": "a.txt", "weight": 0},), r"data\.mixture\[0\]\.weight"),
    (({"path": "a.txt", "weight": -1.0},), r"data\.mixture\[0\]\.weight"),
    (({"path": "a.txt", "weight": float("nan")},), r"data\.mixture\[0\]\.weight"),
    (({"path": "a.txt", "weight": float("inf")},), r"data\.mixture\[0\]\.weight"),
    (({"path": "a.txt", "weight": "2"},), r"data\.mixture\[0\]\.weight"),
    (({"path": "a.txt"},), r"data\.mixture\[0\]\.weight"),
    (({"path": "a.txt", "weight": 1}, {"path": "", "weight": 1}), r"data\.mixture\[1\]\.path"),
    (({"path": "a.txt", "weight": 1, "shuffle": True},), r"data\.mixture\[0\]: unknown key 'shuffle'"),
    (({"path": "a.txt", "weight": 1, "format": "csv"},), r"data\.mixture\[0\]\.format"),
    (({"path": "a.txt", "weight": 1, "name": "a b"},), r"data\.mixture\[0\]\.name"),
    (({"path": "x/a.txt", "weight": 1}, {"path": "y/a.jsonl", "weight": 1}), r"data\.mixture\[1\]: name 'a'"),
    (("a.txt",), r"data\.mixture\[0\]: must be a dict"),
    (({"path": "a.txt", "weight": 1e308}, {"path": "b.txt", "weight": 1e308}), r"data\.mixture: the weights sum"),
    (tuple({"path": f"{i}.txt", "weight": 2e307} for i in range(10)), r"data\.mixture: the weights sum"),])
def test_config_refuses_a_bad_mixture(mix, key):
  c = config_lib.get_config("mlm", "tiny")
  c.data.path, c.data.mixture = "", mix
  with pytest.raises(UserError, match=f"^config {key}"):
    plan_lib.build(c)


def test_config_refuses_data_path_with_a_mixture_and_names_sources():
  c = config_lib.get_config("mlm", "tiny")
  c.data.mixture = ({"path": "gs://b/web/*.arrayrecord", "weight": 1}, {"path": "/d/books.v2.txt", "weight": 1})
  plan_lib.build(c)  # data.path at its default "builtin": the mixture alone is read.
  assert mixture.names(c.data) == ["web", "books"]
  c.data.path = "corpus.txt"
  with pytest.raises(UserError, match=r"^config data\.path: 'corpus.txt' and data\.mixture are both set"):
    plan_lib.build(c)


def test_a_missing_source_is_named(corpus):
  root, _, tok = corpus
  cfg = _cfg(root)
  cfg = dataclasses.replace(cfg, mixture=(*cfg.mixture[:1], {"path": str(root / "nope.txt"), "weight": 1}))
  # The line names the setting to fix: the source's path, not data.path.
  with pytest.raises(
      UserError,
      match=r"^data\.mixture\[1\] \(nope\): data path .*nope\.txt' does not exist: fix data\.mixture\[1\]\.path "):
    pipeline.make_iterator(cfg, tok, batch_size=4, seed=0)


def test_resume_refuses_another_mixture_and_another_process_count(corpus):
  root, _, _ = corpus
  c = config_lib.get_config("mlm", "tiny")
  c.data.path, c.data.mixture = "", _cfg(root).mixture
  saved = json.loads(json.dumps(c.to_dict()))
  tok_id = {"path": "t", "sha256": "0", "vocab_size": 1}
  assert resume.check("w", 5, saved, None, plan_lib.build(c), tok_id, 1) == ([], True)
  assert config_lib.from_dict(saved).data.mixture == c.data.mixture  # config.json reads back (a tuple).
  c.data.mixture = _cfg(root, weights=(5, 3, 1)).mixture
  with pytest.raises(UserError, match=r"made with data\.mixture=.*cannot change on resume"):
    resume.check("w", 5, saved, None, plan_lib.build(c), tok_id, 1)
  with pytest.raises(
      UserError, match=r"written by 2 process\(es\) .* data\.mixture stream cannot be re-sharded.*"
      r"resume on 2 process\(es\)"):
    elastic.reshard("w", 5, 2, saved, c, 1)


@pytest.mark.slow  # Three starts (about 60 s as subprocesses); make test keeps the in-process source-token cases.
def test_train_logs_tokens_per_source_over_the_run(tmp_path, spm_model, shared_data):
  """A short `train` on two real sources, in two phases (L=128 for step 1, then L=64: another stream),
  stopped after steps 1 and 2 and resumed: metrics.jsonl rows carry tokens_seen/<source>, counted over the run.

  The three starts are the train command in this process (`run_command`): each resume restores from the
  checkpoint on disk, so no process boundary is needed (and a process start per step cost more than the step)."""
  wiki = shared_data / "wikitext-2" / "valid.txt"
  book = shared_data / "gutenberg" / "Abraham Lincoln___Lincoln Letters.txt"
  mix = ({"path": str(wiki), "weight": 3, "name": "wiki"}, {"path": str(book), "weight": 1, "name": "lincoln"})
  # A batch of 64 rows is one packing round (64 bins): every step's tokens are counted by its row.
  args = [
      "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}", "--config.metrics.progress_bar=False",
      f"--config.data.tokenizer={spm_model}", "--config.train.steps=3", "--config.train.batch_size=64",
      "--config.checkpoint.every_steps=100", "--config.data.path=", "--config.data.seq_len=128",
      "--config.train.phases=({'steps': 1}, {'data.seq_len': 64})", f"--config.data.mixture={mix!r}"]
  for stop in (["--config.train.stop_at_step=1"], ["--config.train.stop_at_step=2"], []):
    # Stop 2 restores step 1 (phase 0's stream), then starts phase 1's; the last restores step 2: phase 0's counts
    # from the checkpoint's meta.
    run_command("crossbert_jax.train", *args, *stop, check=True)
  rows = metrics.read_metrics(str(tmp_path / "run"))
  assert [(r["step"], r["phase"]) for r in rows] == [(1, 0), (2, 1), (3, 1)]
  for a, b in zip(rows, rows[1:]):  # Phase 1's new stream adds to phase 0's counts: no reset.
    assert b["tokens_seen/wiki"] > a["tokens_seen/wiki"] and b["tokens_seen/lincoln"] > a["tokens_seen/lincoln"]
  previous = {"tokens_seen": 0, "tokens_seen/wiki": 0, "tokens_seen/lincoln": 0}
  for r in rows:  # Each step's non-padding tokens: most of, and at most, its B x L.
    step_tokens = r["tokens_seen"] - previous["tokens_seen"]
    counted = sum(r[f"tokens_seen/{n}"] - previous[f"tokens_seen/{n}"] for n in ("wiki", "lincoln"))
    assert 0.8 * step_tokens < counted <= step_tokens, (r["step"], counted, step_tokens)
    previous = r


def test_document_dataset_refuses_a_mixture(corpus):
  with pytest.raises(UserError, match=r"document_dataset reads one source \(data\.path\)"):
    pipeline.document_dataset(_cfg(corpus[0]), seed=0)


def test_one_source_without_its_trailing_comma_says_so():
  """--config.data.mixture="{'path': P, 'weight': 1}" reaches the config as the dict's keys."""
  c = config_lib.get_config("crossbert", "tiny").unlock()
  c.data.path, c.data.mixture = "", ("path", "weight")
  with pytest.raises(UserError, match=r"data.mixture\[0\]: .*got 'path'; one source needs a trailing comma"):
    plan_lib.build(c)

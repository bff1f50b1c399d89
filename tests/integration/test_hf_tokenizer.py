"""Hugging Face tokenizers as the run's tokenizer: roles, ids, pickling, refusals, shards, a from-scratch run."""

import json
import pickle
import re

import numpy as np
import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus, hf_tokenizer, shards, special_ids, tokenizer
from tests import hf_models
from tests.helpers import run_command


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
  return hf_models.write_tokenizer_folder(hf_models.bpe_tokenizer(), tmp_path_factory.mktemp("bpe"))


def test_modernbert_like_roles_ids_and_pickling(bpe_folder):
  """Roles from special_tokens_map.json at high ids; ids equal transformers' (minus [CLS]/[SEP])."""
  import transformers  # pylint: disable=g-import-not-at-top

  tok = tokenizer.Tokenizer.load(bpe_folder)
  s = tok.special_ids
  assert (s.unk, s.cls, s.sep, s.pad, s.mask) == (600, 601, 602, 603, 604), s
  assert s.reserved == (0, 1, *range(600, 620)) and tok.vocab_size == 620
  assert s.replacement_range(tok.vocab_size) == (2, 600)
  assert s.target_exclusions() == s.reserved, "a Hugging Face layout never targets any special id"
  assert special_ids.SENTENCEPIECE.target_exclusions() == (2, 3), "SentencePiece runs keep their targets"
  texts = corpus.builtin_documents()[5000:5200] + ["[MASK] and <|endoftext|> in raw text", "café 😀", ""]
  hf = transformers.AutoTokenizer.from_pretrained(str(bpe_folder))
  want = [ids[1:-1] for ids in hf(texts)["input_ids"]]
  assert tok.encode_batch(texts) == want
  assert tokenizer.Tokenizer.load(bpe_folder / "tokenizer.json").special_ids == s, "the file alone: usual names"
  back = pickle.loads(pickle.dumps(tok))
  assert back.encode_batch(texts[:5]) == want[:5] and back.special_ids == s


def test_missing_mask_role_is_refused_in_one_line(tmp_path, bpe_folder):
  data = json.loads((bpe_folder / "tokenizer.json").read_text())
  data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[MASK]"]
  (tmp_path / "tokenizer.json").write_text(json.dumps(data))
  with pytest.raises(UserError, match="has no mask token"):
    hf_tokenizer.HfTokenizer.load(tmp_path)
  proc = run_command("crossbert_jax.prepare", "--input=builtin", f"--output={tmp_path / 'out'}", "--shards=1",
                     f"--tokenizer={tmp_path / 'tokenizer.json'}")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and "no mask token" in lines[0], proc.stderr[-2000:]


def test_prepare_writes_hf_token_shards(tmp_path, bpe_folder):
  """prepare with a tokenizer folder: uint16 ids hashed by its tokenizer.json, packed rows equal to the
  text path's (the tokenizer's own [CLS]/[SEP]/[PAD] ids)."""
  from crossbert_jax.core import config as config_lib  # pylint: disable=g-import-not-at-top
  from crossbert_jax.data import pipeline, prepare  # pylint: disable=g-import-not-at-top

  (tmp_path / "in").mkdir()
  (tmp_path / "in" / "docs.txt").write_text("\n\n".join(" ".join(d.split()) for d in corpus.builtin_documents()[:400]))
  tok = tokenizer.Tokenizer.load(bpe_folder)
  prepare.prepare(str(tmp_path / "in"), str(tmp_path / "tok"), 2, progress=False, tokenizer=tok)
  manifest = shards.read_manifest(tmp_path / "tok")
  assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["vocab_size"] == 620
  assert manifest["tokenizer"]["sha256"] == shards.sha256((bpe_folder / "tokenizer.json").read_bytes())
  assert shards.token_dtype(70_000) == np.uint32 and shards.token_dtype(65_536) == np.uint16
  data = config_lib.get_config("mlm", "tiny").data
  data.seq_len = 64
  rows = []
  for path in (tmp_path / "in", tmp_path / "tok"):
    data.path = str(path)
    it = pipeline.make_iterator(data, tok, batch_size=4, seed=0)
    rows.append([next(it) for _ in range(10)])
  for a, b in zip(*rows):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  tokens, seg = np.stack([r["tokens"] for r in rows[0]]), np.stack([r["segment_ids"] for r in rows[0]])
  assert (tokens[seg == 0] == 603).all() and (tokens == 601).any() and (tokens == 602).any()
  assert not np.isin(tokens, [0, 1, 2, 3, 4])[seg > 0].all()


def test_wordpiece_tokenizer_trains_from_scratch(tmp_path):
  """A BERT-style WordPiece tokenizer.json ([PAD]..[MASK] at 0-4 by name) drives a tiny CrossBERT run."""
  wp = hf_models.wordpiece_tokenizer(tmp_path / "wp" / "tokenizer.json")
  tok = tokenizer.Tokenizer.load(wp)
  assert tok.special_ids == special_ids.SpecialIds.of(0, 1, 2, 3, 4)
  proc = run_command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}",
                     f"--config.data.tokenizer={wp}", "--config.model.vocab_size=768", "--config.train.steps=4",
                     "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False",
                     "--config.checkpoint.async_save=False")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "done: step 4" in proc.stdout, proc.stdout


def test_resume_identity_hashes_the_folders_tokenizer_json(bpe_folder, tmp_path):
  """A run started with a tokenizer folder records its tokenizer.json's hash and its special ids; another
  tokenizer differs; a checkpoint from before the special ids were recorded is compared by the file alone."""
  from crossbert_jax.run import resume  # pylint: disable=g-import-not-at-top

  ident = resume.tokenizer_identity(str(bpe_folder), tokenizer.Tokenizer.load(bpe_folder))
  assert ident["sha256"] == shards.sha256((bpe_folder / "tokenizer.json").read_bytes())
  assert ident["special_ids"] == {"pad": 603, "unk": 600, "cls": 601, "sep": 602, "mask": 604}
  alone = tokenizer.Tokenizer.load(bpe_folder / "tokenizer.json")
  assert resume.tokenizer_identity(str(bpe_folder / "tokenizer.json"), alone)["sha256"] == ident["sha256"]
  other = hf_models.wordpiece_tokenizer(tmp_path / "wp.json")
  assert "differs (sha256" in resume.tokenizer_change(
      ident, resume.tokenizer_identity(str(other), tokenizer.Tokenizer.load(other)), "data.tokenizer")
  older = {k: v for k, v in ident.items() if k != "special_ids"}
  assert resume.tokenizer_change(older, ident, "data.tokenizer") is None


def _one_error_line(proc, words: str) -> None:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr[-2000:]


def _train(tmp_path, tok, *overrides: str):
  """A tiny CrossBERT run with `tok` (2 steps), in this process (tests/helpers.py's run_command): its
  CompletedProcess."""
  args = [
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}",
      f"--config.data.tokenizer={tok}", "--config.train.steps=2", "--config.metrics.progress_bar=False",
      "--config.metrics.tensorboard=False", "--config.checkpoint.async_save=False", *overrides]
  return run_command(*args)


@pytest.fixture(scope="module")
def text_input(tmp_path_factory):
  """A folder of English text for prepare, with a zebra in it."""
  folder = tmp_path_factory.mktemp("text")
  (folder / "docs.txt").write_text("\n\n".join([*corpus.builtin_documents()[:200], "The zebra saw a zebra."]))
  return folder


def test_tokenizer_that_cannot_encode_is_refused_before_any_work(tmp_path, text_input):
  """A WordLevel tokenizer without [UNK] fails on every unknown word: refused when loaded, so prepare and train
  say so in one line and leave nothing behind."""
  bad = hf_models.wordlevel_tokenizer(tmp_path / "nounk" / "tokenizer.json", ["the", "a"], unk=False)
  with pytest.raises(UserError, match="cannot encode arbitrary text"):
    tokenizer.Tokenizer.load(bad)
  out = tmp_path / "shards"
  _one_error_line(
      run_command("crossbert_jax.prepare", f"--input={text_input}", f"--output={out}", "--shards=1", "--progress=false",
                  f"--tokenizer={bad}"), "cannot encode")
  _one_error_line(_train(tmp_path, bad), "cannot encode")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["nounk"]


def test_prepare_failing_to_encode_leaves_nothing_in_the_way(tmp_path, text_input, bpe_folder):
  """A tokenizer that passes the load check but fails on a document: one line, and the folder is gone, so the
  command with a working tokenizer then runs (no stopped prepare of other flags left to finish). In process
  (run_command)."""
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top

  probe = [w for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(hf_tokenizer._PROBE)]  # pylint: disable=protected-access
  bad = hf_models.wordlevel_tokenizer(tmp_path / "probe_only.json", probe, unk=False)
  tokenizer.Tokenizer.load(bad)
  out = tmp_path / "shards"
  args = ["crossbert_jax.prepare", f"--input={text_input}", f"--output={out}", "--shards=1", "--progress=false"]
  _one_error_line(run_command(*args, f"--tokenizer={bad}"), "could not encode a document of shard 0")
  assert not out.exists()
  assert "wrote 1 shards" in run_command(*args, f"--tokenizer={bpe_folder}", check=True).stdout


def test_ids_past_the_token_count_set_the_vocab_size(tmp_path, text_input):
  """A vocabulary with a gap (8 tokens, one at id 70,000): the vocab size is 70,001, so prepare writes uint32
  ids and a model of 2,048 rows is refused before step 1 (not a uint16 overflow, not a NaN loss)."""
  big = hf_models.wordlevel_tokenizer(tmp_path / "gap" / "tokenizer.json", ["the", "a"], ids={"zebra": 70_000})
  tok = tokenizer.Tokenizer.load(big)
  assert tok.vocab_size == 70_001 and tok.encode("a zebra") == [6, 70_000]
  run_command("crossbert_jax.prepare", f"--input={text_input}", f"--output={tmp_path / 'shards'}", "--shards=1",
              "--progress=false", f"--tokenizer={big}", check=True)
  assert shards.read_manifest(tmp_path / "shards")["dtype"] == "uint32"
  _one_error_line(_train(tmp_path, big, "--config.model.vocab_size=2048"), "model.vocab_size=2048 is smaller")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("roles, words", [
    ({"mask_token": "[PAD]"}, "pad and mask tokens are both '[PAD]'"),
    ({"mask_token": "[CLS]"}, "cls and mask tokens are both '[CLS]'"),
    ({"cls_token": "[SEP]"}, "cls and sep tokens are both '[SEP]'"),
    ({"mask_token": "[MSK]"}, "mask_token '[MSK]' (special_tokens_map.json / tokenizer_config.json) is not in its"),])
def test_roles_on_one_id_or_missing_are_refused(tmp_path, bpe_folder, roles, words):
  """Two roles on one token, or a named token the vocabulary lacks (no silent fall-back to the usual name)."""
  folder = hf_models.write_tokenizer_folder(hf_models.bpe_tokenizer(), tmp_path, {**hf_models.ROLE_TOKENS, **roles})
  with pytest.raises(UserError, match=re.escape(words)):
    tokenizer.Tokenizer.load(folder)


def test_resume_refuses_the_same_tokenizer_json_with_other_special_ids(tmp_path, bpe_folder):
  """special_tokens_map.json swapped [CLS] and [SEP] after the first start: the resume is refused in one line."""
  folder = tmp_path / "tok"
  folder.mkdir()
  for name in ("tokenizer.json", "special_tokens_map.json"):
    (folder / name).write_bytes((bpe_folder / name).read_bytes())
  first = _train(tmp_path, folder)
  assert first.returncode == 0 and "done: step 2" in first.stdout, first.stderr[-2000:]
  (folder / "special_tokens_map.json"
  ).write_text(json.dumps({**hf_models.ROLE_TOKENS, "cls_token": "[SEP]", "sep_token": "[CLS]"}))
  _one_error_line(_train(tmp_path, folder, "--config.train.steps=4"),
                  "other special ids (cls 601 -> 602, sep 602 -> 601")

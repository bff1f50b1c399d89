"""Tokenizer: fixed special ids in the proto, English round trip, CLI, foreign models refused."""

import io
import pathlib
import subprocess
import sys

from absl import flags

import pytest
import sentencepiece as spm

from crossbert_jax import tokenizer as tokenizer_cli
from crossbert_jax.core.errors import UserError
from crossbert_jax.core.errors import exit_on_user_error
from crossbert_jax.data import corpus
from crossbert_jax.data import tokenizer as tokenizer_lib

REPO = pathlib.Path(__file__).resolve().parents[2]

# A few stdlib files' docstrings: real English, harvested in well under a second.
_STDLIB_FILES = ("argparse.py", "os.py", "subprocess.py", "threading.py", "pathlib.py", "logging/__init__.py",
                 "collections/__init__.py", "json/__init__.py")


def english_documents() -> list[str]:
  """Prose from a handful of stdlib docstrings (small, deterministic)."""
  import sysconfig  # pylint: disable=g-import-not-at-top

  root = sysconfig.get_paths()["stdlib"]
  return ["\n".join(paras) for f in _STDLIB_FILES for paras in corpus._file_paragraphs(f"{root}/{f}")]  # pylint: disable=protected-access


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
  out = tmp_path_factory.mktemp("tok") / "tok.model"
  return tokenizer_lib.train_tokenizer(english_documents(), 400, out, num_threads=1)


def test_special_ids_are_fixed_and_recorded_in_the_proto(model_path):
  tok = tokenizer_lib.Tokenizer.load(model_path)
  assert tok.vocab_size <= 400
  # A plain SentencePieceProcessor (no help from our class) sees the same ids.
  sp = spm.SentencePieceProcessor(model_proto=tok.serialized_proto)
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
  assert [sp.id_to_piece(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert sp.piece_to_id("[MASK]") == tokenizer_lib.MASK_ID
  ids = tok.encode("The parser reads the [MASK] arguments.")
  assert tokenizer_lib.MASK_ID in ids  # A user-defined symbol is matched as one piece.
  assert not {tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID, tokenizer_lib.PAD_ID} & set(ids)


def test_round_trip_on_english(model_path):
  tok = tokenizer_lib.Tokenizer.load(model_path)
  texts = ["Return the path of the current working directory.", "Unicode works too: naïve café, 42 options — done!"]
  for text, ids in zip(texts, tok.encode_batch(texts)):
    assert ids == tok.encode(text)
    assert tok.decode(ids) == text
    assert all(tokenizer_lib.NUM_SPECIAL <= i < tok.vocab_size for i in ids)


def test_training_is_deterministic(model_path, tmp_path):
  again = tokenizer_lib.train_tokenizer(english_documents(), 400, tmp_path / "again.model", num_threads=1)
  assert again.read_bytes() == model_path.read_bytes()


def test_pickles_through_its_proto(model_path):
  import pickle  # pylint: disable=g-import-not-at-top

  tok = tokenizer_lib.Tokenizer.load(model_path)
  clone = pickle.loads(pickle.dumps(tok))
  assert clone.encode("Open a file.") == tok.encode("Open a file.")


@pytest.mark.integration  # The tokenizer command's subprocess smoke test (its real argv, exit status and stderr).
def test_cli_end_to_end(tmp_path):
  (tmp_path / "a.txt").write_text("\n\n".join(english_documents()[:150]))
  (tmp_path / "b.jsonl").write_text('{"text": "A second file in another format."}\n')
  out = tmp_path / "out" / "cli.model"
  result = subprocess.run([
      sys.executable, "-m", "crossbert_jax.tokenizer", f"--input={tmp_path}/a.txt,{tmp_path}/b.jsonl",
      "--vocab_size=320", f"--output={out}", "--model_type=bpe", "--text_unit=paragraph", "--max_documents=100"],
                          capture_output=True, text=True, cwd=REPO, check=False)
  assert result.returncode == 0, result.stderr
  assert str(out) in result.stdout and "vocab_size=" in result.stdout
  assert "warning" not in result.stderr, result.stderr  # 320 pieces, as asked.
  small = subprocess.run([
      sys.executable, "-m", "crossbert_jax.tokenizer", f"--input={tmp_path}/b.jsonl", "--vocab_size=2000",
      f"--output={tmp_path / 'small.model'}"], capture_output=True, text=True, cwd=REPO, check=False)
  assert small.returncode == 0 and "fewer than --vocab_size=2,000 asked" in small.stderr, small.stderr
  tok = tokenizer_lib.Tokenizer.load(out)
  assert tok.decode(tok.encode("Read the file.")) == "Read the file."


def test_cli_reports_user_errors_in_one_line(tmp_path, capsys):
  tokenizer_cli._define_flags()  # pylint: disable=protected-access
  fv = flags.FLAGS
  wrapped = exit_on_user_error(tokenizer_cli.main)
  fv(["tokenizer", f"--input={tmp_path}/missing.txt", "--vocab_size=300", f"--output={tmp_path}/x.model"])
  try:
    with pytest.raises(SystemExit) as e:
      wrapped(["tokenizer"])
  finally:
    fv.unparse_flags()
    fv.mark_as_parsed()
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "missing.txt" in err and "Traceback" not in err


def test_foreign_model_is_refused(tmp_path):
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(english_documents()), model_writer=buf, vocab_size=300,
                                 minloglevel=2, num_threads=1)
  path = tmp_path / "foreign.model"
  path.write_bytes(buf.getvalue())  # Default ids: unk=0, bos=1, eos=2, no pad, no [MASK].
  with pytest.raises(UserError, match="python -m crossbert_jax.tokenizer"):
    tokenizer_lib.Tokenizer.load(path)


def test_missing_or_bad_files(tmp_path):
  with pytest.raises(UserError, match="nope.model"):
    tokenizer_lib.Tokenizer.load(tmp_path / "nope.model")
  (tmp_path / "junk.model").write_bytes(b"not a proto")
  with pytest.raises(UserError, match="junk.model"):
    tokenizer_lib.Tokenizer.load(tmp_path / "junk.model")
  with pytest.raises(UserError, match="vocab_size"):
    tokenizer_lib.train_tokenizer(["Some text here."], 100, tmp_path / "small.model")


def test_cli_checks_its_output_before_training(tmp_path, command):
  """An existing --output is kept (replaced only with --force), a non-.model name or a folder is refused: one
  line each, before any training."""
  old = tmp_path / "old.model"
  old.write_bytes(b"the user's model")
  (tmp_path / "dir").mkdir()
  base = ["crossbert_jax.tokenizer", "--input=builtin", "--vocab_size=400", "--max_documents=300"]
  refusals = {
      str(old): "exists",
      str(tmp_path / "x.json"): "does not end in .model",
      str(tmp_path / "dir"): "is a folder"}
  for output, words in refusals.items():
    proc = command(*base, f"--output={output}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr[-2000:]
  assert old.read_bytes() == b"the user's model" and sorted(p.name for p in tmp_path.iterdir()) == ["dir", "old.model"]
  assert not any((tmp_path / "dir").iterdir())
  proc = command(*base, f"--output={old}", "--force")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert tokenizer_lib.Tokenizer.load(old).vocab_size == 400


def test_a_missing_tokenizer_is_named_as_missing(tmp_path):
  """A missing tokenizer.json path does not exist (not "holds no tokenizer.json"); a run's tokenizer that moved
  away names export's (evaluate's, pooler's) --tokenizer flag."""
  with pytest.raises(UserError, match=r"x\.json'? does not exist"):
    tokenizer_lib.Tokenizer.load(tmp_path / "x.json")
  (tmp_path / "folder").mkdir()
  with pytest.raises(UserError, match="holds no tokenizer.json"):
    tokenizer_lib.Tokenizer.load(tmp_path / "folder")
  for moved in (str(tmp_path / "gone" / "spm.model"), "runs/gone/spm.model"):
    with pytest.raises(UserError, match=r"is not found .*: pass --tokenizer=PATH"):
      tokenizer_lib.resolve_for_run(moved, str(tmp_path / "run"))

"""SentencePiece tokenizer with fixed special ids: train it and load it (or a Hugging Face one).

The special ids are recorded in the model proto itself (pad/unk/bos/eos ids plus "[MASK]" as
the first user-defined symbol), so any model this module trains loads with exactly these ids
(`special_ids.SENTENCEPIECE`). `Tokenizer.load` also opens a Hugging Face tokenizer.json (or a
folder holding one) as an `HfTokenizer`. The CLI is `crossbert_jax.tokenizer`.
"""

from collections.abc import Iterable, Iterator, Sequence
import io
import os
import re

from etils import epath
import sentencepiece as spm

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import hf_tokenizer
from crossbert_jax.data.special_ids import SENTENCEPIECE, SpecialIds

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
NUM_SPECIAL = 5
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_PIECES = (PAD, UNK, CLS, SEP, MASK)

# Training sentences longer than this (in characters) are split at spaces.
MAX_SENTENCE_CHARS = 2048
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def _training_sentences(documents: Iterable[str], max_sentences: int) -> Iterator[str]:
  """Lines of each document, long lines split at sentence ends, then at spaces."""
  count = 0
  for doc in documents:
    for line in doc.splitlines():
      line = line.strip()
      if not line:
        continue
      pieces = [line] if len(line) <= MAX_SENTENCE_CHARS else _SENTENCE_END.split(line)
      for piece in pieces:
        while piece:
          if len(piece) <= MAX_SENTENCE_CHARS:
            head, piece = piece, ""
          else:
            cut = piece.rfind(" ", 0, MAX_SENTENCE_CHARS)
            cut = cut if cut > 0 else MAX_SENTENCE_CHARS
            head, piece = piece[:cut], piece[cut:].lstrip()
          yield head
          count += 1
          if count >= max_sentences:
            return


def train_tokenizer(documents: Iterable[str], vocab_size: int, output: str | os.PathLike, *,
                    model_type: str = "unigram", max_sentences: int = 2_000_000,
                    num_threads: int | None = None) -> epath.Path:
  """Trains a SentencePiece model with our special ids on `documents`; writes it to `output`."""
  if model_type not in ("unigram", "bpe"):
    raise UserError(f"--model_type={model_type!r}: use 'unigram' or 'bpe'")
  # byte_fallback reserves 256 byte pieces; the rest of the vocabulary needs room too.
  min_vocab = NUM_SPECIAL + 256 + 16
  if vocab_size < min_vocab:
    raise UserError(f"--vocab_size={vocab_size} is too small: use at least {min_vocab} "
                    "(5 special + 256 byte-fallback pieces + a few words)")
  sentences = _training_sentences(documents, max_sentences)
  first = next(sentences, None)
  if first is None:
    raise UserError("tokenizer input holds no text: point --input at non-empty text files")

  def all_sentences():
    yield first
    yield from sentences

  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=all_sentences(),
        model_writer=model,
        model_type=model_type,
        vocab_size=vocab_size,
        # Our ids, recorded in the proto: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3, "[MASK]" -> 4.
        pad_id=PAD_ID,
        pad_piece=PAD,
        unk_id=UNK_ID,
        unk_piece=UNK,
        bos_id=CLS_ID,
        bos_piece=CLS,
        eos_id=SEP_ID,
        eos_piece=SEP,
        user_defined_symbols=[MASK],
        normalization_rule_name="nmt_nfkc",
        byte_fallback=True,
        character_coverage=0.9995,
        # Determinism: the iterator is already capped and ordered; no sampling, no shuffling.
        input_sentence_size=0,
        shuffle_input_sentence=False,
        max_sentence_length=4 * MAX_SENTENCE_CHARS,  # Bytes, and a line is at most that.
        hard_vocab_limit=False,  # A small corpus yields a smaller vocabulary, not an error.
        num_threads=num_threads or min(os.cpu_count() or 1, 16),
        minloglevel=2,
    )
  except RuntimeError as e:
    raise UserError(f"SentencePiece training failed ({str(e).strip().splitlines()[-1]}): "
                    "check --vocab_size and --input") from None
  output = epath.Path(output)
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_bytes(model.getvalue())
  return output


class Tokenizer:
  """A SentencePiece model made by this module: plain text <-> ids, no specials added."""
  def __init__(self, serialized_proto: bytes, source: str = "<bytes>"):
    self._proto = serialized_proto
    self.source = source  # Where it was loaded from, for messages.
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(serialized_proto)
    except RuntimeError:
      raise UserError(f"tokenizer {source}: not a SentencePiece model; "
                      "train one with `python -m crossbert_jax.tokenizer`") from None
    ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id(),
           self._sp.piece_to_id(MASK) if self._sp.get_piece_size() > MASK_ID else -1)
    pieces = tuple(self._sp.id_to_piece(i) if 0 <= i < self._sp.get_piece_size() else None for i in range(NUM_SPECIAL))
    if ids != tuple(range(NUM_SPECIAL)) or pieces != SPECIAL_PIECES:
      raise UserError(f"tokenizer {source}: special ids are {dict(zip(SPECIAL_PIECES, ids))}, "
                      f"not {PAD}=0 {UNK}=1 {CLS}=2 {SEP}=3 {MASK}=4; the model was not made by "
                      "`python -m crossbert_jax.tokenizer`: retrain it with that command")

  @classmethod
  def load(cls, path: str | os.PathLike) -> "Tokenizer | hf_tokenizer.HfTokenizer":
    """Loads a model file written by `train_tokenizer`, or a Hugging Face tokenizer.json / folder holding
    one (local or gs://)."""
    path = epath.Path(path)
    if str(path) and hf_tokenizer.is_hf_tokenizer(path):
      return hf_tokenizer.HfTokenizer.load(path)
    if not str(path) or not path.is_file():
      raise UserError(f"tokenizer {str(path)!r} does not exist: point data.tokenizer / --tokenizer at a .model "
                      "file from `python -m crossbert_jax.tokenizer`, a tokenizer.json or a folder holding one")
    return cls(path.read_bytes(), source=str(path))

  # Pickling (Grain worker processes) ships the proto, not the C++ processor.
  def __getstate__(self):
    return {"proto": self._proto, "source": self.source}

  def __setstate__(self, state):
    self.__init__(state["proto"], state.get("source", "<bytes>"))

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def serialized_proto(self) -> bytes:
    return self._proto

  @property
  def content(self) -> bytes:
    """The model file's bytes: what the resume and shard checks hash."""
    return self._proto

  @property
  def special_ids(self) -> SpecialIds:
    return SENTENCEPIECE

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without [CLS]/[SEP]."""
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, without [CLS]/[SEP]."""
    return self._sp.encode(list(texts))

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; special ids decode to nothing."""
    return self._sp.decode([int(i) for i in ids])


AnyTokenizer = Tokenizer | hf_tokenizer.HfTokenizer


def from_content(content: bytes, source: str = "<bytes>") -> AnyTokenizer:
  """The tokenizer whose `content` this is (a tokenizer.json, else a SentencePiece model)."""
  if content.lstrip()[:1] == b"{":
    return hf_tokenizer.HfTokenizer(content, source)
  return Tokenizer(content, source)


def resolve_for_run(path: str, workdir: str) -> str:
  """A run's `data.tokenizer`: as given, else relative to an ancestor of its workdir.

  Configs store the path the run was started with (often relative to the repo root), so a run
  evaluated or exported from elsewhere finds its tokenizer by walking up from the workdir.
  """
  if not path:
    raise UserError(f"--workdir {workdir}: its config names no data.tokenizer; pass --tokenizer=PATH")
  if epath.Path(path).exists():
    return path
  relative = not os.path.isabs(path) and "://" not in path
  if relative and "://" not in workdir:
    for parent in epath.Path(workdir).resolve().parents:
      if (parent / path).exists():
        return str(parent / path)
  where = f"from here or above --workdir {workdir}" if relative else "(moved or deleted?)"
  raise UserError(f"tokenizer {path} (the run's data.tokenizer) is not found {where}: pass --tokenizer=PATH, "
                  "the run's tokenizer where it is now")

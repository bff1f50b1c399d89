"""A Hugging Face `tokenizers` tokenizer (tokenizer.json) as the run's tokenizer.

Loaded from a tokenizer.json file or a folder holding one (an exported or imported model
folder). The special roles come from special_tokens_map.json / tokenizer_config.json beside it,
else from the usual names (ModernBERT's and BERT's [CLS] [SEP] [PAD] [MASK] [UNK], RoBERTa's
<s> </s> <pad> <mask> <unk>); every added token marked special is reserved (`SpecialIds`).
Text is encoded by the library's batched Rust encoder, without its post-processor's specials.
"""

from collections.abc import Sequence
import json
import os

from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data.special_ids import SpecialIds

TOKENIZER_FILE = "tokenizer.json"
ROLES = ("pad", "unk", "cls", "sep", "mask")
# Usual token names of each role, tried in order when the folder's files name none.
_USUAL = {
    "pad": ("[PAD]", "<pad>", "<|padding|>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"), "mask": ("[MASK]", "<mask>")}
# Text no fixed vocabulary covers (rare words, scripts, an emoji): a tokenizer must encode it, if only to unknowns.
_PROBE = "Zyzzyva qwxjk ß Ελλάδα 漢字 😀 \u0007"


def is_hf_tokenizer(path: str | os.PathLike) -> bool:
  """Whether `path` names a tokenizer.json or a folder (holding one), not a SentencePiece file."""
  p = epath.Path(path)
  return str(p).endswith(".json") or p.is_dir()


def _token_name(value) -> str | None:
  """A role's token in special_tokens_map / tokenizer_config: a string or {"content": ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) and value else None


def _named_roles(folder: epath.Path) -> dict[str, str]:
  """Role -> token named by special_tokens_map.json, then tokenizer_config.json (the first wins)."""
  out: dict[str, str] = {}
  for name in ("special_tokens_map.json", "tokenizer_config.json"):
    path = folder / name
    if not path.is_file():
      continue
    try:
      data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
      raise UserError(f"tokenizer {path} is not valid JSON: re-save or re-download the tokenizer folder") from None
    for role in ROLES:
      token = _token_name(data.get(f"{role}_token")) if isinstance(data, dict) else None
      if token and role not in out:
        out[role] = token
  return out


class HfTokenizer:
  """tokenizer.json <-> ids, no specials added; `special_ids` from the file's roles."""
  def __init__(self, content: bytes, source: str = "<bytes>", named_roles: dict[str, str] | None = None):
    from tokenizers import Tokenizer as RustTokenizer  # pylint: disable=g-import-not-at-top

    self._content, self.source, self._named = content, source, dict(named_roles or {})
    try:
      self._tok = RustTokenizer.from_str(content.decode("utf-8"))
    except Exception as e:  # pylint: disable=broad-except  (the library raises plain Exception)
      raise UserError(f"tokenizer {source}: not a Hugging Face tokenizer.json ({' '.join(str(e).split())[:100]}); "
                      "point it at a tokenizer.json or a model folder holding one") from None
    self._tok.no_truncation()
    self._tok.no_padding()
    self.role_tokens = {role: self._role_token(role) for role in ROLES}
    ids = {role: (self._tok.token_to_id(t) if t else -1) for role, t in self.role_tokens.items()}
    if ids["pad"] < 0:  # Padding is masked out everywhere; [SEP] stands in where a file has no pad.
      ids["pad"], self.role_tokens["pad"] = ids["sep"], self.role_tokens["sep"]
    self._check_distinct(ids)
    added = [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
    others = tuple(self._tok.token_to_id(t) for t in added)
    self.special_ids = SpecialIds.of(ids["pad"], ids["unk"], ids["cls"], ids["sep"], ids["mask"], others)
    # The largest id + 1, not the number of tokens: a vocabulary may leave gaps.
    self._vocab_size = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1
    self._check_encodes()

  def _role_token(self, role: str) -> str | None:
    """The role's token: the folder's files, else a usual name in the vocabulary; None for a missing pad/unk."""
    named = self._named.get(role)
    if named is not None:
      if self._tok.token_to_id(named) is None:
        raise UserError(f"tokenizer {self.source}: its {role}_token {named!r} (special_tokens_map.json / "
                        "tokenizer_config.json) is not in its vocabulary: name a token the tokenizer has")
      return named
    for token in _USUAL[role]:
      if self._tok.token_to_id(token) is not None:
        return token
    if role in ("pad", "unk"):
      return None
    raise UserError(f"tokenizer {self.source} has no {role} token ({' '.join(_USUAL[role])} or a {role}_token in "
                    "special_tokens_map.json): add one to the tokenizer, or name it in special_tokens_map.json")

  def _check_distinct(self, ids: dict[str, int]) -> None:
    """Refuses two roles on one id ([SEP] standing in for a missing pad aside): masking and packing tell them apart."""
    seen: dict[int, str] = {}
    for role, i in ids.items():
      other = seen.setdefault(i, role)
      if i >= 0 and other != role and {other, role} != {"pad", "sep"}:
        raise UserError(f"tokenizer {self.source}: its {other} and {role} tokens are both {self.role_tokens[role]!r} "
                        f"(id {i}): name distinct {other}_token and {role}_token in special_tokens_map.json")

  def _check_encodes(self) -> None:
    """Refuses a tokenizer that cannot encode any text (a WordLevel or WordPiece model without its unknown token)."""
    try:
      self._tok.encode(_PROBE, add_special_tokens=False)
    except Exception as e:  # pylint: disable=broad-except  (the library raises plain Exception)
      raise UserError(f"tokenizer {self.source} cannot encode arbitrary text ({' '.join(str(e).split())[:100]}): "
                      "give it an unknown token (e.g. [UNK] in its vocabulary and as its model's unk_token)") from None

  @classmethod
  def load(cls, path: str | os.PathLike) -> "HfTokenizer":
    """Loads a tokenizer.json, or the one in folder `path` (roles from the files beside it)."""
    path = epath.Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not path.exists():
      raise UserError(f"tokenizer {path} does not exist: point data.tokenizer / --tokenizer at a "
                      "tokenizer.json or a model folder holding one")
    if not file.is_file():
      raise UserError(f"tokenizer {path} holds no {TOKENIZER_FILE}: point data.tokenizer / --tokenizer at a "
                      "tokenizer.json or a model folder holding one")
    return cls(file.read_bytes(), source=str(path), named_roles=_named_roles(file.parent))

  # Pickling (Grain worker processes) ships the JSON, not the Rust object.
  def __getstate__(self):
    return {"content": self._content, "source": self.source, "named": self._named}

  def __setstate__(self, state):
    self.__init__(state["content"], state["source"], state["named"])

  @property
  def vocab_size(self) -> int:
    """Every id the tokenizer can produce is below this (added tokens included)."""
    return self._vocab_size

  @property
  def content(self) -> bytes:
    """The tokenizer.json bytes: what the resume and shard checks hash."""
    return self._content

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without [CLS]/[SEP]."""
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, without [CLS]/[SEP] (the library's parallel batch encoder, no offsets)."""
    return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; special ids decode to nothing."""
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def id_to_token(self, i: int) -> str | None:
    return self._tok.id_to_token(int(i))

  def to_hf_json(self) -> str:
    """tokenizer.json for an export: this vocabulary, adding `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]`."""
    from tokenizers import Tokenizer as RustTokenizer, processors  # pylint: disable=g-import-not-at-top

    out = RustTokenizer.from_str(self._content.decode("utf-8"))
    out.no_truncation()
    out.no_padding()
    cls, sep = self.role_tokens["cls"], self.role_tokens["sep"]
    s = self.special_ids
    out.post_processor = processors.TemplateProcessing(single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
                                                       special_tokens=[(cls, s.cls), (sep, s.sep)])
    return out.to_str(pretty=True)


def special_tokens_map(tok: HfTokenizer) -> dict[str, str]:
  """special_tokens_map.json of an export: each role's token (a tokenizer without [UNK] names none)."""
  return {f"{role}_token": token for role, token in tok.role_tokens.items() if token is not None}


def reserved_tokens(tok: HfTokenizer) -> dict[int, str]:
  """Id -> token of every reserved (special) id, for tokenizer_config.json's added_tokens_decoder."""
  return {i: tok.id_to_token(i) for i in tok.special_ids.reserved if tok.id_to_token(i) is not None}

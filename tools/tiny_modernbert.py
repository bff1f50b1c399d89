"""Hugging Face folders made offline: a tiny random ModernBERT with a ModernBERT-like BPE tokenizer
(specials at high ids), and a BERT-style WordPiece tokenizer.json. The tests use them; as a command it
writes the tiny ModernBERT, for a CPU trial of continued pretraining without the Hub
(docs/continued_pretraining.md):

  python tools/tiny_modernbert.py --out=runs/tiny_mb [--no_head]
"""

import argparse
import json
import pathlib

from crossbert_jax.data import corpus

# ModernBERT's tokenizer (OLMo's BPE): <|endoftext|> and <|padding|> at 0 and 1, the BERT roles
# after the regular pieces, the vocabulary padded to a multiple of 64 with [unused*] specials.
BPE_VOCAB = 600
ROLE_TOKENS = {
    "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]"}
MODEL_VOCAB = 640  # BPE_VOCAB + 5 roles, padded to 64; the tokenizer names [unused0..] up to 620.
UNUSED = 15


def _texts(n: int = 3000) -> list[str]:
  return corpus.builtin_documents()[:n]


def bpe_tokenizer():
  """A byte-level BPE `tokenizers.Tokenizer` laid out like ModernBERT's (roles at 600-604)."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=["<|endoftext|>", "<|padding|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(_texts(), trainer)
  assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
  roles = list(ROLE_TOKENS.values()) + [f"[unused{i}]" for i in range(UNUSED)]
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in roles])
  cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(single="[CLS]:0 $A:0 [SEP]:0",
                                                     pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0", special_tokens=[
                                                         ("[CLS]", cls), ("[SEP]", sep)])
  return tok


def write_tokenizer_folder(tok, folder: pathlib.Path, roles: dict[str, str] | None = None) -> pathlib.Path:
  """tokenizer.json + special_tokens_map.json + tokenizer_config.json, as transformers saves them."""
  folder.mkdir(parents=True, exist_ok=True)
  tok.save(str(folder / "tokenizer.json"))
  roles = ROLE_TOKENS if roles is None else roles
  (folder / "special_tokens_map.json").write_text(json.dumps(roles))
  (folder / "tokenizer_config.json"
  ).write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, **roles}))
  return folder


def tiny_modernbert(folder: pathlib.Path, *, with_head: bool = True, seed: int = 0) -> pathlib.Path:
  """A random 2-layer ModernBERT (ModernBertForMaskedLM, or ModernBertModel) with the BPE tokenizer, saved
  with save_pretrained."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  tok = bpe_tokenizer()
  ids = {role: tok.token_to_id(t) for role, t in ROLE_TOKENS.items()}
  config = transformers.ModernBertConfig(vocab_size=MODEL_VOCAB, hidden_size=64, intermediate_size=96,
                                         num_hidden_layers=3, num_attention_heads=4, global_attn_every_n_layers=2,
                                         local_attention=16, max_position_embeddings=256, pad_token_id=ids["pad_token"],
                                         cls_token_id=ids["cls_token"], sep_token_id=ids["sep_token"],
                                         bos_token_id=ids["cls_token"], eos_token_id=ids["sep_token"])
  torch.manual_seed(seed)
  model = (transformers.ModernBertForMaskedLM if with_head else transformers.ModernBertModel)(config)
  model.save_pretrained(str(folder))
  write_tokenizer_folder(tok, folder)
  return folder


def wordpiece_tokenizer(path: pathlib.Path) -> pathlib.Path:
  """A BERT-style tokenizer.json (uncased WordPiece, [PAD] [UNK] [CLS] [SEP] [MASK] at 0-4), alone: its
  roles are found by their usual names."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top

  tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  trainer = trainers.WordPieceTrainer(vocab_size=700, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                      show_progress=False)
  tok.train_from_iterator(_texts(), trainer)
  path.parent.mkdir(parents=True, exist_ok=True)
  tok.save(str(path))
  return path


def wordlevel_tokenizer(path: pathlib.Path, words, *, unk: bool = True, ids: dict[str, int] | None = None,
                        roles: dict[str, str] | None = None) -> pathlib.Path:
  """A whitespace WordLevel tokenizer.json: [PAD] [UNK] [CLS] [SEP] [MASK] at 0-4 ([UNK] left out with
  `unk=False`, and then not the model's unk_token), then `words`; `ids` places more tokens at given ids.
  `roles`: a special_tokens_map.json written beside it."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top

  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if unk else ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]
  vocab = {t: i for i, t in enumerate(dict.fromkeys([*specials, *words]))}
  tok = Tokenizer(models.WordLevel(vocab={**vocab, **(ids or {})}, unk_token="[UNK]" if unk else None))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  path.parent.mkdir(parents=True, exist_ok=True)
  tok.save(str(path))
  if roles is not None:
    (path.parent / "special_tokens_map.json").write_text(json.dumps(roles))
  return path


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="Folder to write (must not exist yet).")
  parser.add_argument("--no_head", action="store_true", help="ModernBertModel (headless) instead of ForMaskedLM.")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  if out.exists():
    parser.exit(2, f"error: --out {out} exists: choose a new folder\n")
  tiny_modernbert(out, with_head=not args.no_head)
  print(f"wrote a tiny random {'ModernBertModel' if args.no_head else 'ModernBertForMaskedLM'} to {out}")


if __name__ == "__main__":
  main()

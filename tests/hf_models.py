"""The tests' offline Hugging Face folders: tools/tiny_modernbert.py (also a command for users)."""

from tools.tiny_modernbert import (BPE_VOCAB, MODEL_VOCAB, ROLE_TOKENS, UNUSED, bpe_tokenizer,  # noqa: F401
                                   tiny_modernbert, wordlevel_tokenizer, wordpiece_tokenizer,
                                   write_tokenizer_folder)

"""The tests' offline Hugging Face folders: tools/tiny_modernbert.py (also a command for users)."""

# Re-exported for the tests (pyproject: F401 off for this file).
from tools.tiny_modernbert import (BPE_VOCAB, MODEL_VOCAB, ROLE_TOKENS, UNUSED, bpe_tokenizer, tiny_modernbert,
                                   wordlevel_tokenizer, wordpiece_tokenizer, write_tokenizer_folder)

"""Text in: document sources, the tokenizer (SentencePiece or Hugging Face) and its special ids, the Grain packing pipeline, the built-in corpus."""

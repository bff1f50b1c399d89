"""Text in: document sources, the SentencePiece tokenizer, the Grain packing pipeline, the built-in corpus."""

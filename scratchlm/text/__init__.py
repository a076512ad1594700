"""Text in (stations 1-2): the tokenizers (characters, byte-level BPE, GPT-2's), the built-in corpus, and reading a user's text files."""

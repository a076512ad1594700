"""GGUF, llama.cpp's file: a trained model and its tokenizer out to llama.cpp and the tools built on it (`export`, with `tensors` and `vocab`)."""

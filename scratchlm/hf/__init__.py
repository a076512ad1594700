"""Hugging Face interop: a trained model to and from a `transformers` folder (`interop`), and the rotary embeddings as Hugging Face computes them (`hf_rotary`)."""

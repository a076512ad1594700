"""scratchlm: a GPT built from scratch, with every step of the data flow visible."""

__all__ = ["GPT", "GPTConfig"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so `import scratchlm.reference` (the NumPy twin) never drags in torch.
    if name == "GPT":
        from scratchlm.model import GPT

        return GPT
    if name == "GPTConfig":
        from scratchlm.config import GPTConfig

        return GPTConfig
    raise AttributeError(f"module 'scratchlm' has no attribute {name!r}")

"""scratchlm: a GPT built from scratch, with every step of the data flow visible.

Words used throughout the code:
  - the tutorials: the Chinese GPT-from-scratch tutorials this project follows; "the seed" means
    them too, and "the seed's model" the example repository they build (its architecture is the
    `smoke` preset, 13,356,928 parameters).
  - a station: one step of the data flow those tutorials walk through, numbered in data-flow order
    in docs/stations.md (text -> ids is station 1, the next token is station 18, ...). Comments
    cite them as "station N".
"""

__all__ = ["GPT", "GPTConfig"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so `import scratchlm.reference` (the NumPy twin) never drags in torch.
    if name == "GPT":
        from scratchlm.model.gpt import GPT

        return GPT
    if name == "GPTConfig":
        from scratchlm.model.config import GPTConfig

        return GPTConfig
    raise AttributeError(f"module 'scratchlm' has no attribute {name!r}")

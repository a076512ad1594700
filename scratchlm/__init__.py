"""scratchlm: a GPT built from scratch, with every step of the data flow visible."""

from scratchlm.config import GPTConfig
from scratchlm.model import GPT

__all__ = ["GPT", "GPTConfig"]
__version__ = "0.1.0"

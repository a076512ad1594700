"""A NumPy-only twin of the torch GPT, for reading and for checking it (the NumPy twin column of docs/stations.md).

Nothing under this package imports torch. Note that `import scratchlm.reference` first runs
`scratchlm/__init__.py`, which does import torch; load `numpy_gpt.py` on its own to avoid that.
"""

from scratchlm.reference.numpy_gpt import (
    cross_entropy,
    forward_trace,
    gpt_forward,
    next_token_probs,
    params_from_state_dict,
    sample_next,
)

__all__ = [
    "cross_entropy",
    "forward_trace",
    "gpt_forward",
    "next_token_probs",
    "params_from_state_dict",
    "sample_next",
]

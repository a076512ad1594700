"""How each next token is chosen, as one record (`SamplingOptions`), and the checks of a generation's
other numbers: torch-free, so the command line's parser and the playground's request reader can
use them without loading torch. scratchlm.generation.sampling applies them to the scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

from scratchlm.errors import ConfigError

MAX_NEW_TOKENS_LIMIT = 100_000
"""The most new tokens one call may ask for: far beyond any sensible sample, small enough that a
typo (an extra zero or two) is refused instead of running for hours."""


@dataclass(frozen=True)
class SamplingOptions:
    """How each next token is chosen (`choose_next`), checked once when made: a value with no
    meaning is a ConfigError naming the option (a UserError and a ValueError, so both the CLI and
    library callers can catch it). The generation functions take one of these, or its fields as
    keywords."""

    temperature: float = 1.0
    """Scores are divided by it: < 1 sharpens, > 1 flattens; 0 means greedy."""
    top_k: int | None = None
    """Keep the k most likely tokens (and any tied with the k-th)."""
    top_p: float | None = None
    """Keep the most likely tokens until their probabilities add up to at least p."""
    min_p: float | None = None
    """Keep tokens at least min_p times as likely as the most likely one."""
    repetition_penalty: float = 1.0
    """Tokens already in the sequence get their scores pushed down by this factor; 1 disables it."""
    greedy: bool = False
    """Take the most likely token every step (the filters then change nothing)."""

    def __post_init__(self) -> None:
        t, k, p, m, r = self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty
        if not (isinstance(t, Real) and not isinstance(t, bool) and math.isfinite(t) and t >= 0):
            raise ConfigError("temperature", f"must be a finite number >= 0 (0 means greedy), got {t!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, Integral) or k < 1):
            raise ConfigError("top_k", f"must be a whole number >= 1, got {k!r}")
        if p is not None and not (isinstance(p, Real) and 0.0 < p <= 1.0):
            raise ConfigError("top_p", f"must be in (0, 1], got {p!r}")
        if m is not None and not (isinstance(m, Real) and 0.0 <= m <= 1.0):
            raise ConfigError("min_p", f"must be in [0, 1], got {m!r}")
        if not (isinstance(r, Real) and math.isfinite(r) and r > 0):
            raise ConfigError("repetition_penalty", f"must be a finite number > 0 (1 disables it), got {r!r}")

    @property
    def is_greedy(self) -> bool:
        return bool(self.greedy) or self.temperature == 0

    @classmethod
    def of(cls, options: SamplingOptions | None = None, **fields) -> SamplingOptions:
        """`options` itself, or a SamplingOptions made of `fields` (an unknown name is a
        TypeError, as for any misspelt keyword); not both."""
        if options is None:
            return cls(**fields)
        if fields:
            raise TypeError(f"sampling options given twice: as SamplingOptions and as {', '.join(fields)}")
        if not isinstance(options, cls):
            raise TypeError(f"expected SamplingOptions, got {type(options).__name__}")
        return options


def check_max_new_tokens(max_new_tokens: int) -> None:
    """A whole number from 0 to MAX_NEW_TOKENS_LIMIT, else a ConfigError naming it."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral):
        raise ConfigError("max_new_tokens", f"must be a whole number, got {max_new_tokens!r}")
    if not 0 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise ConfigError("max_new_tokens", f"must be between 0 and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")


def check_seed(seed: int | None) -> None:
    """None (fresh entropy) or a whole number a torch generator takes: 0 to 2**63 - 1."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**63):
        raise ConfigError("seed", f"must be a whole number from 0 to 2**63 - 1, got {seed!r}")


def check_length_penalty(length_penalty: float) -> None:
    """Beam search ranks by logprob / length^length_penalty: NaN and the infinities rank nothing."""
    if not math.isfinite(length_penalty):
        raise ConfigError("length_penalty", f"must be a finite number, got {length_penalty!r}")

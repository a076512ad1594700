"""What one generation asks for, as one record: `GenerationSettings`.

    GenerationSettings(max_new_tokens=50, sampling=SamplingOptions(temperature=0.8, top_k=40), seed=1)
    GenerationSettings.of(max_new_tokens=50, temperature=0.8, top_k=40, seed=1)   # the same, flat

How each token is chosen is a SamplingOptions (scratchlm.generation.sampling); around it, how
many tokens, which random stream, where the text stops, and how many samples or beams. Every
value is checked once, when the record is made: a value with no meaning is a ConfigError naming
the field. How the model runs (its dtype, the KV cache) is not a setting of one generation but of
the Engine that runs it (scratchlm.generation.engine).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from numbers import Integral
from typing import Any, Callable

from scratchlm.errors import ConfigError
from scratchlm.records import SettingField, setting_fields
from scratchlm.generation.options import (SamplingOptions, check_length_penalty, check_max_new_tokens,
                                           check_seed)


@dataclass(frozen=True)
class GenerationSettings:
    """One generation's settings, checked when made (see the module docstring)."""

    max_new_tokens: int = 100
    """The most tokens to add; fewer when every sample ends early (end-of-text, a stop string)."""
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    """How each next token is chosen (not used by beam search, which ranks by log-probability)."""
    seed: int | None = None
    """Seeds the draw's own torch.Generator: one seed, one output; none given: fresh entropy."""
    stop: tuple[str, ...] = ()
    """The text ends before the first of these it holds (empty strings are left out)."""
    num_samples: int = 1
    """Continuations drawn in one batch; with beams > 1, how many of the best beams to return."""
    beams: int = 1
    """> 1: beam search of that width instead of sampling."""
    length_penalty: float = 1.0
    """Beam search ranks by logprob / length**length_penalty; 0 ranks by the raw sum."""

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, SamplingOptions):
            raise TypeError(f"sampling: expected SamplingOptions, got {type(self.sampling).__name__}")
        check_max_new_tokens(self.max_new_tokens)
        check_seed(self.seed)
        check_length_penalty(self.length_penalty)
        for name in ("num_samples", "beams"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ConfigError(name, f"must be a whole number >= 1, got {value!r}")
        if self.beams > 1 and self.num_samples > self.beams:
            raise ConfigError("num_samples", f"beam search returns at most --beams={self.beams} sequences, "
                                             f"asked for {self.num_samples}")
        if isinstance(self.stop, str):
            raise TypeError("stop: expected a sequence of strings, got one string")
        object.__setattr__(self, "stop", tuple(s for s in self.stop or () if s))  # frozen: set once, here

    @classmethod
    def of(cls, settings: GenerationSettings | None = None, **fields_given) -> GenerationSettings:
        """`settings` itself, or the settings made of `fields_given`: this record's fields and
        SamplingOptions' (temperature=0.8, top_k=40, ...) side by side; not both. An unknown name
        is a TypeError, as for any misspelt keyword."""
        if settings is not None:
            if fields_given:
                raise TypeError(f"settings given twice: as GenerationSettings and as {', '.join(fields_given)}")
            if not isinstance(settings, cls):
                raise TypeError(f"expected GenerationSettings, got {type(settings).__name__}")
            return settings
        own = {f.name for f in fields(cls)}
        choice = {name: value for name, value in fields_given.items() if name not in own}
        chosen = {name: value for name, value in fields_given.items() if name in own}
        # the sampling options are made first: a bad one is reported before the other fields
        sampling = SamplingOptions.of(chosen.pop("sampling", None), **choice)
        return cls(sampling=sampling, **chosen)


# --------------------------------------------------------------------------------------------
# The settings as a front end offers them (`scratchlm generate`, the playground)
# --------------------------------------------------------------------------------------------

FRONT_END_DEFAULTS = {"max_new_tokens": 200}
"""Where a front end starts from another value than the record's (a library call's 100)."""


@functools.cache
def _generation_fields() -> tuple[SettingField, ...]:
    rows = []
    for f in setting_fields(GenerationSettings):
        if f.name == "sampling":
            rows += setting_fields(SamplingOptions)
        else:
            rows.append(replace(f, default=FRONT_END_DEFAULTS.get(f.name, f.default)))
    return tuple(rows)


def generation_fields() -> list[SettingField]:
    """Every setting of one generation as flat rows, from the two records: GenerationSettings'
    own with SamplingOptions' fields in the place of `sampling`. The command line's flags and the
    playground's fields are made from these rows (their names, kinds, defaults and help)."""
    return list(_generation_fields())


BEAM_ONLY = ("length_penalty",)
"""The settings only beam search reads: with one beam they change nothing."""


def inert_settings(beams: int, greedy: bool, spell: Callable[[str], str] = str) -> tuple[tuple[str, ...], str]:
    """(the settings that cannot change a generation of this kind, why): beam search ranks by
    the model's own log-probabilities, so no sampling option applies; greedy decoding (`greedy`,
    or a temperature of 0) takes the likeliest token, so temperature, the filters and the seed
    change nothing (the repetition penalty still moves its choice). The command line warns with
    these words (`spell` writes a setting's name as the front end does: --beams), the playground
    dims these fields and says the same."""
    sampled = tuple(f.name for f in setting_fields(SamplingOptions) if f.name not in ("repetition_penalty", "greedy"))
    if beams > 1:
        return (*sampled, "seed", "repetition_penalty", "greedy"), f"with {spell('beams')} (beam search ranks by log-probability)"
    if greedy:
        return (*sampled, "seed"), "with greedy decoding (it takes the likeliest token)"
    return (), ""


def setting_given(name: str, value: Any, beams: int = 1) -> bool:
    """Whether a front end's value of setting `name` was changed from where it starts. Without beams
    a temperature of 0 is the switch to greedy decoding, not a sampling setting; beam search has
    no use for any temperature."""
    if name == "temperature" and value == 0 and beams == 1:
        return False
    return value != next(f.default for f in _generation_fields() if f.name == name)

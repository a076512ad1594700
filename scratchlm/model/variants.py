"""The config's variant fields, and what each adapter declares it supports of them.

A variant field picks one of a few ways to compute a part of the model: how position enters, which
norm, which activation, where the norm sits, six switches, and whether query heads share key and
value heads (`grouped_kv`, read off `n_kv_head`). scratchlm.model.gpt computes every value, and so
does the NumPy twin (scratchlm.reference). An adapter is code that reads a model by itself and so
could go silently wrong on a value it has never seen: a fast path (the training copy, the decoding
copy, the fused decoding step), an exporter (each Hugging Face architecture, each llama.cpp one) or
a count (FLOPs, memory). Each declares a `Supports`: an allow-list, written out value by value,
over every variant field. `Supports.first_unsupported(config)` names the first field whose value is
not on the list; a fast path then declines (the model's own code runs) and an exporter or a count
refuses with that line. A value added to the config is on no list until an adapter opts in, so it
makes every adapter decline rather than fall through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scratchlm.errors import ConfigError
from scratchlm.model import config as model_config

SWITCHES = ("final_norm", "tie_weights", "qkv_bias", "proj_bias", "mlp_bias", "lm_head_bias")


def variant_fields() -> dict[str, tuple]:
    """Every variant field and every value the model computes for it (read from the config's lists
    at each call, so a value added there is seen here)."""
    c = model_config
    fields: dict[str, tuple] = {"pos_embedding": c.POS_EMBEDDINGS, "norm": c.NORMS, "activation": c.ACTIVATIONS,
                                "norm_position": c.NORM_POSITIONS}
    fields.update({name: (True, False) for name in SWITCHES})
    fields["grouped_kv"] = (True, False)  # n_kv_head below n_head: query heads share keys and values
    return fields


def variant_of(config: Any) -> dict[str, Any]:
    """The value of every variant field in `config` (grouped_kv is read off n_kv_head)."""
    return {name: getattr(config, name) for name in variant_fields()}


@dataclass(frozen=True)
class Supports:
    """An adapter's allow-list: `name` (how its messages call it) and, for each variant field, the
    values it takes. A field it does not list is one it takes no value of."""

    name: str
    values: dict[str, tuple]

    def first_unsupported(self, config: Any) -> str | None:
        """`field 'value' is not supported by ...`: the first variant field of `config` whose value
        this adapter does not take, and what it does take; None when it takes them all."""
        found = self._first(config)
        return None if found is None else f"{found[0]} {found[1]}"

    def check(self, config: Any) -> None:
        """Raise ConfigError (one line, naming the field) where `first_unsupported` has a reason."""
        found = self._first(config)
        if found is not None:
            raise ConfigError(*found)

    def takes(self, config: Any) -> bool:
        return self._first(config) is None

    def _first(self, config: Any) -> tuple[str, str] | None:
        for field, value in variant_of(config).items():
            allowed = self.values.get(field, ())
            if value not in allowed:
                takes = ", ".join(_shown(v) for v in allowed) if allowed else "no value of it"
                return field, f"{_shown(value)} is not supported by {self.name} (it takes {takes})"
        return None


def supports(name: str, **values: tuple) -> Supports:
    """A Supports from keyword lists: supports("the X", pos_embedding=("learned", "rope"), ...)."""
    return Supports(name, dict(values))


BOTH = (True, False)  # a switch the adapter takes either way


def _shown(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)

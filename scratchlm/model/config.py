"""Model configuration: one flat dataclass with GPT-2 field names, and named presets.

Symbols used throughout the project: B batch, T sequence length, C width (`n_embd`), H heads
(`n_head`), N blocks (`n_layer`), V vocabulary size (`vocab_size`). The seed tutorials call C
`n_embed`, N `N_BLOCKS` and the context length `context_length`; here they are `n_embd`,
`n_layer` and `block_size`, as in GPT-2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from scratchlm.errors import ConfigError

POS_EMBEDDINGS = ("learned", "sinusoidal", "rope", "none")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
NORM_POSITIONS = ("pre", "post")
INITS = ("xavier", "gpt2")


@dataclass
class GPTConfig:
    """Everything that fixes a model's architecture. Saved inside every checkpoint."""

    vocab_size: int = 50304
    """V: number of token ids. Often padded up to a multiple of 64 for faster matmuls."""
    block_size: int = 256
    """Context length: the longest sequence the model accepts (the seed's `context_length`)."""
    n_layer: int = 2
    """N: number of Transformer blocks."""
    n_head: int = 4
    """H: attention heads per block. Each head attends in its own n_embd / n_head dimensions (the
    head size), so n_embd must be divisible by it."""
    n_embd: int = 128
    """C: width of the residual stream."""
    n_kv_head: int | None = None
    """Heads of keys and values (grouped-query attention, as in Llama 2 70B, Qwen and MiniMind):
    each group of n_head / n_kv_head query heads shares one key head and one value head, so the
    KV cache is that many times smaller. None means n_head (every query head has its own: plain
    multi-head attention); 1 is multi-query attention. Must divide n_head."""
    n_inner: int | None = None
    """Width of the MLP's first linear layer; None means 4 * n_embd. With swiglu the output of
    that layer is split into a gate half and a value half, so it must be even."""
    dropout: float = 0.0
    """Dropout on attention weights and on each residual branch (0 disables it)."""

    pos_embedding: str = "learned"
    """How position enters: `learned` table, fixed `sinusoidal` table, `rope` on Q/K, or `none`."""
    norm: str = "layernorm"
    """`layernorm` (gamma and beta) or `rmsnorm` (gamma only)."""
    norm_eps: float = 1e-5
    """Epsilon added to the variance inside every norm."""
    activation: str = "relu"
    """MLP non-linearity: `relu` (the seed), `gelu` (exact), `gelu_tanh` (GPT-2) or `swiglu`."""
    norm_position: str = "pre"
    """`pre`: x + f(norm(x)), the residual path never normalised; `post`: norm(x + f(x))."""
    final_norm: bool = True
    """One more norm, `ln_f`, between the last block and lm_head (GPT-2 and every pre-norm model,
    whose residual stream is otherwise never normalised). False: no ln_f at all; lm_head reads the
    last block's output as it is (the tutorial preset: its post-norm block already ends in a norm).
    A saved config from before this field has none and loads as True, as every such model had ln_f."""
    tie_weights: bool = False
    """Share one (V, C) matrix between the token embedding and lm_head."""
    rope_theta: float = 10000.0
    """Base of RoPE's rotation frequencies (only used when pos_embedding is `rope`)."""

    qkv_bias: bool = False
    """Bias on the fused Q/K/V projection (GPT-2 has one; the seed's model does not)."""
    proj_bias: bool = True
    """Bias on the attention output projection W_O."""
    mlp_bias: bool = True
    """Bias on both MLP linear layers."""
    lm_head_bias: bool = True
    """Bias on lm_head (the seed's model has one; GPT-2 does not)."""

    init: str = "xavier"
    """`xavier`: the seed's scheme; `gpt2`: normal(0, 0.02) with residual projections scaled
    by 1/sqrt(2 * n_layer)."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key and value heads: n_kv_head, or n_head when it is None."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def grouped_kv(self) -> bool:
        """True when query heads share key and value heads (fewer kv_heads than n_head)."""
        return self.kv_heads != self.n_head

    @property
    def mlp_hidden(self) -> int:
        """Width of the MLP's first layer output (before a swiglu split)."""
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    def validate(self) -> None:
        """Raise ConfigError naming the first field that is wrong, and why."""
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            _check_positive_int(name, getattr(self, name))
        if self.n_inner is not None:
            _check_positive_int("n_inner", self.n_inner)
        if self.n_kv_head is not None:
            _check_positive_int("n_kv_head", self.n_kv_head)
            if self.n_head % self.n_kv_head != 0:
                raise ConfigError("n_kv_head", f"{self.n_kv_head} does not divide n_head={self.n_head}; each key and "
                                               "value head serves a whole group of query heads")
        for name, allowed in (
            ("pos_embedding", POS_EMBEDDINGS),
            ("norm", NORMS),
            ("activation", ACTIVATIONS),
            ("norm_position", NORM_POSITIONS),
            ("init", INITS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(name, f"unknown value {value!r}; choose one of {', '.join(allowed)}")
        for name in ("final_norm", "tie_weights", "qkv_bias", "proj_bias", "mlp_bias", "lm_head_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        if not _is_number(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", f"must be a number in [0, 1), got {self.dropout!r}")
        if not _is_number(self.norm_eps) or not self.norm_eps > 0:
            raise ConfigError("norm_eps", f"must be a positive number, got {self.norm_eps!r}")
        if not _is_number(self.rope_theta) or not self.rope_theta > 0:
            raise ConfigError("rope_theta", f"must be a positive number, got {self.rope_theta!r}")
        if self.n_embd % self.n_head != 0:
            raise ConfigError(
                "n_embd",
                f"{self.n_embd} is not divisible by n_head={self.n_head}; each head gets n_embd / n_head "
                "dimensions, so pick sizes where that is a whole number",
            )
        if self.activation == "swiglu" and self.mlp_hidden % 2 != 0:
            raise ConfigError(
                "n_inner",
                f"swiglu splits the MLP hidden layer into two equal halves, but its width {self.mlp_hidden} is odd",
            )
        if self.pos_embedding == "rope" and self.head_dim % 2 != 0:
            raise ConfigError(
                "n_head",
                f"rope rotates pairs of dimensions, but the head size n_embd / n_head = {self.head_dim} is odd",
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], complete: bool = False) -> "GPTConfig":
        """The config of `values`; complete=True (a saved model's config) refuses a missing field
        too, since a default in its place would quietly build another network; only a field added
        after such configs were written (`_ADDED_LATER`) may be missing, its default being what
        every older model was."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(unknown[0], f"not a model config field; known fields: {', '.join(sorted(known))}")
        # fields added after models were saved take their defaults, which those models had
        missing = [f.name for f in fields(cls) if f.name not in values and f.name not in _ADDED_LATER]
        if complete and missing:
            raise ConfigError(missing[0], "missing; a saved model's config names every field (a default "
                                          "could build another network than the one the weights belong to)")
        return cls(**values)

    def replace(self, **changes: Any) -> "GPTConfig":
        """A copy with some fields changed, validated again."""
        return GPTConfig.from_dict({**self.to_dict(), **changes})

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "GPTConfig":
        """The preset called `name`, with optional field overrides."""
        if name not in PRESETS:
            raise ConfigError("preset", f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})


_ADDED_LATER = frozenset({"final_norm", "n_kv_head"})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(name, f"must be a whole number, got {value!r}")
    if value <= 0:
        raise ConfigError(name, f"must be positive, got {value}")


# The seed repository's architecture (station 14's count): learned positions, ReLU MLP, no Q/K/V bias, biases on
# W_O, the MLP and lm_head, untied. Its 13,356,928 parameters pin every one of these switches.
_SEED = dict(
    pos_embedding="learned",
    norm="layernorm",
    activation="relu",
    norm_position="pre",
    tie_weights=False,
    qkv_bias=False,
    proj_bias=True,
    mlp_bias=True,
    lm_head_bias=True,
    init="xavier",
)

PRESETS: dict[str, dict[str, Any]] = {
    # The seed's smoke test model: 13,356,928 parameters.
    "smoke": dict(_SEED, vocab_size=50304, block_size=256, n_layer=2, n_head=4, n_embd=128),
    # The seed's default size (about 400M parameters); H and context are not given by the seed.
    "seed-400m": dict(_SEED, vocab_size=50304, block_size=1024, n_layer=24, n_head=16, n_embd=1024),
    # The seed's readable training example (chapter 02: PyTorch's TransformerEncoderLayer, pre-norm,
    # GELU, biases on every projection, an lm_head without one, an 8192-token BPE): 2,510,336 parameters.
    "readable": dict(_SEED, vocab_size=8192, block_size=128, n_layer=2, n_head=4, n_embd=128, activation="gelu",
                     qkv_bias=True, lm_head_bias=False),
    # Every number printable by hand (station 22): 3 tokens, C=2, H=2, V=5.
    "hand": dict(_SEED, vocab_size=5, block_size=3, n_layer=1, n_head=2, n_embd=2),
    # The hand example of 《第 18 章 · 序列与 Transformer》 (docs/tutorials.md; 床前明 -> 月):
    # V=5 (床,前,明,月,山), 3 tokens, d=2, one head, sinusoidal positions added to the embeddings, post-norm
    # (H1 = LayerNorm(X + A), H2 = LayerNorm(H1 + F)), FFN 2 -> 4 -> 2 with ReLU and biases, A = O W_O
    # without a bias, and H2 straight into logits = H2 W_lm + b_lm: no final norm, head untied.
    "tutorial": dict(_SEED, vocab_size=5, block_size=3, n_layer=1, n_head=1, n_embd=2, n_inner=4,
                     pos_embedding="sinusoidal", norm_position="post", final_norm=False, proj_bias=False),
    # GPT-2 small, exactly: the seed's layout but for GELU (tanh form), a tied head without bias,
    # Q/K/V biases and GPT-2's initialisation.
    "gpt2-124m": dict(_SEED, vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                      activation="gelu_tanh", tie_weights=True, qkv_bias=True, lm_head_bias=False, init="gpt2"),
}

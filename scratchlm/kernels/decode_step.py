"""A whole decoding step in one call to the compiled library (decode_step.c), for the decoding
copy of a pre-norm GPT with its weights in the kernel layout, bfloat16 or float32
(scratchlm.generate.decoding_model).

`FusedDecodeStep.build(model, kernels)` reads the model's tensors once and describes them to the
C code in ctypes structs that mirror decode_step.c's; it returns None, with the reason in
`unsupported(model)`, for a model the C step does not cover (post-norm, weights not in the kernel
layout). The struct holds raw addresses, so the object keeps a reference to every tensor it points
at; the model must not replace them (in-place changes are fine). A conversion of the whole model
(.double(), .to(device)) is noticed by `describes(model)`, and the step is then dropped.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn as nn

_P = ctypes.c_void_p
_I = ctypes.c_int64

NORMS = {"layernorm": 0, "rmsnorm": 1}
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "swiglu": 3}


class StepLinear(ctypes.Structure):
    _fields_ = [("weight", _P), ("bias", _P), ("n_out", _I), ("k", _I)]


class StepLayer(ctypes.Structure):
    _fields_ = [("norm1_weight", _P), ("norm1_bias", _P), ("norm2_weight", _P), ("norm2_bias", _P),
                ("qkv", StepLinear), ("attn_out", StepLinear), ("fc", StepLinear), ("mlp_out", StepLinear)]


class StepModel(ctypes.Structure):
    _fields_ = [("n_layer", _I), ("n_head", _I), ("head_dim", _I), ("n_embd", _I), ("t_max", _I), ("vocab", _I),
                ("norm", _I), ("activation", _I), ("weights_f32", _I), ("norm_eps", ctypes.c_double),
                ("tok_emb", _P), ("pos_emb", _P), ("rope_cos", _P), ("rope_sin", _P),
                ("layers", ctypes.POINTER(StepLayer)), ("final_norm_weight", _P), ("final_norm_bias", _P),
                ("head", StepLinear)]


def unsupported(model: nn.Module) -> str | None:
    """Why the C step cannot run `model`, or None when it can."""
    from scratchlm.generate import DecodingLinear  # generate imports this module

    cfg = model.config
    if cfg.norm_position != "pre":
        return "post-norm blocks"
    if cfg.norm not in NORMS or cfg.activation not in ACTIVATIONS:
        return f"norm {cfg.norm!r} with activation {cfg.activation!r}"
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, DecodingLinear))]
    if not all(isinstance(m, DecodingLinear) and m.layout == "kernel" for m in linears):
        return "weights not in the kernel layout"
    if len({m.weight.dtype for m in linears}) != 1:
        return "weights in more than one dtype"
    others = [p for name, p in model.named_parameters() if p.dtype != torch.float32]
    if others:
        return "norms or embeddings not in float32"
    return None


class FusedDecodeStep:
    """`step(idx, cache)`: the next-token logits (B, V) for ids idx (B, T) after the cache's
    positions (B * T at most the kernel's `max_rows`: one new token per sequence, or a few), the
    new keys and values written into the cache and the cache advanced; or None when this call is
    not one the C step takes (more rows than it handles, a cache in another dtype or layout, too
    little room left in the cache, an id outside the vocabulary), and the caller runs the model
    instead.

    More positions than one per sequence are for a short prompt only: 8 rows cost the C loops
    about twice what one row costs (eight products per weight read), so a prompt of 16 positions
    already runs faster through the model's batched matmuls (bfloat16 gpt2-124m, one thread: 45 ms
    in two calls against 38 ms; 8 positions: 22 against 27 ms)."""

    def __init__(self, model: nn.Module, kernels):
        cfg = model.config
        self.config = cfg
        self.max_rows = kernels.max_rows
        self._fn = kernels.step_fn
        self._keep: list[torch.Tensor] = []  # every tensor the structs point at
        t = model.transformer

        def ptr(tensor: torch.Tensor | None) -> int | None:
            if tensor is None:
                return None
            tensor = tensor.detach().contiguous()
            self._keep.append(tensor)
            return tensor.data_ptr()

        def linear(m) -> StepLinear:
            return StepLinear(ptr(m.weight), ptr(m.bias_f32), m.out_features, m.in_features)

        def norm(m) -> tuple[int, int | None]:
            return ptr(m.weight), ptr(getattr(m, "bias", None))

        layers = []
        for block in t.h:
            layers.append(StepLayer(*norm(block.ln_1), *norm(block.ln_2), linear(block.attn.c_attn),
                                    linear(block.attn.c_proj), linear(block.mlp.c_fc), linear(block.mlp.c_proj)))
        self._layers = (StepLayer * len(layers))(*layers)
        pos_emb = {"learned": lambda: t.wpe.weight, "sinusoidal": lambda: model.pos_table}.get(cfg.pos_embedding)
        rope = cfg.pos_embedding == "rope"
        self._model = StepModel(
            cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd, cfg.block_size, cfg.vocab_size,
            NORMS[cfg.norm], ACTIVATIONS[cfg.activation], int(model.lm_head.weight.dtype == torch.float32),
            float(cfg.norm_eps),
            ptr(t.wte.weight), ptr(pos_emb() if pos_emb else None),
            ptr(model.rope_cos.float() if rope else None), ptr(model.rope_sin.float() if rope else None),
            self._layers, *norm(t.ln_f), linear(model.lm_head),
        )
        self._cache_shape = (cfg.n_layer, None, cfg.n_head, cfg.block_size, cfg.head_dim)
        # the embedding's storage: .to(), .double() and the like give every parameter new storage
        self._anchor = t.wte.weight.data_ptr()

    def describes(self, model: nn.Module) -> bool:
        """Whether `model` still holds the tensors this step points at (a conversion such as
        .double() or .to(device) replaces them; in-place changes such as load_state_dict do not)."""
        return model.transformer.wte.weight.data_ptr() == self._anchor

    @classmethod
    def build(cls, model: nn.Module, kernels) -> "FusedDecodeStep | None":
        return None if kernels is None or unsupported(model) else cls(model, kernels)

    def __call__(self, idx: torch.Tensor, cache) -> torch.Tensor | None:
        if idx.dim() != 2:
            return None
        B, T = idx.shape
        k, v = cache.k, cache.v
        n_layer, _, H, t_max, hs = self._cache_shape
        if not (idx.dtype == torch.long and 1 <= B * T <= self.max_rows and 0 <= cache.length
                and cache.length + T <= t_max and k.dtype == torch.float32 and v.dtype == torch.float32
                and k.shape == (n_layer, B, H, t_max, hs) and v.shape == k.shape
                and k.is_contiguous() and v.is_contiguous()):
            return None
        ids = idx.contiguous().view(-1)
        logits = torch.empty(B, self.config.vocab_size)
        rc = self._fn(ctypes.byref(self._model), ids.data_ptr(), B, T, cache.length, k.data_ptr(), v.data_ptr(),
                      logits.data_ptr(), torch.get_num_threads())
        if rc == -2:  # an id outside the vocabulary: the model's own path gives the error
            return None
        if rc != 0:
            raise MemoryError("decode_step: out of memory")
        cache.advance(T)
        return logits

"""A whole decoding step in one call to the compiled library (decode_step.c), for the decoding
copy of a pre-norm GPT with its weights in the kernel layout, bfloat16 or float32
(scratchlm.kernels.decoding_copy.decoding_model).

`FusedDecodeStep.build(model, kernels)` reads the model's tensors once and describes them to the
C code in ctypes structs that mirror decode_step.c's; it returns None, with the reason in
`unsupported(model)`, for a model the C step does not cover (post-norm, no final norm, weights not
in the kernel layout): such a model decodes through its own PyTorch modules. The struct holds raw
addresses, so the object keeps a reference to every tensor it points at; the model must not replace
them (in-place changes are fine). A conversion of the whole model (.double(), .to(device)) is
noticed by `describes(model)`, and the step is then dropped. The step's working memory is allocated
once and reused at every token (a block per concurrent caller, made again only for more threads),
so that a step allocates nothing.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn

from scratchlm.model.variants import BOTH, supports

_P = ctypes.c_void_p
_I = ctypes.c_int64

# decode_step.c: pre-norm blocks and a final norm before the head (it always normalises there)
FUSED_STEP = supports("the fused decoding step", pos_embedding=("learned", "sinusoidal", "rope", "none"),
                      norm=("layernorm", "rmsnorm"), activation=("relu", "gelu", "gelu_tanh", "swiglu"),
                      norm_position=("pre",), final_norm=(True,), tie_weights=BOTH, qkv_bias=BOTH, proj_bias=BOTH,
                      mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=(False,))
NORMS = {"layernorm": 0, "rmsnorm": 1}
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "swiglu": 3}


def _check(rc: int) -> None:
    if rc != 0:  # -1: less scratch than the step needs, which _scratch never gives
        raise RuntimeError(f"decode_step.c returned {rc}")


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


class KernelLinear(nn.Module):
    """What this step reads a Linear layer as: `weight` (out, in), `bias_f32` (or None),
    `in_features`, `out_features`, and `layout`, "kernel" when the weights are laid out for the
    compiled kernels. scratchlm.kernels.decoding_copy.DecodingLinear is one (that module imports
    this one, so the type is declared here, below it)."""


def unsupported(model: nn.Module) -> str | None:
    """Why the C step cannot run `model`, or None when it can."""
    reason = FUSED_STEP.first_unsupported(model.config)
    if reason is not None:
        return reason
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, KernelLinear))]
    if not all(isinstance(m, KernelLinear) and m.layout == "kernel" for m in linears):
        return "weights not in the kernel layout"
    if len({m.weight.dtype for m in linears}) != 1:
        return "weights in more than one dtype"
    others = [p for name, p in model.named_parameters() if p.dtype != torch.float32]
    if others:
        return "norms or embeddings not in float32"
    return None


class FusedDecodeStep:
    """`step(idx, cache)`: the next-token logits (B, V) for ids idx (B, T) after the cache's
    positions, the new keys and values written into the cache and the cache advanced; or None when
    this call is not one the C step takes (more rows than it handles, a cache in another dtype or
    layout, too little room left in the cache, an id outside the vocabulary), and the caller runs
    the model instead. `step.greedy(last, n, cache)`: n greedy steps in one call.

    One call takes B * T <= `max_rows` (8) rows: one new token per sequence, or a few positions.
    A prompt of up to `max_prompt` (16) rows goes in pieces of at most 8 (each sequence's
    positions in order), the pieces before the last skipping the head. More than that goes
    through the model's batched matmuls, which win on long prompts: 8 rows cost the C loops more
    than one row (eight products per weight read), and past 16 positions the pieces stopped
    winning (benchmarks/measurements.md)."""

    def __init__(self, model: nn.Module, kernels):
        cfg = model.config
        self.config = cfg
        self.max_rows = kernels.max_rows
        self.max_prompt = 2 * self.max_rows  # the most rows of a prompt, taken max_rows at a time
        self._fn = kernels.lib.scratchlm_decode_step
        self._greedy = kernels.lib.scratchlm_decode_greedy
        self._scratch_bytes = kernels.lib.scratchlm_decode_scratch_bytes
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
        pos_emb = {"learned": lambda: t.wpe.weight, "sinusoidal": lambda: model.pos_table,
                   "rope": lambda: None, "none": lambda: None}[cfg.pos_embedding]
        rope = cfg.pos_embedding == "rope"
        self._model = StepModel(
            cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd, cfg.block_size, cfg.vocab_size,
            NORMS[cfg.norm], ACTIVATIONS[cfg.activation], int(model.lm_head.weight.dtype == torch.float32),
            float(cfg.norm_eps),
            ptr(t.wte.weight), ptr(pos_emb()),
            ptr(model.rope_cos.float() if rope else None), ptr(model.rope_sin.float() if rope else None),
            self._layers, *norm(t.ln_f), linear(model.lm_head),
        )
        self._cache_shape = (cfg.n_layer, None, cfg.n_head, cfg.block_size, cfg.head_dim)
        # the embedding's storage: .to(), .double() and the like give every parameter new storage
        self._anchor = t.wte.weight.data_ptr()
        # The step's working memory (decode_step.c's Scratch): blocks allocated once and reused at
        # every token. A call takes a free block big enough for its threads, or makes one, and gives
        # it back: so steps of one copy from several threads (the playground's requests) still run
        # side by side, each in a block of its own, and a lone generation reuses one block.
        self._free: list[tuple[torch.Tensor, int]] = []  # (block, the threads it has room for)
        self._pool = threading.Lock()  # guards the list only, never a step

    @contextmanager
    def _scratch(self, threads: int) -> Iterator[tuple[int, int]]:
        """(address, bytes) of a scratch block for `threads` threads, this call's alone until it
        ends; blocks too small for `threads` are dropped from the pool rather than kept."""
        with self._pool:
            self._free = [b for b in self._free if b[1] >= threads]
            block = self._free.pop() if self._free else None
        if block is None:
            block = (torch.empty(self._scratch_bytes(ctypes.byref(self._model), threads), dtype=torch.uint8), threads)
        try:
            yield block[0].data_ptr(), block[0].numel()
        finally:
            with self._pool:
                self._free.append(block)

    def describes(self, model: nn.Module) -> bool:
        """Whether `model` still holds the tensors this step points at (a conversion such as
        .double() or .to(device) replaces them; in-place changes such as load_state_dict do not)."""
        return model.transformer.wte.weight.data_ptr() == self._anchor

    @classmethod
    def build(cls, model: nn.Module, kernels) -> "FusedDecodeStep | None":
        return None if kernels is None or unsupported(model) else cls(model, kernels)

    def _takes(self, idx: torch.Tensor, cache, positions: int) -> bool:
        """Whether ids idx (B, T) and `positions` new positions fit this step and this cache."""
        B = idx.shape[0]
        k, v = cache.k, cache.v
        n_layer, _, H, t_max, hs = self._cache_shape
        return (idx.dtype == torch.long and 1 <= B <= self.max_rows and 0 <= cache.length
                and cache.length + positions <= t_max and k.dtype == torch.float32 and v.dtype == torch.float32
                and k.shape == (n_layer, B, H, t_max, hs) and v.shape == k.shape
                and k.is_contiguous() and v.is_contiguous())

    def __call__(self, idx: torch.Tensor, cache) -> torch.Tensor | None:
        if idx.dim() != 2:
            return None
        B, T = idx.shape
        per_call = self.max_rows // B  # positions of each sequence per call
        if not (1 <= per_call and T <= max(per_call, self.max_prompt // B) and self._takes(idx, cache, T)):
            return None
        if T > per_call and not 0 <= int(idx.min()) <= int(idx.max()) < self.config.vocab_size:
            return None  # checked before the first piece writes the cache; the model's path gives the error
        ids = idx.contiguous()
        logits = torch.empty(B, self.config.vocab_size)
        threads = torch.get_num_threads()
        with self._scratch(threads) as scratch:
            for first in range(0, T, per_call):
                piece = ids[:, first:first + per_call].contiguous()
                n = piece.shape[1]
                last = first + n >= T
                rc = self._fn(ctypes.byref(self._model), piece.data_ptr(), B, n, cache.length, cache.k.data_ptr(),
                              cache.v.data_ptr(), logits.data_ptr() if last else None, threads, *scratch)
                if rc == -2:  # an id outside the vocabulary: the model's own path gives the error
                    return None
                _check(rc)
                cache.advance(n)
        return logits

    def greedy(self, last: torch.Tensor, steps: int, cache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`steps` greedy steps in one call: from last (B, 1), each sequence's newest token (not
        yet in the cache), (ids (steps, B), logits (steps, B, V)): what `steps` calls of this step,
        each followed by greedy_ids on its logits, would give. None, with the cache untouched,
        for what the C step does not take (see __call__), or fewer than `steps` free positions."""
        if steps < 1 or last.dim() != 2 or last.shape[1] != 1 or not self._takes(last, cache, steps):
            return None
        B = last.shape[0]
        ids = last.contiguous()
        logits = torch.empty(steps, B, self.config.vocab_size)
        out = torch.empty(steps, B, dtype=torch.long)
        threads = torch.get_num_threads()
        with self._scratch(threads) as scratch:
            rc = self._greedy(ctypes.byref(self._model), ids.data_ptr(), B, steps, cache.length, cache.k.data_ptr(),
                              cache.v.data_ptr(), logits.data_ptr(), out.data_ptr(), threads, *scratch)
        if rc == -2:  # an id outside the vocabulary: the model's own path gives the error
            return None
        _check(rc)
        cache.advance(steps)
        return out, logits

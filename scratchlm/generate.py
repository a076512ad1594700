"""Generation: turning a trained model into text, one token at a time (S20, S21).

The loop (S20): crop the sequence to the last `block_size` tokens, run the model, take the last
position's scores (logits), turn them into a distribution, choose a token, append it, repeat.

    ids (B, T) -> model -> logits (B, V) at the last position
               -> repetition penalty -> temperature -> top-k -> top-p -> min-p   (each optional)
               -> greedy argmax, or one multinomial draw per row                 -> next ids (B,)

Every step of that pipeline is a pure function of its inputs (plus an explicit
`torch.Generator` for the draw), so each can be tested and reused on its own.

The KV cache makes the loop cheaper without changing its result: the prompt is run once
(prefill) and every later step feeds only the newest token, reusing the keys and values of the
earlier ones. Past `block_size` the cache cannot stay exact (see `iter_tokens`), so the window is
recomputed, which is what the plain loop does anyway.

Beam search keeps the `beam_width` most probable partial sequences instead of one.

On CPU a decoding step is limited by reading the weights from memory (one row meets every
matrix), so the steps run on a decoding copy of the model (`decoding_model`): its matrices packed
once in the layout the CPU reads fastest, optionally in bfloat16 (`dtype=`), half the bytes.
Where scratchlm.kernels builds, a one-token step of a pre-norm model is one call to compiled code
(scratchlm.kernels.decode_step) instead of a few hundred torch operations, and greedy decoding
runs up to GREEDY_CHUNK such steps per call.
"""

from __future__ import annotations

import copy
import functools
import math
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from scratchlm.errors import ConfigError, UserError
from scratchlm.model import GPT, CausalSelfAttention, KVCache
from scratchlm.kernels import cpu_kernels
from scratchlm.kernels.decode_step import FusedDecodeStep

MAX_NEW_TOKENS_LIMIT = 100_000
"""The most new tokens one call may ask for: far beyond any sensible sample, small enough that a
typo (an extra zero or two) is refused instead of running for hours."""


# --------------------------------------------------------------------------------------------
# The sampling pipeline: pure functions of logits (B, V)
# --------------------------------------------------------------------------------------------


def apply_repetition_penalty(logits: torch.Tensor, previous: torch.Tensor, penalty: float) -> torch.Tensor:
    """Make tokens already in `previous` (B, T) less likely (CTRL-style): logits (B, V) -> (B, V).

    A positive score is divided by `penalty` and a negative one multiplied by it, so penalty > 1
    always pushes a seen token down (dividing a negative score would push it up). 1.0 is a no-op.
    """
    if penalty == 1.0 or previous.numel() == 0:
        return logits
    seen = logits.gather(1, previous)  # (B, T) the score of every token already present
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, previous, seen)  # repeats write the same value, so order is harmless


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T: T < 1 sharpens the distribution, T > 1 flattens it. T must be > 0 here;
    T = 0 means greedy and is handled by `choose_next`."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0 to scale logits; 0 means greedy (use argmax)")
    return logits if temperature == 1.0 else logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores of each row (ties with the k-th are kept too); the rest -> -inf."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1) the k-th largest score
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most probable tokens whose probabilities sum to
    at least p; the rest -> -inf. The most probable token is always kept, so no row is empty.

    A token stays if the probability mass strictly above it (in descending order) is still < p.
    """
    if p >= 1.0:
        return logits
    probs = F.softmax(logits.float(), dim=-1)
    # Only the k most probable tokens need sorting, for any k whose tokens hold at least p in
    # every row: all the others have at least that much mass ranked above them. Sorting all of
    # GPT-2's 50,257 takes about 3.6 ms (most of a decoding step); the 256 likeliest, 0.1 ms.
    def holds(floor: float) -> bool:  # the tokens at or above `floor` hold p in every row
        return bool((torch.where(probs >= floor, probs, 0.0).sum(dim=-1) >= p + 1e-5).all())  # margin: rounding

    floor = next((f for f in TOP_P_FLOORS if holds(f)), None)
    k = logits.shape[-1] if floor is None else max(1, int((probs >= floor).sum(dim=-1).max()))
    # ranked by score, not probability: scores a hair apart can round to the same probability
    order = torch.topk(logits, k, dim=-1).indices  # (B, k), most probable first
    top = probs.gather(-1, order)
    mass_before = torch.cumsum(top, dim=-1) - top  # mass of the tokens ranked above each
    keep_sorted = mass_before < p
    keep_sorted[..., 0] = True  # the top token is kept whatever p is
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, keep_sorted)  # vocabulary order
    return logits.masked_fill(~keep, float("-inf"))


TOP_P_FLOORS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
"""Probabilities tried in turn by top_p_filter: the first whose tokens hold p sets how many to sort."""


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the top token's; the rest -> -inf.

    The cut scales with the model's confidence: strict when one token dominates, loose when many
    are close. In log space: keep logit >= max logit + log(min_p).
    """
    if min_p <= 0.0:
        return logits
    top = logits.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(logits < top + math.log(min_p), float("-inf"))


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The most likely id of each row: logits (B, V) -> ids (B,), the first of equal maxima.

    On a CPU through NumPy: torch.argmax takes about 44 us for one row of GPT-2's 50,257 scores
    (no faster with two threads), NumPy's about 5, and a decoding step at 2 threads lasts ~5 ms."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and not logits.requires_grad:
        return torch.from_numpy(np.ascontiguousarray(logits.numpy()).argmax(axis=-1).astype(np.int64))
    return logits.argmax(dim=-1)


def sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One multinomial draw per row from softmax(logits) (B, V) -> ids (B,).

    By inverting the cumulative distribution: lay the probabilities end to end on [0, total),
    draw u uniformly there, and take the token whose stretch holds u (the first whose running
    total exceeds it). A token of probability q owns a stretch of length q, so it is drawn with
    probability q; a filtered-out token (probability 0) owns none. The running sums are float64,
    so 50k of them lose nothing visible. One uniform per row: about 0.1 ms for GPT-2's 50,257
    scores, where torch.multinomial takes about 1 ms, a fifth of a decoding step at 2 threads."""
    probs = F.softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    running = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # (B, V)
    total = running[:, -1:]  # (B, 1), 1 up to rounding
    if not bool(torch.isfinite(total).all()):
        raise ValueError("cannot sample: the scores contain NaN, or every one of them is -inf")
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=logits.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u < total, even after rounding
    return torch.searchsorted(running, u, right=True).squeeze(-1)  # first index with running > u


def choose_next(
    logits: torch.Tensor,
    previous: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The whole pipeline for one step: logits (B, V) and the ids so far (B, T) -> next ids (B,).

    Greedy (or temperature 0) takes the argmax after the repetition penalty; the filters only
    reshape a distribution to sample from, and cannot change which token is the most likely.

    After top-k, the later stages work on the k candidates alone (B, k) when no other token ties
    with the k-th: every other token is -inf by then, so top-p, min-p and the draw give the same
    distribution, and 200 scores cost far less than 50,257.
    """
    if previous is not None:
        logits = apply_repetition_penalty(logits, previous, repetition_penalty)
    if greedy or temperature == 0:
        return greedy_ids(logits)
    logits = apply_temperature(logits, temperature)
    candidates = None  # (B, k) vocabulary ids of the columns of `logits`, once narrowed to them
    if top_k is not None and top_k < logits.shape[-1]:
        top, ids = torch.topk(logits, top_k, dim=-1)  # (B, k) each
        if bool(((logits >= top[..., -1:]).sum(dim=-1) <= top_k).all()):  # no tie beyond the k-th
            logits, candidates = top, ids
        else:
            logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    drawn = sample(logits, generator)
    return drawn if candidates is None else candidates.gather(-1, drawn[:, None]).squeeze(-1)


def check_sampling_options(
    *,
    max_new_tokens: int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
) -> None:
    """Refuse values that have no meaning, naming the option (ConfigError is a UserError and a
    ValueError, so both the CLI and library callers can catch it)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral):
        raise ConfigError("max_new_tokens", f"must be a whole number, got {max_new_tokens!r}")
    if not 0 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise ConfigError("max_new_tokens", f"must be between 0 and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")
    if not (isinstance(temperature, Real) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError("temperature", f"must be a finite number >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, Integral) or top_k < 1):
        raise ConfigError("top_k", f"must be a whole number >= 1, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, Real) and 0.0 < top_p <= 1.0):
        raise ConfigError("top_p", f"must be in (0, 1], got {top_p!r}")
    if min_p is not None and not (isinstance(min_p, Real) and 0.0 <= min_p <= 1.0):
        raise ConfigError("min_p", f"must be in [0, 1], got {min_p!r}")
    if not (isinstance(repetition_penalty, Real) and math.isfinite(repetition_penalty) and repetition_penalty > 0):
        raise ConfigError("repetition_penalty", f"must be a finite number > 0 (1 disables it), got {repetition_penalty!r}")


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A random stream of its own, so one seed gives one output whatever else uses torch's RNG."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # fresh entropy
    else:
        generator.manual_seed(int(seed))
    return generator


# --------------------------------------------------------------------------------------------
# The decoding loop on tensors
# --------------------------------------------------------------------------------------------


def _fused_step(model: GPT) -> FusedDecodeStep | None:
    """The compiled step built for decoding copy `model`, or None: none was built, or the copy was
    converted after it was (.double(), .to(device)), and the stale step is forgotten."""
    step = _FUSED_STEPS.get(model)
    if step is not None and not step.describes(model):
        del _FUSED_STEPS[model]
        return None
    return step


def _last_logits(model: GPT, idx: torch.Tensor, kv_cache: KVCache | None = None) -> torch.Tensor:
    """ids (B, T) -> scores of the next token (B, V), at least float32. Only the last position
    reaches lm_head: the same numbers as model(idx)[0][:, -1], without a (T, C) x (C, V) product
    thrown away. A decoding copy with a FusedDecodeStep sends it the calls it takes: one new token
    per sequence, or a prompt of at most its `max_prompt` rows (16) in all."""
    step = _fused_step(model) if kv_cache is not None else None
    logits = step(idx, kv_cache) if step is not None else None  # None: not a call it takes
    if logits is not None:
        return logits
    hidden = model.forward_hidden(idx, kv_cache=kv_cache)  # (B, T, C)
    logits = model.lm_head(hidden[:, -1, :])  # (B, V)
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


GREEDY_CHUNK = 8
"""The most greedy steps per call of the compiled step. Each call streams the whole model through
the caches, so whatever Python runs between two calls finds its data evicted and runs about 20x
slower than usual: about 0.2 ms a token at GPT-2 size (4% of a step), paid once per chunk instead.
A consumer that stops early (an end token, a stop string) leaves at most GREEDY_CHUNK - 1 steps
computed and unused."""

GREEDY_LATENCY = 0.05
"""Seconds of steps one chunk may hold back from a streaming reader: a model whose step takes
longer than GREEDY_LATENCY / GREEDY_CHUNK gets shorter chunks (one step each past 50 ms a step,
where 0.2 ms is nothing anyway), so its tokens still arrive one by one."""


def _greedy_steps(model: GPT, last: torch.Tensor, steps: int, kv_cache: KVCache) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`steps` greedy steps of a decoding copy in one call of its FusedDecodeStep, from last (B, 1),
    the newest token of each sequence: (ids (steps, B), logits (steps, B, V)), the same as that
    many rounds of _last_logits and greedy_ids. None when the copy has no step, or the step
    declines (the cache is then untouched)."""
    step = _fused_step(model)
    return None if step is None else step.greedy(last, steps, kv_cache)


def _default_layout(dtype: torch.dtype) -> str:
    if cpu_kernels() is not None:
        return "kernel"
    if dtype != torch.bfloat16:
        return "in_out"
    return "packed" if _mkldnn_packing_available() else "in_out"


@functools.lru_cache(maxsize=1)
def _mkldnn_packing_available() -> bool:
    """Whether oneDNN packs and multiplies bfloat16 weights here: tried once on a tiny matrix, since
    its ops exist on every x86 build but refuse CPUs without AVX-512 (or AVX-NE-CONVERT)."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
                and hasattr(ops, "_linear_pointwise")):
            return False
        packed = ops._reorder_linear_weight(torch.ones(2, 2, dtype=torch.bfloat16), 1)
        ops._linear_pointwise(torch.ones(1, 2, dtype=torch.bfloat16), packed, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError):
        return False


class DecodingLinear(nn.Module):
    """nn.Linear's y = x W^T + b for decoding on a CPU: W in `dtype` (float32 or bfloat16), stored
    the way the CPU reads it fastest; x and y stay in the caller's dtype.

    A decoding step multiplies one row per sequence by every weight matrix, so its speed is the
    speed of reading the weights from memory, and bfloat16 weights halve what is read. On CPU,
    nn.Linear's (out, in) layout is read slowly for a single row, and in bfloat16 oneDNN even
    repacks the whole matrix on every call. So the layout depends on what reads it:
      - "kernel" (where scratchlm.kernels compiles): W stays (out, in) and a few rows go
        through the compiled gemv kernel (bfloat16 or float32), which streams each weight row
        once; more rows (a prompt) go through PyTorch's matmul on the same weights.
      - "packed" (bfloat16 otherwise): oneDNN's own blocked layout, packed once.
      - "in_out" (float32 otherwise): transposed to (in, out), which MKL reads fast for one row.
    In bfloat16 the input is rounded to bfloat16 and the products summed in float32, as under
    autocast.
    """

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, layout: str | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = dtype
        if layout is None:
            layout = _default_layout(dtype)
        self.layout = layout
        weight = linear.weight.detach().to(dtype, copy=True)  # (out, in), never the model's own storage
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype).clone()
        self.kernel = cpu_kernels() if layout == "kernel" else None
        if layout == "kernel" and (self.kernel is None or dtype not in (torch.bfloat16, torch.float32)):
            raise ValueError("the 'kernel' layout needs bfloat16 or float32 weights and a compiled scratchlm.kernels")
        if layout == "packed":
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1)  # opaque blocked layout
        elif layout == "kernel":
            self.weight = weight.contiguous()  # (out, in), as nn.Linear keeps it
            self.bias_f32 = None if self.bias is None else self.bias.float()
        else:
            self.weight = weight.t().contiguous()  # (in, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_dtype = x.dtype
        if self.kernel is not None:
            rows = x.numel() // self.in_features
            if 0 < rows <= self.kernel.max_rows:
                if x_dtype == torch.float32 and x.is_contiguous():  # a decoding step: the short way
                    return self.kernel.rows(x, self.weight, self.bias_f32, rows).view(*x.shape[:-1], -1)
                return self.kernel(x, self.weight, self.bias_f32).to(x_dtype)  # (..., out)
        x = x.to(self.dtype)
        if self.layout == "kernel":
            y = F.linear(x, self.weight, self.bias)
        elif self.layout == "packed":
            y = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        elif self.bias is None:
            y = x @ self.weight  # (..., in) @ (in, out) -> (..., out)
        else:
            y = torch.addmm(self.bias, x.flatten(0, -2), self.weight).view(*x.shape[:-1], -1)  # (..., out)
        return y.to(x_dtype)


class DecodingAttention(CausalSelfAttention):
    """CausalSelfAttention for decoding on a CPU: the same module (the same c_attn, c_proj and
    settings), whose one-new-position steps run through the compiled attend_one kernel
    (scratchlm/kernels/attend_one.c): it writes the new key and value into the cache and attends
    in one call, where the model's own code takes about twenty small torch operations, each a few
    microseconds of overhead. Everything else (a prompt, RoPE, masks, attention weights, a cache in
    another dtype) goes through the model's own code."""

    @classmethod
    def from_attention(cls, attn: CausalSelfAttention, kernel) -> "DecodingAttention":
        fast = cls.__new__(cls)
        fast.__dict__.update(attn.__dict__)  # the same submodules and settings (attn is the copy's own)
        fast.kernel = kernel
        return fast

    def forward(self, x, rope=None, allowed=None, kv_cache=None, weights_out=None) -> torch.Tensor:
        if (x.shape[1] != 1 or kv_cache is None or rope is not None or allowed is not None
                or weights_out is not None or self.training or x.dtype != torch.float32
                or any(t.dtype != torch.float32 or not t.is_contiguous() for t in (kv_cache.k, kv_cache.v))):
            return super().forward(x, rope, allowed, kv_cache, weights_out)
        qkv = self.c_attn(x).contiguous()  # (B, 1, 3C)
        y = self.kernel.attend_one(qkv, kv_cache.k[self.layer], kv_cache.v[self.layer], kv_cache.length,
                                   self.n_head)  # (B, 1, C)
        return self.resid_dropout(self.c_proj(y))


def decoding_model(model: GPT, dtype: torch.dtype | str | None = None, layout: str | None = None) -> GPT:
    """A copy of `model` for decoding only, in eval mode, with its weights in `dtype` (None keeps
    the model's).

    On CPU, every Linear (lm_head included) becomes a `DecodingLinear` holding its weight in
    `dtype` and in a layout read fast for one row, while everything else (activations, norms,
    embeddings, attention and the KV cache) stays in float32: bfloat16 attention is several times
    slower on CPU, and the weights are what a step reads. A tied lm_head gets a copy of its own;
    the embedding keeps the (V, C) table, of which a step reads one row. Where scratchlm.kernels
    builds, each block's attention becomes a `DecodingAttention` too (one call per layer for a
    one-position step), and a pre-norm copy in the kernel layout gets a `FusedDecodeStep`: its
    one-token steps and short prompts, up to the kernel's row limit, run whole in compiled code
    (see `_last_logits`).
    Elsewhere (GPU) the copy is simply cast to `dtype`. The copy shares no storage with `model`:
    in float32 it computes the same numbers to rounding; in bfloat16 to bfloat16's precision
    (about 3 significant digits).
    `generate`, `iter_tokens` and `beam_search` build one and reuse it while the weights stay
    unchanged (see `_decoder_for`).
    """
    dtype = _as_dtype(dtype, model)
    device, own_dtype = _model_device_dtype(model)
    if device.type != "cpu" or dtype not in DECODE_DTYPES or own_dtype not in DECODE_DTYPES:
        fast = copy.deepcopy(model).to(dtype)
    else:
        linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        # Copy everything except the Linear layers (a placeholder stands in for each, so their
        # weights, most of the model, are not copied in the old layout), then rebuild those.
        placeholders = {id(m): nn.Identity() for m in linears.values()}
        fast = copy.deepcopy(model, memo=dict(placeholders))
        for name, linear in linears.items():
            fast.set_submodule(name, DecodingLinear(linear, dtype, layout))
        fast = fast.float()  # the copy's own tensors only: no Linear of `model` is left in it
        kernel = cpu_kernels()
        if kernel is not None:
            for block in fast.transformer.h:
                block.attn = DecodingAttention.from_attention(block.attn, kernel)
    fast.eval().requires_grad_(False)
    fast.is_decoding_copy = True
    if device.type == "cpu":
        step = FusedDecodeStep.build(fast, cpu_kernels())
        if step is not None:
            _FUSED_STEPS[fast] = step
    return fast


_FUSED_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""decoding copy -> its FusedDecodeStep, where the C step covers it. Kept beside the copy rather
than on it, so a copy of the copy (whose tensors are new) does not inherit raw addresses."""


DECODE_DTYPES = (torch.float32, torch.bfloat16)


def auto_decoding_dtype(device: torch.device) -> torch.dtype:
    """What `dtype="auto"` decodes in: bfloat16 weights where reading them is fast, a CUDA GPU
    that supports them, or a CPU whose decoding kernels have a vectorised bfloat16 loop (every
    loop but the portable one: decoding is memory-bound there, and half the bytes is about twice
    the tokens) or whose matmuls are bfloat16-native; else float32."""
    from scratchlm import cpu

    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type != "cpu":
        return torch.float32
    kernel = cpu_kernels()
    fast = (kernel is not None and kernel.loop != "portable") or cpu.native_bf16()
    return torch.bfloat16 if fast else torch.float32


def _as_dtype(dtype: torch.dtype | str | None, model: GPT) -> torch.dtype:
    if dtype is None:
        return _model_device_dtype(model)[1]
    if dtype == "auto":
        return auto_decoding_dtype(_model_device_dtype(model)[0])
    if isinstance(dtype, str):
        named = getattr(torch, dtype, None)
        if not isinstance(named, torch.dtype) or not named.is_floating_point:
            raise ConfigError("dtype", f"unknown floating-point dtype {dtype!r}; use float32, bfloat16 or auto")
        dtype = named
    if not dtype.is_floating_point:
        raise ConfigError("dtype", f"decoding needs a floating-point dtype, got {dtype}")
    return dtype


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> {dtype: (weights signature, decoding copy)}: the last copy built per model and dtype."""


def _weights_signature(model: GPT) -> tuple:
    # Any in-place change to a parameter (an optimizer step, load_state_dict, copy_) bumps its
    # version counter; a replaced tensor has a new address. Either makes the old copy stale.
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def _decoder_for(model: GPT, steps: int, dtype: torch.dtype | str | None) -> GPT:
    """The model each step runs: the model itself when it will do (same dtype, and not on CPU or
    too few steps for a copy to pay for itself), else its decoding copy, built once and reused
    while the model's weights stay as they were."""
    device, own_dtype = _model_device_dtype(model)
    dtype = _as_dtype(dtype, model)
    if getattr(model, "is_decoding_copy", False) or (dtype == own_dtype and (steps < 8 or device.type != "cpu")):
        return model
    signature = _weights_signature(model)
    copies = _DECODERS.setdefault(model, {})
    if dtype in copies and copies[dtype][0] == signature:
        return copies[dtype][1]
    copies.pop(dtype, None)  # free the stale copy before building the next
    fast = decoding_model(model, dtype)
    copies[dtype] = (signature, fast)
    return fast


def _model_device_dtype(model: GPT) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters())
    return param.device, param.dtype


@torch.inference_mode()
def iter_tokens(
    model: GPT,
    idx: torch.Tensor,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    dtype: torch.dtype | str | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (next ids (B,), the model's raw logits (B, V) they were chosen from), step by step.

    idx (B, T0) holds the prompts, T0 >= 1 (start from BOS for an empty prompt). The model runs
    in eval mode (no dropout) and is put back in its former mode when the iterator ends.

    use_cache=False is the plain loop of S20: every step runs the whole window, the last
    `block_size` tokens. use_cache=True gives the same tokens:
      - the first step runs the window once and keeps every layer's keys and values (prefill);
      - each later step runs only the newest token against the cached keys and values;
      - once the cache holds `block_size` positions and the sequence grows again, the window
        slides by one. Every position in it then counts from a new start (learned, sinusoidal
        and RoPE positions are all absolute from the start of the window), and every hidden
        state attended to the token that just fell out, so no cached key or value is still the
        one the plain loop would compute. No cheaper scheme is exact: the step re-prefills the
        window, which costs what the plain loop costs. Until the boundary, a step costs one
        position instead of up to `block_size`.
    """
    check_sampling_options(
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, repetition_penalty=repetition_penalty,
    )
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must be (B, T) with T >= 1 (start an empty prompt from BOS), got {tuple(idx.shape)}")
    decoder = _decoder_for(model, max_new_tokens, dtype)
    device, dtype = _model_device_dtype(decoder)
    block = model.config.block_size
    B, T0 = idx.shape
    # One buffer for the whole sequence, written in place: no concatenation per step.
    seq = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=device)
    seq[:, :T0] = idx
    n = T0
    penalise = repetition_penalty != 1.0
    cache = KVCache(model.config, B, device=device, dtype=dtype) if use_cache else None

    # Greedy steps with the compiled step run up to GREEDY_CHUNK at a time in one call (see
    # _greedy_steps), as many as fit in GREEDY_LATENCY by the last chunk's pace.
    chunked = (greedy or temperature == 0) and not penalise and cache is not None
    per_step = None  # seconds a compiled greedy step took in the last chunk: sizes the next
    was_training = model.training
    model.eval()
    try:
        step = 0
        while step < max_new_tokens:
            if chunked and step > 0 and cache.length < block:
                size = 1 if per_step is None else max(1, min(GREEDY_CHUNK, int(GREEDY_LATENCY / max(per_step, 1e-9))))
                size = min(size, max_new_tokens - step, block - cache.length)
                start = time.perf_counter()
                chunk = _greedy_steps(decoder, seq[:, n - 1 : n], size, cache)
                per_step = (time.perf_counter() - start) / size
                if chunk is not None:
                    for next_ids, logits in zip(*chunk):
                        seq[:, n] = next_ids
                        n += 1
                        step += 1
                        yield next_ids, logits
                    continue
                chunked = False  # declined (more sequences than it takes, no compiled step): for good
            if cache is None:
                logits = _last_logits(decoder, seq[:, max(0, n - block) : n], None)
            elif step == 0 or cache.length == block:
                cache.length = 0  # start over in the same preallocated tensors
                logits = _last_logits(decoder, seq[:, max(0, n - block) : n], cache)
            else:
                logits = _last_logits(decoder, seq[:, n - 1 : n], cache)
            next_ids = choose_next(
                logits, seq[:, :n] if penalise else None, temperature=temperature, top_k=top_k,
                top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, greedy=greedy,
                generator=generator,
            )
            seq[:, n] = next_ids
            n += 1
            step += 1
            yield next_ids, logits
    finally:
        model.train(was_training)


def generate_ids(
    model: GPT,
    idx: torch.Tensor,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    eos_id: int | None = None,
    dtype: torch.dtype | str | None = None,
) -> torch.Tensor:
    """ids (B, T0) -> (B, T0 + n) with the n <= max_new_tokens chosen tokens appended.

    With eos_id, a row that produced it keeps eos_id for its remaining positions, and the loop
    stops once every row has. `seed` builds a generator when none is given.
    """
    device, _ = _model_device_dtype(model)
    if generator is None and not greedy and temperature != 0:
        generator = make_generator(seed, device)
    idx = idx.to(device)
    steps = []
    done = torch.zeros(idx.shape[0], dtype=torch.bool, device=device) if eos_id is not None else None
    for next_ids, _ in iter_tokens(
        model, idx, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, repetition_penalty=repetition_penalty, greedy=greedy, generator=generator,
        use_cache=use_cache, dtype=dtype,
    ):
        if done is not None:
            next_ids = next_ids.masked_fill(done, eos_id)
            done |= next_ids == eos_id
        steps.append(next_ids)
        if done is not None and bool(done.all()):
            break
    if not steps:
        return idx.clone()
    return torch.cat([idx, torch.stack(steps, dim=1)], dim=1)  # (B, T0 + n)


# --------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------


def _length_normalised(logprob: float, n_tokens: int, length_penalty: float) -> float:
    # Dividing by length^alpha stops the sum of (negative) log-probabilities from always
    # preferring short sequences; alpha = 0 ranks by the raw sum.
    return logprob / (max(n_tokens, 1) ** length_penalty)


@torch.inference_mode()
def beam_search(
    model: GPT,
    idx: torch.Tensor,
    beam_width: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    n_best: int = 1,
    *,
    eos_id: int | None = None,
    use_cache: bool = True,
    dtype: torch.dtype | str | None = None,
) -> list[tuple[list[int], float]]:
    """Keep the `beam_width` most probable continuations at every step; return the `n_best`.

    idx: one prompt, (T0,) or (1, T0). Returns up to n_best pairs (ids, logprob), best first:
    ids is the whole sequence (prompt + continuation, ending with eos_id when the beam stopped
    there) and logprob the sum of log p(token | everything before) over the continuation. They
    are ranked by logprob / n_new^length_penalty. Finished beams (ended at eos_id) leave the
    search; the others run for max_new_tokens steps. A beam as wide as the number of possible
    continuations prunes nothing and is an exhaustive search.
    """
    check_sampling_options(max_new_tokens=max_new_tokens)
    if beam_width < 1 or n_best < 1:
        raise ConfigError("beams", f"beam width and n_best must be >= 1, got {beam_width} and {n_best}")
    if idx.dim() == 2:
        if idx.shape[0] != 1:
            raise ValueError(f"beam search takes one prompt, got a batch of {idx.shape[0]}")
        idx = idx[0]
    if idx.numel() == 0:
        raise ValueError("the prompt is empty; start it from BOS")
    decoder = _decoder_for(model, max_new_tokens, dtype)
    device, dtype = _model_device_dtype(decoder)
    block = model.config.block_size
    T0 = idx.numel()

    beams = idx.to(device).view(1, T0)  # (W_live, T) live beams; one to start with
    scores = torch.zeros(1, device=device)  # (W_live,) log-probability of each continuation
    finished: list[tuple[list[int], float]] = []
    cache = KVCache(model.config, 1, device=device, dtype=dtype) if use_cache else None
    was_training = model.training
    model.eval()
    try:
        for step in range(max_new_tokens):
            n = beams.shape[1]
            if cache is None:
                logits = _last_logits(decoder, beams[:, max(0, n - block) :], None)
            elif step == 0 or cache.length == block:
                cache = KVCache(model.config, beams.shape[0], device=device, dtype=dtype)
                logits = _last_logits(decoder, beams[:, max(0, n - block) :], cache)
            else:
                logits = _last_logits(decoder, beams[:, -1:], cache)
            logp = F.log_softmax(logits.float(), dim=-1)  # (W_live, V)
            V = logp.shape[-1]
            candidates = (scores[:, None] + logp).view(-1)  # (W_live * V,) every one-token extension
            # With eos, up to beam_width candidates may finish, so look at twice as many to
            # still have beam_width live ones.
            k = min(candidates.numel(), beam_width * (2 if eos_id is not None else 1))
            top_scores, flat = candidates.topk(k)
            origin, token = flat // V, flat % V
            keep = []
            for rank in range(k):
                if eos_id is not None and int(token[rank]) == eos_id:
                    if rank < beam_width:  # a finished beam must have beaten the live ones
                        finished.append((beams[origin[rank]].tolist() + [eos_id], float(top_scores[rank])))
                    continue
                keep.append(rank)
                if len(keep) == beam_width:
                    break
            if not keep:
                beams = beams[:0]
                break
            keep_t = torch.tensor(keep, device=device)
            parents = origin[keep_t]
            beams = torch.cat([beams[parents], token[keep_t, None]], dim=1)  # (W_live, n + 1)
            scores = top_scores[keep_t]
            if cache is not None:
                # each surviving beam inherits its parent's keys and values
                cache.k = cache.k.index_select(1, parents)  # (N, W_live, H, block, hs)
                cache.v = cache.v.index_select(1, parents)
    finally:
        model.train(was_training)

    finished += [(row.tolist(), float(s)) for row, s in zip(beams, scores)]
    finished.sort(key=lambda pair: _length_normalised(pair[1], len(pair[0]) - T0, length_penalty), reverse=True)
    return finished[:n_best]


# --------------------------------------------------------------------------------------------
# Text in, text out
# --------------------------------------------------------------------------------------------


@dataclass
class GenerationResult:
    """What `generate` returns. `text` and `ids` are the first sample's continuation (the prompt
    is not repeated; an end-of-text token or stop string is not included)."""

    text: str
    ids: list[int]
    texts: list[str] = field(default_factory=list)  # every sample, in order
    all_ids: list[list[int]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)  # "length" | "eos" | "stop" per sample
    prompt_ids: list[int] = field(default_factory=list)  # as encoded, before any cropping
    prompt_cropped: bool = False  # the prompt was longer than the context; the model saw its tail
    logprobs: list[float] | None = None  # beam search: each sample's log-probability


def _ends_inside(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that could still grow into one of `stops`."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[-k:]):
                longest = k
                break
    return longest


class _Row:
    """One sample's continuation as it grows: its ids, its text, and whether and why it ended."""

    def __init__(self, tokenizer, eos_id: int | None, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.stops = list(stops)
        self.ids: list[int] = []
        self.reason: str | None = None  # None while running
        self._text: str | None = ""  # cached decode of self.ids; None when stale
        self._cut: int | None = None  # where a stop string begins

    def push(self, token: int) -> None:
        if self.reason is not None:
            return
        if self.eos_id is not None and token == self.eos_id:
            self.reason = "eos"
            return
        self.ids.append(token)
        self._text = None
        if self.stops:
            text = self.text
            hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
            if hits:
                # the text ends before the stop string; the ids keep the token that completed it
                self._cut = min(hits)
                self.reason = "stop"

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.tokenizer.decode(self.ids)
        return self._text if self._cut is None else self._text[: self._cut]

    def finish(self) -> None:
        if self.reason is None:
            self.reason = "length"


class IncrementalText:
    """Turns a growing list of token ids into printable pieces.

    Each call decodes the whole list and hands back only the new part that can no longer change:
    a trailing U+FFFD (bytes of a multi-byte character still to come) is held back, and so is a
    tail that may be the start of a stop string. `flush` hands back whatever is left.
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self.emitted = 0  # characters already handed out

    def piece(self, text: str, final: bool = False) -> str:
        stable = len(text)
        if not final:
            stable = len(text.rstrip("\ufffd"))
            stable -= _ends_inside(text[:stable], self.stops)
        if stable <= self.emitted:
            return ""
        out = text[self.emitted : stable]
        self.emitted = stable
        return out


def _encode_prompt(model: GPT, tokenizer, prompt: str) -> tuple[list[int], list[int], bool]:
    """(prompt ids as encoded, the ids the model starts from, whether they were cropped)."""
    ids = list(tokenizer.encode(prompt)) if prompt else []
    if not ids:
        bos = getattr(tokenizer, "bos_id", None)
        if bos is None:
            raise UserError("the prompt is empty and the tokenizer has no BOS token; give a prompt")
        ids = [bos]
    V = model.config.vocab_size
    bad = sorted({i for i in ids if not 0 <= i < V})
    if bad:
        raise UserError(
            f"the tokenizer produced ids {bad[:5]} outside the model's vocabulary (vocab_size={V}); "
            "use the tokenizer the model was trained with"
        )
    block = model.config.block_size
    cropped = len(ids) > block
    if cropped:
        warnings.warn(
            f"the prompt has {len(ids)} tokens but the model's context is {block}; "
            f"only its last {block} tokens are used",
            stacklevel=3,
        )
    return ids, ids[-block:] if cropped else ids, cropped


def _sampling_kwargs(options: dict) -> dict:
    return {k: options[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "greedy")}


def _run_rows(
    model: GPT, tokenizer, start_ids: list[int], num_samples: int, stop: Sequence[str] | None,
    seed: int | None, use_cache: bool, max_new_tokens: int, sampling: dict,
    dtype: torch.dtype | str | None = None,
) -> Iterator[list[_Row]]:
    """Sample `num_samples` continuations of one prompt in one batch; yield the rows after
    every step, and once more after they are all finished."""
    device, _ = _model_device_dtype(model)
    eos_id = getattr(tokenizer, "eos_id", None)
    rows = [_Row(tokenizer, eos_id, [s for s in (stop or []) if s]) for _ in range(num_samples)]
    idx = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)  # (S, T0)
    generator = make_generator(seed, device)
    tokens = iter_tokens(model, idx, max_new_tokens=max_new_tokens, generator=generator, use_cache=use_cache,
                         dtype=dtype, **sampling)
    try:
        for next_ids, _ in tokens:
            for row, token in zip(rows, next_ids.tolist()):
                row.push(token)
            if all(row.reason is not None for row in rows):
                break
            yield rows
    finally:
        tokens.close()  # puts the model back in its former train/eval mode now, not at GC
    for row in rows:
        row.finish()
    yield rows


def _check_generate_options(num_samples: int, beams: int, max_new_tokens: int, sampling: dict) -> None:
    check_sampling_options(max_new_tokens=max_new_tokens, **{k: v for k, v in sampling.items() if k != "greedy"})
    if isinstance(num_samples, bool) or not isinstance(num_samples, Integral) or num_samples < 1:
        raise ConfigError("num_samples", f"must be a whole number >= 1, got {num_samples!r}")
    if isinstance(beams, bool) or not isinstance(beams, Integral) or beams < 1:
        raise ConfigError("beams", f"must be a whole number >= 1, got {beams!r}")
    if beams > 1 and num_samples > beams:
        raise ConfigError("num_samples", f"beam search returns at most --beams={beams} sequences, asked for {num_samples}")


def generate(
    model: GPT,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    use_cache: bool = True,
    num_samples: int = 1,
    beams: int = 1,
    length_penalty: float = 1.0,
    dtype: torch.dtype | str | None = None,
) -> GenerationResult:
    """Continue `prompt`; return the continuation's text and ids (see GenerationResult).

    Stops at the tokenizer's end-of-text token (eos_id), at the first of the `stop` strings (cut
    off before it), or after max_new_tokens. An empty prompt starts from BOS; a prompt longer than
    the context is cropped to its last block_size tokens with a warning. num_samples > 1 draws
    that many continuations in one batch. beams > 1 runs beam search and returns its
    num_samples best sequences (sampling options do not apply there). dtype (e.g. "bfloat16")
    decodes with a copy of the weights cast to it: half the bytes to read per token in bfloat16,
    at bfloat16's precision (see `decoding_model`).
    """
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repetition_penalty=repetition_penalty, greedy=greedy)
    _check_generate_options(num_samples, beams, max_new_tokens, sampling)
    prompt_ids, start_ids, cropped = _encode_prompt(model, tokenizer, prompt)
    stops = [s for s in (stop or []) if s]
    logprobs = None
    if beams > 1:
        eos_id = getattr(tokenizer, "eos_id", None)
        best = beam_search(
            model, torch.tensor(start_ids), beams, max_new_tokens, length_penalty, n_best=num_samples,
            eos_id=eos_id, use_cache=use_cache, dtype=dtype,
        )
        rows = []
        for ids, _ in best:
            row = _Row(tokenizer, eos_id, stops)
            for token in ids[len(start_ids) :]:
                row.push(token)
            row.finish()
            rows.append(row)
        logprobs = [lp for _, lp in best]
    else:
        for rows in _run_rows(model, tokenizer, start_ids, num_samples, stops, seed, use_cache, max_new_tokens, sampling,
                              dtype):
            pass
    texts = [row.text for row in rows]
    all_ids = [row.ids for row in rows]
    return GenerationResult(
        text=texts[0], ids=all_ids[0], texts=texts, all_ids=all_ids,
        finish_reasons=[row.reason for row in rows], prompt_ids=prompt_ids, prompt_cropped=cropped,
        logprobs=logprobs,
    )


def stream(
    model: GPT,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    greedy: bool = False,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    use_cache: bool = True,
    dtype: torch.dtype | str | None = None,
) -> Iterator[str]:
    """Like `generate` for one sample, but yield the text in pieces as soon as they are printable.

    The pieces join to exactly `generate(...).text` with the same options and seed. A multi-byte
    character split across tokens is held back until complete, and a tail that might begin a
    stop string until it is clear whether it does.
    """
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repetition_penalty=repetition_penalty, greedy=greedy)
    # Checked and encoded now, not at the first next(): errors and the crop warning come
    # before the caller prints anything.
    _check_generate_options(1, 1, max_new_tokens, sampling)
    _, start_ids, _ = _encode_prompt(model, tokenizer, prompt)
    stops = [s for s in (stop or []) if s]
    rows = _run_rows(model, tokenizer, start_ids, 1, stops, seed, use_cache, max_new_tokens, sampling, dtype)
    return _printable_pieces(rows, IncrementalText(stops))


def _printable_pieces(rows: Iterator[list[_Row]], printer: IncrementalText) -> Iterator[str]:
    row = None
    for (row,) in rows:
        piece = printer.piece(row.text, final=row.reason is not None)
        if piece:
            yield piece
    if row is not None:
        piece = printer.piece(row.text, final=True)
        if piece:
            yield piece

"""The decoding copy of a model: the same network, laid out for one row at a time.

On CPU a decoding step is limited by reading the weights from memory (one row meets every
matrix), so the steps run on a decoding copy of the model (`decoding_model`): its matrices packed
once in the layout the CPU reads fastest, optionally in bfloat16 (`dtype=`), half the bytes.
Where scratchlm.kernels builds, a one-token step of a pre-norm model is one call to compiled code
(scratchlm.kernels.decode_step) instead of a few hundred torch operations, and several greedy
steps can go in one call. A `Decoder` holds the two together: the model a step runs (the model
itself or its copy) and the copy's compiled step; `decoder_for` builds one per model and dtype
and keeps it while the model's weights stay as they were.

Imports run one way: scratchlm.generation.engine -> here -> the compiled kernels (scratchlm.kernels,
scratchlm.kernels.decode_step) and the model (scratchlm.model.gpt); the training copy beside it is
scratchlm.kernels.training_copy.
"""

from __future__ import annotations

import copy
import functools
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from scratchlm.errors import ConfigError
from scratchlm.kernels import cpu_kernels
from scratchlm.kernels.decode_step import FusedDecodeStep, KernelLinear
from scratchlm.kernels.training_copy import take_over_attention
from scratchlm.model.gpt import GPT, CausalSelfAttention, KVCache
from scratchlm.model.lora import has_lora, merge_lora
from scratchlm.model.variants import BOTH, supports


def _default_layout(dtype: torch.dtype) -> str:
    if cpu_kernels() is not None:
        return "kernel"
    if dtype != torch.bfloat16:
        return "in_out"
    return "packed" if mkldnn_packing_available() else "in_out"


@functools.lru_cache(maxsize=1)
def mkldnn_packing_available() -> bool:
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


class DecodingLinear(KernelLinear):
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

    def __init__(self, attn: CausalSelfAttention, kernel):
        """Takes over attn's submodules and settings (attn is the decoding copy's own, so nothing
        is shared with the model)."""
        take_over_attention(self, attn)
        self.kernel = kernel

    def forward(self, x, rope=None, allowed=None, kv_cache=None, weights_out=None) -> torch.Tensor:
        if (x.shape[1] != 1 or kv_cache is None or rope is not None or allowed is not None
                or weights_out is not None or self.training or x.dtype != torch.float32
                or any(t.dtype != torch.float32 or not t.is_contiguous() for t in (kv_cache.k, kv_cache.v))):
            return super().forward(x, rope, allowed, kv_cache, weights_out)
        qkv = self.c_attn(x).contiguous()  # (B, 1, 3C)
        y = self.kernel.attend_one(qkv, kv_cache.k[self.layer], kv_cache.v[self.layer], kv_cache.length,
                                   self.n_head)  # (B, 1, C)
        return self.resid_dropout(self.c_proj(y))


# DecodingLinear computes any Linear; DecodingAttention's one-position step is the plain causal
# attention of q, k and v (RoPE, when there is one, goes through the model's own code)
DECODING_COPY = supports("the decoding copy", pos_embedding=("learned", "sinusoidal", "rope", "none"),
                         norm=("layernorm", "rmsnorm"), activation=("relu", "gelu", "gelu_tanh", "swiglu"),
                         norm_position=("pre", "post"), final_norm=BOTH, tie_weights=BOTH, qkv_bias=BOTH,
                         proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=(False,))


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
    (see `Decoder`).
    Elsewhere (GPU) the copy is simply cast to `dtype`. The copy shares no storage with `model`:
    in float32 it computes the same numbers to rounding; in bfloat16 to bfloat16's precision
    (about 3 significant digits).
    The Engine (scratchlm.generation.engine) builds one and reuses it while the weights stay
    unchanged (see `decoder_for`).
    """
    if has_lora(model):  # its fast paths read each weight by itself: they read the merged one
        model = merge_lora(model)
    dtype = _as_dtype(dtype, model)
    device, own_dtype = _model_device_dtype(model)
    if (device.type != "cpu" or dtype not in DECODE_DTYPES or own_dtype not in DECODE_DTYPES
            or not DECODING_COPY.takes(model.config)):  # a variant it does not list: the model's own code
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
                block.attn = DecodingAttention(block.attn, kernel)
    return fast.eval().requires_grad_(False)


DECODE_DTYPES = (torch.float32, torch.bfloat16)


def auto_decoding_dtype(device: torch.device) -> torch.dtype:
    """What `dtype="auto"` decodes in: bfloat16 weights where reading them is fast, a CUDA GPU
    that supports them, or a CPU whose decoding kernels have a vectorised bfloat16 loop (every
    loop but the portable one: decoding is memory-bound there, and half the bytes is about twice
    the tokens) or whose matmuls are bfloat16-native; else float32."""
    from scratchlm.machine import cpu

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


class Decoder:
    """A model as the decoding loops run it: `model`, the model itself or its decoding copy, and
    `step`, the copy's compiled one-token step (scratchlm.kernels.decode_step) where it covers the
    copy, else None. `signature` names the weights the copy was made from (None: no copy).

    `Decoder.build(model, dtype)` makes the copy and its step; `Decoder(model)` decodes with the
    model as it is. An Engine (and every generation function) takes a Decoder where it takes a
    model, and then uses it as it is."""

    def __init__(self, model: GPT, step: FusedDecodeStep | None = None, signature: tuple | None = None):
        self.model = model
        self._step = step
        self.signature = signature

    @classmethod
    def build(cls, model: GPT, dtype: torch.dtype | str | None = None, layout: str | None = None) -> "Decoder":
        """The decoding copy of `model` (see `decoding_model`) with its compiled step."""
        fast = decoding_model(model, dtype, layout)
        step = FusedDecodeStep.build(fast, cpu_kernels()) if _model_device_dtype(fast)[0].type == "cpu" else None
        return cls(fast, step, _weights_signature(model))

    @property
    def step(self) -> FusedDecodeStep | None:
        """The compiled step, or None: none was built, or the copy was converted after it was
        (.double(), .to(device)), so its addresses are stale and the step is dropped for good."""
        if self._step is not None and not self._step.describes(self.model):
            self._step = None
        return self._step

    @property
    def device_dtype(self) -> tuple[torch.device, torch.dtype]:
        """Where the activations and the KV cache live, and in which dtype."""
        return _model_device_dtype(self.model)

    def last_logits(self, idx: torch.Tensor, kv_cache: KVCache | None = None) -> torch.Tensor:
        """ids (B, T) -> scores of the next token (B, V), at least float32. Only the last position
        reaches lm_head: the same numbers as model(idx)[0][:, -1], without a (T, C) x (C, V)
        product thrown away. The compiled step gets the calls it takes: one new token per
        sequence, or a prompt of at most its `max_prompt` rows (16) in all."""
        step = self.step if kv_cache is not None else None
        logits = step(idx, kv_cache) if step is not None else None  # None: not a call it takes
        if logits is not None:
            return logits
        hidden = self.model.forward_hidden(idx, kv_cache=kv_cache)  # (B, T, C)
        logits = self.model.lm_head(hidden[:, -1, :])  # (B, V)
        return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()

    def greedy_steps(self, last: torch.Tensor, steps: int, kv_cache: KVCache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`steps` greedy steps in one call of the compiled step, from last (B, 1), the newest
        token of each sequence: (ids (steps, B), logits (steps, B, V)), the same as that many
        rounds of last_logits and greedy_ids. None when there is no step, or it declines (the
        cache is then untouched)."""
        step = self.step
        return None if step is None else step.greedy(last, steps, kv_cache)


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> {dtype: Decoder}: the last decoding copy built per model and dtype."""


def _weights_signature(model: GPT) -> tuple:
    # Any in-place change to a parameter (an optimizer step, load_state_dict, copy_) bumps its
    # version counter; a replaced tensor has a new address. Either makes the old copy stale.
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def decoder_for(model: "GPT | Decoder", steps: int, dtype: torch.dtype | str | None) -> Decoder:
    """The Decoder that `steps` steps in `dtype` run: a Decoder given is used as it is; the model
    itself when it will do (same dtype, and not on CPU or too few steps for a copy to pay for
    itself); else its decoding copy, built once and reused while the model's weights stay as
    they were."""
    if isinstance(model, Decoder):
        return model
    device, own_dtype = _model_device_dtype(model)
    dtype = _as_dtype(dtype, model)
    if dtype == own_dtype and (steps < 8 or device.type != "cpu"):
        return Decoder(model)
    signature = _weights_signature(model)
    copies = _DECODERS.setdefault(model, {})
    if dtype in copies and copies[dtype].signature == signature:
        return copies[dtype]
    copies.pop(dtype, None)  # free the stale copy before building the next
    copies[dtype] = Decoder.build(model, dtype)
    return copies[dtype]


def _model_device_dtype(model: GPT) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters())
    return param.device, param.dtype

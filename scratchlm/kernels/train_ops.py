"""Two training operations of the GPT in compiled code, forward and backward, for float32 on a CPU:
a layer's attention core (train_attention.c) and GELU (train_gelu.c: erf by Abramowitz and
Stegun's 7.1.26, within about 1e-7 |x| of the exact GELU, as close as float32 rounding gets).

At the baby models' shapes (context 64, width 128, heads of 32) a training step's matrix products
are about half its time, in the same library calls as any PyTorch model's; the other half is
small operations, their tensors and their calls. The attention core is about thirty of them each
way (split, views, RoPE's products and concatenation, SDPA, transpose back), and GELU's backward
computes erf and exp again. Here each is one call each way. How much that saves per step:
benchmarks/measurements.md; the step against the classic recipe: benchmarks/bench_time_to_loss.py.

`attention(qkv, rope, n_head)` and `gelu(x)` return None where the compiled code does not apply
(no compiler, SCRATCHLM_NO_KERNELS=1, not float32 on a CPU, a shape it does not cover, RoPE tables
that need a gradient, or while torch.compile traces, so that it compiles PyTorch's own operations
without a graph break); scratchlm.model.gpt then runs PyTorch's operations, which compute the same
function. The cheap tests come first: a GPU, bfloat16 or traced model never loads (or builds) the
library. `attention_unsupported` and `gelu_unsupported` say why. Neither supports a second
derivative, forward-mode AD or torch.func's transforms.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from scratchlm.kernels import CpuKernels, cpu_kernels


# train_attention.c's limits, known here so that a shape it does not cover never loads the library
# (tests/test_train_kernels.py checks them against the library's own)
ATTENTION_MAX_T = 256
ATTENTION_MAX_HS = 256
ATTENTION_HS_MULTIPLE = 16


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _plain_unsupported(x: torch.Tensor) -> str | None:
    """The tests that need no library: tracing, device, dtype."""
    if _compiling():
        return "inside torch.compile"
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return "not a float32 CPU tensor"
    return None


def attention_unsupported(qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, n_head: int,
                          kernels: CpuKernels | None) -> str | None:
    """Why `attention` would not run the compiled code for these inputs, or None when it would."""
    reason = _plain_unsupported(qkv) or _shape_unsupported(qkv, rope, n_head)
    if reason is None and kernels is None:
        return "no compiled kernels"
    return reason


def _shape_unsupported(qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                       n_head: int) -> str | None:
    if qkv.dim() != 3:
        return "not a (B, T, 3C) tensor"
    B, T, three_c = qkv.shape
    hs = three_c // 3 // n_head
    if three_c != 3 * n_head * hs:
        return "3C is not three heads' widths"
    if not 1 <= T <= ATTENTION_MAX_T:
        return f"T {T} outside 1..{ATTENTION_MAX_T}"
    if hs % ATTENTION_HS_MULTIPLE or hs > ATTENTION_MAX_HS:
        return f"head width {hs} not a multiple of {ATTENTION_HS_MULTIPLE} up to {ATTENTION_MAX_HS}"
    if rope is not None:
        if any(t.dtype != torch.float32 or t.device.type != "cpu" or tuple(t.shape) != (T, hs // 2) for t in rope):
            return "RoPE tables not float32 (T, hs/2) on the CPU"
        if any(t.requires_grad for t in rope):
            return "RoPE tables that need a gradient"
    return None


class _Attention(torch.autograd.Function):
    """qkv (B, T, 3C) -> (B, T, C): the causal attention of every head, RoPE on q and k when
    cos/sin are given. The forward keeps the attention weights (B, H, T, T rounded up to a multiple
    of 16) for the backward."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, n_head, kernels):
        B, T, three_c = qkv.shape
        C = three_c // 3
        hs = C // n_head
        qkv = qkv.contiguous()
        cos = None if cos is None else cos.contiguous()
        sin = None if sin is None else sin.contiguous()
        probs = torch.empty(B, n_head, T, kernels.lib.scratchlm_train_attention_row_stride(T), dtype=torch.float32)
        y = torch.empty(B, T, C, dtype=torch.float32)
        rc = kernels.lib.scratchlm_train_attention_forward(qkv.data_ptr(), _ptr(cos), _ptr(sin), probs.data_ptr(),
                                                           y.data_ptr(), B, T, n_head, hs, torch.get_num_threads())
        _check(rc, "attention forward")
        ctx.save_for_backward(qkv, cos, sin, probs)
        ctx.n_head, ctx.kernels = n_head, kernels
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        qkv, cos, sin, probs = ctx.saved_tensors
        B, T, three_c = qkv.shape
        hs = three_c // 3 // ctx.n_head
        dy = dy.contiguous()
        dqkv = torch.empty_like(qkv)
        rc = ctx.kernels.lib.scratchlm_train_attention_backward(qkv.data_ptr(), _ptr(cos), _ptr(sin),
                                                                probs.data_ptr(), dy.data_ptr(), dqkv.data_ptr(),
                                                                B, T, ctx.n_head, hs, torch.get_num_threads())
        _check(rc, "attention backward")
        return dqkv, None, None, None, None


def attention(qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, n_head: int,
              kernels: CpuKernels | None = None) -> torch.Tensor | None:
    """softmax(q k^T / sqrt(hs)) v under the causal mask, for every head of qkv (B, T, 3C), with q and
    k turned by RoPE's rope = (cos, sin), each (T, hs/2), when given: (B, T, C), the heads side by
    side, as CausalSelfAttention computes it between c_attn and c_proj; None where the compiled
    code does not apply (`attention_unsupported`). kernels: a loaded variant (default: cpu_kernels())."""
    if _plain_unsupported(qkv) is not None or _shape_unsupported(qkv, rope, n_head) is not None:
        return None
    kernels = kernels if kernels is not None else cpu_kernels()
    if kernels is None:  # the rest of attention_unsupported's checks passed above
        return None
    cos, sin = rope if rope is not None else (None, None)
    return _Attention.apply(qkv, cos, sin, n_head, kernels)


def gelu_unsupported(x: torch.Tensor, kernels: CpuKernels | None) -> str | None:
    """Why `gelu` would not run the compiled code for x, or None when it would."""
    reason = _plain_unsupported(x)
    if reason is None and kernels is None:
        return "no compiled kernels"
    return reason


class _Gelu(torch.autograd.Function):
    """x -> x Phi(x); the forward keeps the derivative, so the backward is one product."""

    @staticmethod
    def forward(ctx, x, kernels):
        x = x.contiguous()
        y, dydx = torch.empty_like(x), torch.empty_like(x)
        _check(kernels.lib.scratchlm_gelu_forward(x.data_ptr(), y.data_ptr(), dydx.data_ptr(), x.numel(),
                                                  torch.get_num_threads()), "gelu")
        ctx.save_for_backward(dydx)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (dydx,) = ctx.saved_tensors
        return dy * dydx, None


def gelu(x: torch.Tensor, kernels: CpuKernels | None = None) -> torch.Tensor | None:
    """GELU, x Phi(x) (F.gelu's default, within about 1e-7 |x|), of a float32 CPU tensor; None
    where the compiled code does not apply (`gelu_unsupported`)."""
    if _plain_unsupported(x) is not None:
        return None
    kernels = kernels if kernels is not None else cpu_kernels()
    if kernels is None:  # gelu_unsupported's other checks passed above
        return None
    return _Gelu.apply(x, kernels)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _check(rc: int, what: str) -> None:
    if rc == -1:
        raise MemoryError(f"{what}: out of memory")
    if rc != 0:
        raise ValueError(f"{what}: shapes the compiled kernel does not cover (code {rc})")

"""FLOPs: what a model costs per token, and what a device can do, for MFU.

One count serves `scratchlm inspect`, the training log's MFU and the benchmarks: every weight
that multiplies an activation (each Linear, lm_head included even when tied) costs 2 FLOPs per
token forward, attention's score and weighted-sum products 4 * n_layer * T * C more, and training
3 times the forward (the backward multiplies twice per forward matmul). The popular 6 N rule (N
without embeddings) is shown beside it by inspect, not used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scratchlm.machine.cpu import peak_flops_bound
from scratchlm.model.config import GPTConfig
from scratchlm.model.variants import BOTH, supports


# every tensor each variant adds or drops is counted by hand below: a value not here is not counted
PARAMETER_COUNT = supports("the parameter and FLOP count", pos_embedding=("learned", "sinusoidal", "rope", "none"),
                           norm=("layernorm", "rmsnorm"), activation=("relu", "gelu", "gelu_tanh", "swiglu"),
                           norm_position=("pre", "post"), final_norm=BOTH, tie_weights=BOTH, qkv_bias=BOTH,
                           proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=BOTH)


def count_params(cfg: GPTConfig) -> dict[str, int]:
    """Parameter counts from the config alone (no model is built, so seed-400m costs nothing).

    total: every parameter once; matmul: the weights that take part in a matrix multiply (every
    Linear weight, lm_head included even when tied), which is what the FLOP count needs;
    embeddings: the wte and wpe tables.
    """
    PARAMETER_COUNT.check(cfg)
    C, V, N, hidden = cfg.n_embd, cfg.vocab_size, cfg.n_layer, cfg.mlp_hidden
    proj_in = hidden // 2 if cfg.activation == "swiglu" else hidden
    norm = C if cfg.norm == "rmsnorm" else 2 * C  # gamma (and beta)
    kv = 2 * cfg.kv_heads * cfg.head_dim  # W_K and W_V's outputs: 2 C, or less with grouped-query attention
    attn = (C + kv) * C + C * C + ((C + kv) if cfg.qkv_bias else 0) + (C if cfg.proj_bias else 0)
    mlp = C * hidden + proj_in * C + ((hidden + C) if cfg.mlp_bias else 0)
    wpe = cfg.block_size * C if cfg.pos_embedding == "learned" else 0
    head = (0 if cfg.tie_weights else V * C) + (V if cfg.lm_head_bias else 0)
    total = V * C + wpe + N * (attn + mlp + 2 * norm) + (norm if cfg.final_norm else 0) + head
    matmul = N * ((C + kv) * C + C * C + C * hidden + proj_in * C) + V * C
    return dict(total=total, matmul=matmul, embeddings=V * C + wpe)


@dataclass
class FlopCount:
    """Matrix-multiply FLOPs (one multiply-add = 2 FLOPs) per token at context length T.

    forward  = 2 * N_matmul + 4 * n_layer * T * C
    training = 3 * forward   (the backward pass multiplies twice per forward matmul: once for the
                              gradient of the input, once for the gradient of the weight)

    N_matmul counts every weight that multiplies an activation (all Linear weights, lm_head
    included even when tied); embedding lookups, biases, norms and softmax are not matmuls and
    are left out, as FLOP counters do. The attention term: per token and layer, Q K^T costs 2 T C
    and weights @ V another 2 T C (over all heads), with the full T x T square counted: an upper
    bound, since the causal mask keeps only half of it. The C attention kernel
    (kernels/train_attention.c) visits only keys 0..i for query i, about half the square; the
    explicit PyTorch path computes the whole square and masks the upper half. six_n is the popular
    rule of thumb 6 N per token with N the non-embedding parameters, shown for comparison.
    """

    seq_len: int
    matmul_params: int
    forward_weights: int
    forward_attention: int
    forward: int
    training: int
    six_n: int


def flops_per_token(cfg: GPTConfig, seq_len: int | None = None) -> FlopCount:
    T = cfg.block_size if seq_len is None else seq_len
    counts = count_params(cfg)
    weights = 2 * counts["matmul"]
    attention = 4 * cfg.n_layer * T * cfg.n_embd
    forward = weights + attention
    non_embedding = counts["total"] - counts["embeddings"] + (cfg.vocab_size * cfg.n_embd if cfg.tie_weights else 0)
    return FlopCount(T, counts["matmul"], weights, attention, forward, 3 * forward, 6 * non_embedding)


def si_units(n: float) -> str:
    """A count in SI units with two decimals: 1.23 G, 456.00 M, 789 ."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} "


# Dense peak FLOP/s per GPU for (16-bit, 32-bit) matmuls; the 32-bit figure assumes TF32 is off.
_GPU_PEAKS = {
    "H200": (989e12, 67e12),
    "H100": (989e12, 67e12),
    "A100": (312e12, 19.5e12),
    "A10G": (125e12, 31.2e12),
    "A10": (125e12, 31.2e12),
    "L40S": (362e12, 91.6e12),
    "L4": (121e12, 30.3e12),
    "V100": (125e12, 15.7e12),
    "T4": (65e12, 8.1e12),
    "RTX 4090": (165e12, 82.6e12),
    "RTX 3090": (71e12, 35.6e12),
}


def device_peak(device: torch.device, dtype: str) -> tuple[float, str] | None:
    """(peak matmul FLOP/s of the device in `dtype`, where that figure comes from), or None where
    none is known. A GPU's dense datasheet figure; on a CPU an upper bound from its cores, highest
    clock and FLOPs per cycle (scratchlm.machine.cpu.peak_flops_bound), never a measurement, so that MFU is
    a share no run can exceed and two runs on one machine divide by the same number."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, (half, single) in _GPU_PEAKS.items():
            if key in name:
                return (half, f"{key} datasheet, 16-bit") if dtype != "float32" else (single, f"{key} datasheet, float32")
        return None
    if device.type != "cpu":
        return None
    return peak_flops_bound(dtype, torch.get_num_threads())

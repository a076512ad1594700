"""What one training step holds in memory: the activations autograd keeps for the backward pass,
listed tensor by tensor, and the weights, gradients and AdamW state beside them, in float32 or
bfloat16 autocast. scratchlm.machine.memory builds its training check on these figures, and
`scratchlm inspect` prints them (scratchlm.inside.introspect); the tests compare the list with what
autograd really saves.
"""

from __future__ import annotations

from dataclasses import dataclass

from scratchlm.machine.flops import count_params
from scratchlm.model.config import GPTConfig
from scratchlm.model.variants import BOTH, supports

# the tensors of each variant below are listed by hand: a value not here is not counted
SAVED_ACTIVATIONS = supports("the training memory estimate", pos_embedding=("learned", "sinusoidal", "rope", "none"),
                             norm=("layernorm", "rmsnorm"), activation=("relu", "gelu", "gelu_tanh", "swiglu"),
                             norm_position=("pre", "post"), final_norm=BOTH, tie_weights=BOTH, qkv_bias=BOTH,
                             proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=BOTH)

PRECISIONS = ("fp32", "bf16-mixed")
_DTYPE_BYTES = {"f32": 4, "i64": 8, "bool": 1}


def _attention_saves(cfg: GPTConfig, B: int, T: int, attention: str) -> list[tuple[str, int, str]]:
    """What one block's attention keeps, between c_attn's input and c_proj's (saved_activations)."""
    C, H, BT = cfg.n_embd, cfg.n_head, B * T
    block: list[tuple[str, int, str]] = []
    kv_width = cfg.kv_heads * cfg.head_dim  # C, or less with grouped-query attention
    if attention == "sdpa" and cfg.grouped_kv:  # SDPA keeps k and v repeated for every query head
        if cfg.pos_embedding == "rope":  # q after rope; nothing of c_attn's output is read again
            block.append(("q after rope", BT * C, "act"))
        else:
            block.append(("q, k, v (c_attn output)", BT * (C + 2 * kv_width), "act"))
        block.append(("k, v repeated for each query head", 2 * BT * C, "act"))
        if cfg.pos_embedding == "rope":
            block.append(("c_proj input (heads merged)", BT * C, "act"))
        block.append(("attention output", BT * C, "act"))
        block.append(("attention log-sum-exp", B * H * T, "f32"))
    elif attention == "sdpa":
        block.append(("q, k, v (c_attn output)", 3 * BT * C, "act"))
        if cfg.pos_embedding == "rope":
            block.append(("q, k after rope", 2 * BT * C, "act"))
            # a contiguous (B, H, T, hs) query gives an output in that layout, so c_proj's
            # input becomes a copy after transpose(1, 2).contiguous()
            block.append(("c_proj input (heads merged)", BT * C, "act"))
        block.append(("attention output", BT * C, "act"))
        block.append(("attention log-sum-exp", B * H * T, "f32"))
    elif attention == "compiled":  # one call each way; the weights kept, each row padded to 16 keys
        block.append(("q, k, v (c_attn output)", 3 * BT * C, "act"))
        block.append(("attention weights", B * H * T * (-(-T // 16) * 16), "act"))
        block.append(("attention output", BT * C, "act"))
    else:  # the explicit path keeps the whole (T, T) weight matrix of every head
        block.append(("q, k, v (contiguous copies; k and v repeated for each query head)", 3 * BT * C, "act"))
        block.append(("causal mask", T * T, "bool"))
        block.append(("attention weights", B * H * T * T, "act"))
        block.append(("c_proj input (heads merged)", BT * C, "act"))
    return block


def saved_activations(cfg: GPTConfig, batch_size: int, seq_len: int, attention: str = "sdpa") -> list[tuple[str, int, str]]:
    """The tensors autograd keeps from the forward pass for the backward pass, as
    (what, number of elements, kind). kind is `act` (matmul inputs and outputs: fp32, or bf16
    under autocast), `res` (the residual stream and norm inputs, fp32 in both precisions, since
    embeddings and master weights are fp32), `f32` (statistics kept in fp32: norm mean/rstd,
    attention log-sum-exp, log-probabilities), `i64` or `bool`.

    Derived op by op from what each backward formula needs (a Linear needs its input, ReLU its
    output, GELU its input and output, LayerNorm its input, mean and 1/std, ...), counting a
    tensor once however many ops keep it (e.g. q, k and v are views of one c_attn output). The
    list follows PyTorch's kernels on the CPU; the tests compare it with what autograd really
    saves. Dropout masks (dropout > 0) are not included. attention: "sdpa", "explicit", or
    "compiled" for the training copy (scratchlm.kernels.training_copy, attached by a CPU run's
    training) where scratchlm.kernels.train_ops applies (float32 on a CPU): its attention, with
    its GELU (which keeps as many numbers as PyTorch's).
    """
    SAVED_ACTIVATIONS.check(cfg)
    B, T, C, H, N, V = batch_size, seq_len, cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.vocab_size
    BT, hidden = B * T, cfg.mlp_hidden

    def norm_saves(where: str) -> list[tuple[str, int, str]]:
        rows = [(f"{where} input", BT * C, "res")]
        if cfg.norm == "layernorm":
            rows.append((f"{where} mean and 1/std", 2 * BT, "f32"))
        else:  # x * rsqrt(mean(x^2)) * gamma: the multiply by gamma keeps the normalised x
            rows += [(f"{where} 1/rms", BT, "f32"), (f"{where} normalised x", BT * C, "res")]
        return rows

    block: list[tuple[str, int, str]] = []
    block += norm_saves("norm 1")
    block.append(("c_attn input", BT * C, "act"))
    block += _attention_saves(cfg, B, T, attention)
    block += norm_saves("norm 2")
    block.append(("c_fc input", BT * C, "act"))
    if cfg.activation == "relu":
        block.append(("relu output", BT * hidden, "act"))
    elif cfg.activation == "gelu" and attention == "compiled":
        block.append(("gelu derivative and output", 2 * BT * hidden, "act"))
    elif cfg.activation in ("gelu", "gelu_tanh"):
        block.append(("gelu input and output", 2 * BT * hidden, "act"))
    else:
        block.append(("c_fc output, silu(gate), silu(gate) * value", 2 * BT * hidden, "act"))

    rows = [("ids", BT, "i64")]
    if cfg.pos_embedding == "learned":
        rows.append(("positions arange(T)", T, "i64"))
    if cfg.pos_embedding == "rope":
        rows.append(("rope cos and sin tables", cfg.block_size * cfg.head_dim, "f32"))
    rows += [(f"block {i}: {what}", n, kind) for i in range(N) for what, n, kind in block]
    if cfg.final_norm:  # else lm_head's input, below, is the last block's output
        rows += norm_saves("ln_f")
    rows += [("lm_head input", BT * C, "act"), ("log-probabilities", BT * V, "f32"), ("targets", BT, "i64"),
             ("loss weight", 1, "f32")]
    return rows


def _bytes(rows: list[tuple[str, int, str]], act_bytes: int) -> int:
    sizes = dict(_DTYPE_BYTES, act=act_bytes, res=4)
    return sum(n * sizes[kind] for _, n, kind in rows)


@dataclass
class MemoryEstimate:
    """Bytes for one training step with AdamW at (batch_size, seq_len) in one precision."""

    precision: str
    batch_size: int
    seq_len: int
    weights: int
    weight_copies: int  # bf16 copies of the matmul weights that autocast keeps during the step
    gradients: int
    adamw_state: int
    activations: int
    activations_checkpointed: int
    loss_temporaries: int  # gradients of the log-probabilities and of the logits, B*T*V each, during backward
    total: int = 0
    total_checkpointed: int = 0

    def __post_init__(self):
        fixed = self.weights + self.weight_copies + self.gradients + self.adamw_state + self.loss_temporaries
        self.total = fixed + self.activations
        self.total_checkpointed = fixed + self.activations_checkpointed


def memory_estimate(cfg: GPTConfig, batch_size: int, seq_len: int, precision: str = "fp32",
                    attention: str = "sdpa") -> MemoryEstimate:
    """Training memory: weights, gradients, AdamW's two moments, and the activations kept for the
    backward pass, with and without activation checkpointing.

    fp32: everything 4 bytes. bf16-mixed (torch.autocast with fp32 master weights): weights,
    gradients and AdamW state stay fp32, autocast adds a bf16 copy of each matmul weight, and
    matmul inputs/outputs are kept in bf16 (2 bytes); the residual stream and statistics stay fp32.
    With checkpointing only each block's input is kept; during the backward pass one block at a
    time is recomputed, so one block's activations come back on top.
    The loss adds two short-lived B*T*V buffers during backward (loss_temporaries, derived, not
    measured). Not included: the CUDA context, allocator slack, other short-lived buffers and
    torch.compile's workspace, so leave some headroom.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    act = 4 if precision == "fp32" else 2
    counts = count_params(cfg)
    rows = saved_activations(cfg, batch_size, seq_len, attention)
    full = _bytes(rows, act)
    one_block = _bytes([r for r in rows if r[0].startswith("block 0:")], act)
    block_inputs = cfg.n_layer * batch_size * seq_len * cfg.n_embd * 4  # the residual stream, fp32
    checkpointed = full - cfg.n_layer * one_block + block_inputs + one_block
    P = counts["total"]
    return MemoryEstimate(
        precision=precision,
        batch_size=batch_size,
        seq_len=seq_len,
        weights=4 * P,
        weight_copies=0 if precision == "fp32" else 2 * counts["matmul"],
        gradients=4 * P,
        adamw_state=2 * 4 * P,
        activations=full,
        activations_checkpointed=checkpointed,
        # the backward of log_softmax holds its incoming gradient (fp32) and writes the logits'
        # gradient (fp32, or bf16 after autocast's cast back): short-lived but at the peak
        loss_temporaries=batch_size * seq_len * cfg.vocab_size * (4 + act),
    )

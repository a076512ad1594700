"""A scratchlm model as one of the architectures llama.cpp runs: its hyperparameters and tensors.

    scratchlm                      llama.cpp `gpt2` / `gptneox`          llama.cpp `llama`
    transformer.wte                token_embd                           token_embd
    transformer.wpe (or the        position_embd (gpt2)                 -
      fixed table, or zeros)
    h.i.ln_1, ln_2                 blk.i.attn_norm, ffn_norm            blk.i.attn_norm, ffn_norm
    h.i.attn.c_attn: Q | K | V     blk.i.attn_qkv, the same rows        blk.i.attn_q, attn_k, attn_v,
                                                                          Q and K rows re-paired (below)
    h.i.attn.c_proj                blk.i.attn_output                    blk.i.attn_output
    h.i.mlp.c_fc                   blk.i.ffn_up                         blk.i.ffn_gate (first half),
                                                                          ffn_up (second half)
    h.i.mlp.c_proj                 blk.i.ffn_down                       blk.i.ffn_down
    transformer.ln_f, lm_head      output_norm, output                  output_norm, output

A GGUF matrix is stored as torch's nn.Linear holds it, (out, in), so nothing is transposed.
RoPE: scratchlm turns dimension i of a head with dimension i + hs/2 ("rotate half"), as llama.cpp's
`gptneox` does; its `llama` turns neighbours 2i and 2i + 1, so for `llama` the rows of Q and K are
reordered within each head (row i goes to 2i, row i + hs/2 to 2i + 1). Q.K is a sum over the
same pairs either way, so attention is unchanged. Every bias `gpt2` and `gptneox` expect and the
model switched off is written as zeros; `llama` takes each bias it has or not. An lm_head bias
is folded into the final norm's bias where that is exact (scratchlm.hf.hf_rotary.drop_zero_head_bias),
and refused otherwise. Rows of a vocabulary padded past the tokenizer's size are left out (no
text maps to them, and scratchlm's generation never picks them either).
"""

from __future__ import annotations

from typing import Any

import torch

from scratchlm.errors import UserError
from scratchlm.hf import hf_rotary
from scratchlm.hf.interop import position_table
from scratchlm.model.config import GPTConfig
from scratchlm.model.variants import BOTH, supports

LLAMA_CPP_ARCH = {"gpt2": "gpt2", "gpt_neox": "gptneox", "llama": "llama"}
# what each llama.cpp graph computes as scratchlm does (its gpt2 and gptneox graphs apply GELU's
# tanh form whatever a file says: relu is refused there, exact gelu is close enough and noted)
GGUF_ARCHITECTURES = {
    "gpt2": supports("the GGUF gpt2 export", pos_embedding=("learned", "sinusoidal", "none"), norm=("layernorm",),
                     activation=("gelu", "gelu_tanh"), norm_position=("pre",), final_norm=(True,), tie_weights=BOTH,
                     qkv_bias=BOTH, proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=(False,)),
    "gptneox": supports("the GGUF gptneox export", pos_embedding=("rope",), norm=("layernorm",),
                        activation=("gelu", "gelu_tanh"), norm_position=("pre",), final_norm=(True,), tie_weights=BOTH,
                        qkv_bias=BOTH, proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=(False,)),
    "llama": supports("the GGUF llama export", pos_embedding=("rope",), norm=("rmsnorm",), activation=("swiglu",),
                      norm_position=("pre",), final_norm=(True,), tie_weights=BOTH, qkv_bias=BOTH, proj_bias=BOTH,
                      mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=BOTH),
}


def gguf_arch(config: GPTConfig) -> str:
    """`gpt2`, `gptneox` or `llama`: the llama.cpp architecture that computes what `config` does;
    a UserError naming the field and the flags that would do when none does."""
    arch = LLAMA_CPP_ARCH[hf_rotary.architecture(config, target="llama.cpp")]
    if arch != "llama" and config.activation == "relu":
        raise UserError(f"activation: 'relu' cannot run in llama.cpp: its {arch} graph applies GELU whatever the file "
                        "says, so the model would compute something else; train with --activation gelu_tanh, or in "
                        "the Llama layout (--pos_embedding rope --norm rmsnorm --activation swiglu)")
    GGUF_ARCHITECTURES[arch].check(config)
    return arch


def write_hparams(writer: Any, config: GPTConfig, arch: str, n_vocab: int) -> None:
    """The architecture's keys (`<arch>.context_length`, ...) on a gguf.GGUFWriter."""
    writer.add_context_length(config.block_size)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_feed_forward_length(config.mlp_hidden // 2 if arch == "llama" else config.mlp_hidden)
    writer.add_head_count(config.n_head)
    if arch == "llama":
        writer.add_head_count_kv(config.kv_heads)  # fewer than n_head under grouped-query attention
        writer.add_layer_norm_rms_eps(config.norm_eps)
        writer.add_vocab_size(n_vocab)
    else:
        writer.add_layer_norm_eps(config.norm_eps)
    if arch != "gpt2":
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_rope_freq_base(config.rope_theta)
    if arch == "gptneox":
        writer.add_parallel_residual(False)  # scratchlm's blocks run attention, then the MLP


# llama.cpp's CPU backend looks these two up by row (get_rows); every other matrix is the left
# side of a matrix product, and the token table is one too where the file has no output.weight:
# llama.cpp then loads it a second time as the head (llama-model-loader.cpp, TENSOR_DUPLICATED).
LOOKUP_TABLES = ("token_embd.weight", "position_embd.weight")


def product_weights(tensors: dict[str, torch.Tensor]) -> set[str]:
    """The names of the matrices llama.cpp multiplies by."""
    products = {name for name, value in tensors.items() if value.ndim == 2 and name not in LOOKUP_TABLES}
    if "output.weight" not in tensors:
        products.add("token_embd.weight")
    return products


def amx_takes(shape: tuple[int, ...], product: bool) -> bool:
    """Whether llama.cpp's AMX kernels would multiply by a q8_0 matrix of torch shape (out, in).

    A llama.cpp built for a CPU with AMX-INT8 (Intel Xeon 4th generation and later) puts a
    quantized weight in its AMX buffer and multiplies by it with tile instructions when the
    product's output width (the matrix's rows) is a multiple of 2 x TILE_N = 32 and its input
    width a multiple of TILE_K = 32 (ggml-cpu/amx/amx.cpp, extra_buffer_type::supports_op, in
    llama-cpp-python 0.3.36). Those kernels crashed on a prompt of 8 or more tokens there."""
    return product and len(shape) == 2 and shape[0] % 32 == 0 and shape[1] % 32 == 0


def rope_pairs_adjacent(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """Q or K rows (or their bias) of all heads, each head's rows i and i + hs/2 moved to 2i and 2i + 1."""
    head = rows.shape[0] // n_head
    return rows.reshape(n_head, 2, head // 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def gguf_tensors(model: Any, arch: str, n_vocab: int) -> dict[str, torch.Tensor]:
    """The model's weights under llama.cpp's names for `arch` (float32, on CPU, new tensors);
    only the first n_vocab rows of the embedding and the head."""
    cfg = model.config
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    for name in ("transformer.wte.weight", "lm_head.weight", "lm_head.bias"):
        if name in state:
            state[name] = state[name][:n_vocab]
    hf_rotary.drop_zero_head_bias(state, arch)
    C = cfg.n_embd
    out = {"token_embd.weight": state["transformer.wte.weight"]}
    if arch == "gpt2":
        out["position_embd.weight"] = position_table(model).float()

    def put(gguf_name: str, ours: str, width: int | None = None) -> None:
        """state[ours] under gguf_name; zeros of `width` when the model has none (else skipped)."""
        if ours in state:
            out[gguf_name] = state[ours]
        elif width is not None:
            out[gguf_name] = torch.zeros(width)

    fixed = arch != "llama"  # gpt2 and gptneox want every bias; llama takes those there are
    for i in range(cfg.n_layer):
        src, dst = f"transformer.h.{i}.", f"blk.{i}."
        for ours, theirs in (("ln_1", "attn_norm"), ("ln_2", "ffn_norm")):
            put(dst + f"{theirs}.weight", src + f"{ours}.weight")
            put(dst + f"{theirs}.bias", src + f"{ours}.bias")
        put(dst + "attn_output.weight", src + "attn.c_proj.weight")
        put(dst + "attn_output.bias", src + "attn.c_proj.bias", C if fixed else None)
        put(dst + "ffn_down.weight", src + "mlp.c_proj.weight")
        put(dst + "ffn_down.bias", src + "mlp.c_proj.bias", C if fixed else None)
        if fixed:
            put(dst + "attn_qkv.weight", src + "attn.c_attn.weight")
            put(dst + "attn_qkv.bias", src + "attn.c_attn.bias", 3 * C)
            put(dst + "ffn_up.weight", src + "mlp.c_fc.weight")
            put(dst + "ffn_up.bias", src + "mlp.c_fc.bias", cfg.mlp_hidden)
            continue
        for part in ("weight", "bias"):
            if src + f"attn.c_attn.{part}" in state:
                kv = cfg.kv_heads * cfg.head_dim  # C, or less with grouped-query attention
                q, k, v = state[src + f"attn.c_attn.{part}"].split((C, kv, kv))
                out[dst + f"attn_q.{part}"] = rope_pairs_adjacent(q, cfg.n_head)
                out[dst + f"attn_k.{part}"] = rope_pairs_adjacent(k, cfg.kv_heads)
                out[dst + f"attn_v.{part}"] = v
            if src + f"mlp.c_fc.{part}" in state:
                gate, up = state[src + f"mlp.c_fc.{part}"].chunk(2)
                out[dst + f"ffn_gate.{part}"], out[dst + f"ffn_up.{part}"] = gate, up
    put("output_norm.weight", "transformer.ln_f.weight")
    put("output_norm.bias", "transformer.ln_f.bias")
    if not cfg.tie_weights or arch == "gptneox":  # gptneox has no tie: it reads a head of its own
        out["output.weight"] = state["lm_head.weight"] if "lm_head.weight" in state else state["transformer.wte.weight"]
    return {k: v.contiguous().clone() for k, v in out.items()}

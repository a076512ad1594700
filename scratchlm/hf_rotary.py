"""Rotary models out to Hugging Face: GPT-NeoX (RoPE, LayerNorm, GELU or ReLU) and Llama (RoPE,
RMSNorm, SwiGLU), the two transformers architectures that compute what such a scratchlm model
computes (scratchlm.interop handles GPT-2, for added position vectors).

Both rotate Q and K the way scratchlm.model.apply_rope does, "rotate half": pair i of a head is
dimension i and i + hs/2, turned by pos * theta^(-2i/hs), so no weight needs permuting. What
differs is only where the weights sit:

    scratchlm                      GPT-NeoX                                  Llama
    transformer.wte                gpt_neox.embed_in                         model.embed_tokens
    h.i.ln_1 / ln_2                layers.i.input_layernorm /                layers.i.input_layernorm /
                                   post_attention_layernorm                  post_attention_layernorm
    h.i.attn.c_attn (3C, C):       layers.i.attention.query_key_value,       self_attn.q_proj, k_proj,
      rows Q | K | V, each           rows per head: [q_h | k_h | v_h] for      v_proj: the three thirds
      split into heads               h = 0..H-1 (interleaved)
    h.i.attn.c_proj                layers.i.attention.dense                  self_attn.o_proj
    h.i.mlp.c_fc (I, C)            layers.i.mlp.dense_h_to_4h                mlp.gate_proj (first half),
                                                                             mlp.up_proj (second half)
    h.i.mlp.c_proj                 layers.i.mlp.dense_4h_to_h                mlp.down_proj
    transformer.ln_f, lm_head      gpt_neox.final_layer_norm, embed_out      model.norm, lm_head

GPT-NeoX runs its blocks sequentially (use_parallel_residual false), as pre-norm scratchlm
blocks do. A bias scratchlm switched off is written as zeros where the architecture has one.
"""

from __future__ import annotations

from typing import Any

import torch

from scratchlm.config import GPTConfig
from scratchlm.errors import UserError

NEOX_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def architecture(config: GPTConfig) -> str:
    """`gpt2`, `gpt_neox` or `llama`: the transformers architecture that computes what `config`
    computes; a UserError naming the fields (and the flags that would do) when none does."""
    if config.norm_position != "pre":
        raise UserError("norm_position: 'post' blocks have no transformers architecture to export to; "
                        "train with --norm_position pre")
    neox_mlp = config.activation in NEOX_ACTIVATIONS
    if config.pos_embedding != "rope":
        if config.norm == "layernorm" and neox_mlp:
            return "gpt2"
        field = "norm" if config.norm != "layernorm" else "activation"
        raise UserError(f"{field}: {getattr(config, field)!r} with {config.pos_embedding} positions has no transformers "
                        "architecture to export to; GPT-2 wants --norm layernorm with --activation gelu, gelu_tanh "
                        "or relu, Llama --pos_embedding rope --norm rmsnorm --activation swiglu")
    if config.norm == "layernorm" and neox_mlp:
        return "gpt_neox"
    if config.norm == "rmsnorm" and config.activation == "swiglu":
        return "llama"
    field = "activation" if config.norm == "rmsnorm" else "norm"
    raise UserError(f"{field}: {getattr(config, field)!r} with rope and {config.norm} has no transformers architecture "
                    "to export to; GPT-NeoX wants --norm layernorm with --activation gelu, gelu_tanh or relu, "
                    "Llama --norm rmsnorm with --activation swiglu")


def _common(config: GPTConfig, bos_id: int | None, eos_id: int | None) -> dict[str, Any]:
    return {"vocab_size": config.vocab_size, "hidden_size": config.n_embd, "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head, "max_position_embeddings": config.block_size,
            "tie_word_embeddings": config.tie_weights, "bos_token_id": bos_id, "eos_token_id": eos_id,
            "use_cache": True, "dtype": "float32"}


def hf_config(config: GPTConfig, arch: str, bos_id: int | None = None, eos_id: int | None = None) -> dict[str, Any]:
    """config.json for `arch` (`gpt_neox` or `llama`)."""
    if arch == "gpt_neox":
        return {**_common(config, bos_id, eos_id), "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
                "intermediate_size": config.mlp_hidden, "hidden_act": NEOX_ACTIVATIONS[config.activation],
                "rotary_pct": 1.0, "rotary_emb_base": config.rope_theta,
                "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta,
                                    "partial_rotary_factor": 1.0},
                "layer_norm_eps": config.norm_eps, "use_parallel_residual": False, "attention_bias": True,
                "hidden_dropout": 0.0, "attention_dropout": 0.0, "classifier_dropout": 0.0}
    return {**_common(config, bos_id, eos_id), "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "intermediate_size": config.mlp_hidden // 2, "hidden_act": "silu", "num_key_value_heads": config.n_head,
            "head_dim": config.head_dim, "rms_norm_eps": config.norm_eps, "rope_theta": config.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "attention_bias": config.qkv_bias or config.proj_bias, "mlp_bias": config.mlp_bias,
            "attention_dropout": 0.0, "pretraining_tp": 1}


def hf_state_dict(model, arch: str) -> dict[str, torch.Tensor]:
    """The model's weights under `arch`'s names and layouts (new contiguous CPU tensors)."""
    cfg = model.config
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    head_bias = state.pop("lm_head.bias", None)
    if head_bias is not None and torch.count_nonzero(head_bias) > 0:
        raise UserError(f"lm_head_bias: the model's lm_head has a nonzero bias, which {arch}'s head lacks; train "
                        "with --lm_head_bias false to export it")
    C, H, hs, dtype = cfg.n_embd, cfg.n_head, cfg.head_dim, state["transformer.wte.weight"].dtype

    def bias(name: str, width: int) -> torch.Tensor:
        return state.get(name, torch.zeros(width, dtype=dtype))

    neox = arch == "gpt_neox"
    root, layers = ("gpt_neox.", "gpt_neox.layers.") if neox else ("model.", "model.layers.")
    out = {root + ("embed_in.weight" if neox else "embed_tokens.weight"): state["transformer.wte.weight"]}
    for i in range(cfg.n_layer):
        src, dst = f"transformer.h.{i}.", f"{layers}{i}."
        for ours, theirs in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
            for part in ("weight", "bias"):
                if src + f"{ours}.{part}" in state:
                    out[dst + f"{theirs}.{part}"] = state[src + f"{ours}.{part}"]
        qkv_w, qkv_b = state[src + "attn.c_attn.weight"], bias(src + "attn.c_attn.bias", 3 * C)
        proj_w, proj_b = state[src + "attn.c_proj.weight"], bias(src + "attn.c_proj.bias", C)
        fc_w, fc_b = state[src + "mlp.c_fc.weight"], bias(src + "mlp.c_fc.bias", cfg.mlp_hidden)
        down_w, down_b = state[src + "mlp.c_proj.weight"], bias(src + "mlp.c_proj.bias", C)
        if neox:
            # (3, H, hs, ...) -> (H, 3, hs, ...): each head's q, k and v rows side by side
            out[dst + "attention.query_key_value.weight"] = qkv_w.view(3, H, hs, C).transpose(0, 1).reshape(3 * C, C)
            out[dst + "attention.query_key_value.bias"] = qkv_b.view(3, H, hs).transpose(0, 1).reshape(3 * C)
            out[dst + "attention.dense.weight"], out[dst + "attention.dense.bias"] = proj_w, proj_b
            out[dst + "mlp.dense_h_to_4h.weight"], out[dst + "mlp.dense_h_to_4h.bias"] = fc_w, fc_b
            out[dst + "mlp.dense_4h_to_h.weight"], out[dst + "mlp.dense_4h_to_h.bias"] = down_w, down_b
            continue
        half = cfg.mlp_hidden // 2
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[dst + f"self_attn.{name}.weight"] = qkv_w[j * C : (j + 1) * C]
            if cfg.qkv_bias or cfg.proj_bias:
                out[dst + f"self_attn.{name}.bias"] = qkv_b[j * C : (j + 1) * C]
        out[dst + "self_attn.o_proj.weight"] = proj_w
        if cfg.qkv_bias or cfg.proj_bias:
            out[dst + "self_attn.o_proj.bias"] = proj_b
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = fc_w[:half], fc_w[half:]
        out[dst + "mlp.down_proj.weight"] = down_w
        if cfg.mlp_bias:
            out[dst + "mlp.gate_proj.bias"], out[dst + "mlp.up_proj.bias"] = fc_b[:half], fc_b[half:]
            out[dst + "mlp.down_proj.bias"] = down_b
    for part in ("weight", "bias"):
        if f"transformer.ln_f.{part}" in state:
            out[root + ("final_layer_norm." if neox else "norm.") + part] = state[f"transformer.ln_f.{part}"]
    if not cfg.tie_weights:
        out["embed_out.weight" if neox else "lm_head.weight"] = state["lm_head.weight"]
    return {k: v.contiguous().clone() for k, v in out.items()}

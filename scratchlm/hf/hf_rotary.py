"""Rotary models out to Hugging Face: GPT-NeoX (RoPE, LayerNorm, GELU or ReLU) and Llama (RoPE,
RMSNorm, SwiGLU), the two transformers architectures that compute what such a scratchlm model
computes (scratchlm.hf.interop handles GPT-2, for added position vectors).

Both rotate Q and K the way scratchlm.model.gpt.apply_rope does, "rotate half": pair i of a head is
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

from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.model.variants import BOTH, supports, variant_of

NEOX_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
NO_FINAL_NORM = ("final_norm: false (lm_head reads the last block's output, with no final norm) has no {target} "
                 "architecture to export to; GPT-2, GPT-NeoX and Llama all normalise before the head; train with "
                 "--final_norm")


GPT2 = supports("the Hugging Face GPT-2 export", pos_embedding=("learned", "sinusoidal", "none"), norm=("layernorm",),
                activation=("relu", "gelu", "gelu_tanh"), norm_position=("pre",), final_norm=(True,), tie_weights=BOTH,
                qkv_bias=BOTH, proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=(False,))
GPT_NEOX = supports("the Hugging Face GPT-NeoX export", pos_embedding=("rope",), norm=("layernorm",),
                    activation=("relu", "gelu", "gelu_tanh"), norm_position=("pre",), final_norm=(True,),
                    tie_weights=BOTH, qkv_bias=BOTH, proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH,
                    grouped_kv=(False,))
LLAMA = supports("the Hugging Face Llama export", pos_embedding=("rope",), norm=("rmsnorm",), activation=("swiglu",),
                 norm_position=("pre",), final_norm=(True,), tie_weights=BOTH, qkv_bias=BOTH, proj_bias=BOTH,
                 mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=BOTH)
ARCHITECTURES = {"gpt2": GPT2, "gpt_neox": GPT_NEOX, "llama": LLAMA}


def architecture(config: GPTConfig, target: str = "transformers") -> str:
    """`gpt2`, `gpt_neox` or `llama`: the transformers architecture whose allow-list (ARCHITECTURES)
    takes `config`; a UserError naming the fields (and the flags that would do) when none does, and
    `target` (transformers, llama.cpp: the same three) as what has none."""
    for name, supported in ARCHITECTURES.items():
        if supported.takes(config):
            return name
    raise UserError(_no_architecture(config, target))


def _no_architecture(config: GPTConfig, target: str) -> str:
    """Why no architecture takes `config`: no final norm, post-norm blocks, a value none of them
    lists, else the combination."""
    if not config.final_norm:
        return NO_FINAL_NORM.format(target=target)
    if config.norm_position != "pre":
        return f"norm_position: 'post' blocks have no {target} architecture to export to; train with --norm_position pre"
    for field, value in variant_of(config).items():
        if all(value not in supported.values.get(field, ()) for supported in ARCHITECTURES.values()):
            return (f"{field}: {value!r} has no {target} architecture to export to (GPT-2, GPT-NeoX and Llama take "
                    f"{', '.join(sorted({repr(v) for s in ARCHITECTURES.values() for v in s.values.get(field, ())}))})")
    if config.grouped_kv and not LLAMA.takes(config.replace(n_kv_head=None)) and LLAMA.takes(
            config.replace(n_kv_head=None, pos_embedding="rope", norm="rmsnorm", activation="swiglu")):
        return (f"n_kv_head: {config.n_kv_head} key/value heads for {config.n_head} query heads (grouped-query "
                f"attention) has a {target} architecture only in the Llama layout (--pos_embedding rope --norm "
                "rmsnorm --activation swiglu); GPT-2 and GPT-NeoX give every query head keys and values of its own")
    if config.pos_embedding != "rope":
        field = "norm" if config.norm != "layernorm" else "activation"
        return (f"{field}: {getattr(config, field)!r} with {config.pos_embedding} positions has no {target} "
                "architecture to export to; GPT-2 wants --norm layernorm with --activation gelu, gelu_tanh "
                "or relu, Llama --pos_embedding rope --norm rmsnorm --activation swiglu")
    field = "activation" if config.norm == "rmsnorm" else "norm"
    return (f"{field}: {getattr(config, field)!r} with rope and {config.norm} has no {target} architecture "
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
            "intermediate_size": config.mlp_hidden // 2, "hidden_act": "silu", "num_key_value_heads": config.kv_heads,
            "head_dim": config.head_dim, "rms_norm_eps": config.norm_eps, "rope_theta": config.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "attention_bias": config.qkv_bias or config.proj_bias, "mlp_bias": config.mlp_bias,
            "attention_dropout": 0.0, "pretraining_tp": 1}


def drop_zero_head_bias(state: dict[str, torch.Tensor], arch: str) -> None:
    """Take lm_head's bias out of `state`: no exported architecture has one. A bias of zeros just
    goes. Any other is folded into the final LayerNorm's bias where that computes the same
    logits: logits = W (gamma x_hat + beta) + b, and with W (V, C) of rank V (a vocabulary no
    larger than the width, as in the char presets) some delta solves W delta = b exactly, so
    beta + delta does b's work. Otherwise (RMSNorm has no beta; V > C leaves no room) it is refused."""
    head_bias = state.pop("lm_head.bias", None)
    if head_bias is None or torch.count_nonzero(head_bias) == 0:
        return
    beta = state.get("transformer.ln_f.bias")
    W = state.get("lm_head.weight", state.get("transformer.wte.weight"))
    if beta is not None and W.shape[0] <= W.shape[1]:
        W64, b64 = W.double(), head_bias.double()
        delta = torch.linalg.lstsq(W64, b64[:, None]).solution[:, 0]  # (C,): W delta = b
        folded = (beta.double() + delta).to(beta.dtype)
        error = (W64 @ (folded.double() - beta.double()) - b64).abs().max()
        if error <= 1e-5 * max(1.0, float(b64.abs().max())):
            state["transformer.ln_f.bias"] = folded  # a new tensor: the model's own stays as it is
            return
    raise UserError(f"lm_head_bias: the model's lm_head has a nonzero bias, which {arch}'s head lacks, and it cannot "
                    "be folded into the final norm's bias (that needs LayerNorm and a vocabulary no larger than "
                    "n_embd); it cannot be exported without changing the model's predictions; train with "
                    "--no-lm_head_bias to export it")


def qkv_w_rows(cfg: GPTConfig) -> int:
    """Rows of c_attn: C of queries, then keys and values of kv_heads heads each (3C without grouping)."""
    return cfg.n_embd + 2 * cfg.kv_heads * cfg.head_dim


def hf_state_dict(model, arch: str) -> dict[str, torch.Tensor]:
    """The model's weights under `arch`'s names and layouts (new contiguous CPU tensors)."""
    cfg = model.config
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    drop_zero_head_bias(state, arch)
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
        qkv_w, qkv_b = state[src + "attn.c_attn.weight"], bias(src + "attn.c_attn.bias", qkv_w_rows(cfg))
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
        kv = cfg.kv_heads * hs  # rows of k_proj and v_proj: C, or fewer with grouped-query attention
        for name, w, b in zip(("q_proj", "k_proj", "v_proj"), qkv_w.split((C, kv, kv)), qkv_b.split((C, kv, kv))):
            out[dst + f"self_attn.{name}.weight"] = w
            if cfg.qkv_bias or cfg.proj_bias:
                out[dst + f"self_attn.{name}.bias"] = b
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


# --------------------------------------------------------------------------------------------
# Import: Hugging Face -> scratchlm (the same table, read right to left)
# --------------------------------------------------------------------------------------------

IMPORTABLE = ("gpt_neox", "llama")
_NEOX_FROM_HF = {v: k for k, v in NEOX_ACTIVATIONS.items()}
_BUFFERS = ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")  # recomputed, not weights


def _rope_theta(hf: dict) -> float:
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling")
    kind = params.get("rope_type", (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")))
    if kind != "default":
        raise UserError(f"rope_scaling: {kind!r} stretches the rotations; scratchlm's RoPE is the plain one")
    return float(params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0))))


def config_from_hf(hf: dict) -> GPTConfig:
    """The GPTConfig of a GPT-NeoX or Llama config.json; a UserError naming the field it cannot
    follow (partial or scaled rotations, a parallel residual, ...); Llama's grouped K/V heads become
    n_kv_head."""
    arch, C, H = hf["model_type"], hf["hidden_size"], hf["num_attention_heads"]
    common = dict(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"], n_layer=hf["num_hidden_layers"],
                  n_head=H, n_embd=C, pos_embedding="rope", rope_theta=_rope_theta(hf), norm_position="pre",
                  tie_weights=bool(hf.get("tie_word_embeddings", False)), lm_head_bias=False,
                  dropout=0.0)
    if arch == "gpt_neox":
        rotary = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", hf.get("rotary_pct", 1.0))
        if float(rotary) != 1.0:
            raise UserError(f"rotary_pct: {rotary} rotates part of each head; scratchlm's RoPE rotates all of it")
        if hf.get("use_parallel_residual", True):
            raise UserError("use_parallel_residual: true adds attention and MLP to the same input; scratchlm's "
                            "blocks run them one after the other")
        if hf.get("hidden_act", "gelu") not in _NEOX_FROM_HF:
            raise UserError(f"hidden_act: {hf.get('hidden_act')!r} has no scratchlm equivalent")
        biased = bool(hf.get("attention_bias", True))
        return GPTConfig(**common, n_inner=hf["intermediate_size"], norm="layernorm",
                         norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
                         activation=_NEOX_FROM_HF[hf.get("hidden_act", "gelu")],
                         qkv_bias=biased, proj_bias=biased, mlp_bias=True)
    kv_heads = hf.get("num_key_value_heads") or H
    if H % kv_heads:
        raise UserError(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads = {H}")
    if hf.get("head_dim", C // H) != C // H:
        raise UserError(f"head_dim: {hf['head_dim']} is not hidden_size / num_attention_heads = {C // H}")
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"hidden_act: {hf['hidden_act']!r}; scratchlm's swiglu gates with silu")
    biased = bool(hf.get("attention_bias", False))
    return GPTConfig(**common, n_kv_head=None if kv_heads == H else kv_heads, n_inner=2 * hf["intermediate_size"],
                     norm="rmsnorm",
                     norm_eps=float(hf.get("rms_norm_eps", 1e-6)), activation="swiglu", qkv_bias=biased,
                     proj_bias=biased, mlp_bias=bool(hf.get("mlp_bias", False)))


def state_dict_from_hf(state: dict[str, torch.Tensor], config: GPTConfig, arch: str) -> dict[str, torch.Tensor]:
    """scratchlm's names and layouts for a GPT-NeoX or Llama state dict (see the module's table)."""
    state = {k: v for k, v in state.items() if not k.endswith(_BUFFERS)}
    C, H, hs = config.n_embd, config.n_head, config.head_dim
    neox = arch == "gpt_neox"
    root, layers = ("gpt_neox.", "gpt_neox.layers.") if neox else ("model.", "model.layers.")
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise UserError(f"{name}: missing from the weights of this {arch} model")
        used.add(name)
        return state[name]

    out = {"transformer.wte.weight": take(root + ("embed_in.weight" if neox else "embed_tokens.weight"))}
    for i in range(config.n_layer):
        src, dst = f"{layers}{i}.", f"transformer.h.{i}."
        for ours, theirs in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
            out[dst + f"{ours}.weight"] = take(src + f"{theirs}.weight")
            if neox:
                out[dst + f"{ours}.bias"] = take(src + f"{theirs}.bias")
        if neox:
            out[dst + "attn.c_attn.weight"] = take(src + "attention.query_key_value.weight").view(H, 3, hs, C) \
                .transpose(0, 1).reshape(3 * C, C)
            names = {"attn.c_proj": "attention.dense", "mlp.c_fc": "mlp.dense_h_to_4h", "mlp.c_proj": "mlp.dense_4h_to_h"}
            if config.qkv_bias:
                out[dst + "attn.c_attn.bias"] = take(src + "attention.query_key_value.bias").view(H, 3, hs) \
                    .transpose(0, 1).reshape(3 * C)
        else:
            out[dst + "attn.c_attn.weight"] = torch.cat([take(src + f"self_attn.{p}.weight") for p in ("q_proj", "k_proj", "v_proj")])
            out[dst + "mlp.c_fc.weight"] = torch.cat([take(src + f"mlp.{p}.weight") for p in ("gate_proj", "up_proj")])
            names = {"attn.c_proj": "self_attn.o_proj", "mlp.c_proj": "mlp.down_proj"}
            if config.qkv_bias:
                out[dst + "attn.c_attn.bias"] = torch.cat([take(src + f"self_attn.{p}.bias") for p in ("q_proj", "k_proj", "v_proj")])
            if config.mlp_bias:
                out[dst + "mlp.c_fc.bias"] = torch.cat([take(src + f"mlp.{p}.bias") for p in ("gate_proj", "up_proj")])
        for ours, theirs in names.items():
            out[dst + f"{ours}.weight"] = take(src + f"{theirs}.weight")
            if (config.proj_bias if ours == "attn.c_proj" else config.mlp_bias):
                out[dst + f"{ours}.bias"] = take(src + f"{theirs}.bias")
    final = root + ("final_layer_norm." if neox else "norm.")
    out["transformer.ln_f.weight"] = take(final + "weight")
    if neox:
        out["transformer.ln_f.bias"] = take(final + "bias")
    head = "embed_out.weight" if neox else "lm_head.weight"
    out["lm_head.weight"] = out["transformer.wte.weight"] if config.tie_weights else take(head)
    used.add(head)  # a tied model may still store a copy of it
    extra = sorted(set(state) - used)
    if extra:
        raise UserError(f"weights {', '.join(extra[:5])} are not part of a {arch} language model scratchlm computes")
    return out

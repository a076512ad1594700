"""The training fast path's Python face: a model's attention cores and GELUs swapped, in place, for
ones that run the compiled training operations of scratchlm.kernels.train_ops (float32 on a CPU)
and fall back to the model's own lines everywhere else.

scratchlm.model.gpt is the textbook computation and knows nothing of this file. A run's training
(scratchlm.training.parts) calls `attach_training_kernels` on its model; the swapped blocks keep
the same submodules (c_attn, c_proj, c_fc, the dropouts), so the parameters, their names and the
checkpoint are the model's own, and whatever wraps those linears (an adapter) runs as before.
Where a call is not one the compiled code covers (a mask, a cache, attention weights asked for,
dropout, another dtype or device, a shape out of range, `impl` set to "explicit"), the block runs
the model's own forward.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from scratchlm.kernels import train_ops
from scratchlm.model.gpt import GPT, MLP, CausalSelfAttention
from scratchlm.model.variants import BOTH, supports


def take_over_attention(copy: CausalSelfAttention, attn: CausalSelfAttention) -> None:
    """Give `copy` (a CausalSelfAttention subclass, built with nn.Module's constructor rather than
    CausalSelfAttention's, which would make new Linear layers from a config only for them to be
    replaced) attn's submodules and settings: the training and the decoding copies both start so."""
    nn.Module.__init__(copy)
    copy.n_head, copy.n_kv_head, copy.n_embd, copy.layer = attn.n_head, attn.n_kv_head, attn.n_embd, attn.layer
    copy.c_attn, copy.c_proj = attn.c_attn, attn.c_proj
    copy.attn_dropout, copy.resid_dropout = attn.attn_dropout, attn.resid_dropout
    copy.dropout, copy.impl = attn.dropout, attn.impl
    copy.training = attn.training


class TrainingAttention(CausalSelfAttention):
    """CausalSelfAttention whose plain causal training forward (no mask, cache, weights or
    dropout) goes from c_attn's output to c_proj's input in one compiled call each way."""

    def __init__(self, attn: CausalSelfAttention):
        """Takes over attn's submodules and settings (the model's own: the parameters stay its)."""
        take_over_attention(self, attn)

    def forward(self, x, rope=None, allowed=None, kv_cache=None, weights_out=None) -> torch.Tensor:
        plain = (self.impl != "sdpa" or weights_out is not None or kv_cache is not None or allowed is not None
                 or (self.training and self.dropout))
        if not plain:
            qkv = self.c_attn(x)  # (B, T, 3C)
            y = train_ops.attention(qkv, rope, self.n_head)  # (B, T, C), or None where it does not apply
            if y is not None:
                return self.resid_dropout(self.c_proj(y))
        return super().forward(x, rope, allowed, kv_cache, weights_out)


class TrainingMLP(MLP):
    """The GELU MLP whose activation, while a backward will follow, is one compiled call that keeps
    its own derivative."""

    def __init__(self, mlp: MLP):
        nn.Module.__init__(self)
        self.activation = mlp.activation
        self.c_fc, self.c_proj, self.dropout = mlp.c_fc, mlp.c_proj, mlp.dropout
        self.training = mlp.training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)  # (B, T, hidden)
        fused = train_ops.gelu(h) if h.requires_grad else None
        h = F.gelu(h) if fused is None else fused
        return self.dropout(self.c_proj(h))


# the compiled attention is plain causal attention of q, k and v, with RoPE or without
TRAINING_COPY = supports("the training copy", pos_embedding=("learned", "sinusoidal", "rope", "none"),
                         norm=("layernorm", "rmsnorm"), activation=("relu", "gelu", "gelu_tanh", "swiglu"),
                         norm_position=("pre", "post"), final_norm=BOTH, tie_weights=BOTH, qkv_bias=BOTH,
                         proj_bias=BOTH, mlp_bias=BOTH, lm_head_bias=BOTH, grouped_kv=(False,))


def attach_training_kernels(model: GPT) -> GPT:
    """Swap every block's attention (and, with GELU, its MLP) of `model` for the training copies,
    in place, and return it. The attention is swapped only while its `impl` is the default "sdpa"
    (a model set to "explicit" keeps the textbook path); calling it twice changes nothing more.
    A model whose variant TRAINING_COPY does not list is left as it is (see `training_copy_declines`)."""
    if training_copy_declines(model.config) is not None:
        return model
    for block in model.transformer.h:
        if type(block.attn) is CausalSelfAttention:
            block.attn = TrainingAttention(block.attn)
        if type(block.mlp) is MLP and block.mlp.activation == "gelu":
            block.mlp = TrainingMLP(block.mlp)
    return model


def training_copy_declines(config) -> str | None:
    """Why the training copy leaves a model of `config` alone, or None when it attaches."""
    return TRAINING_COPY.first_unsupported(config)

"""The GPT: a decoder-only Transformer, top to bottom in one file.

Data flow (stations 5-13), with B batch, T sequence length, C width, V vocabulary:

    ids (B, T) -> wte(ids) + positions  (B, T, C)
               -> N x Block             (B, T, C)   shape never changes inside the stack
               -> ln_f                  (B, T, C)   absent when final_norm is off
               -> lm_head               (B, T, V)   one score per vocabulary entry

Module and parameter names follow GPT-2 (`transformer.wte`, `transformer.h.0.attn.c_attn`, ...),
so GPT-2 weights load key for key (transposing HF's Conv1D matrices) and the NumPy reference in
`scratchlm/reference/numpy_gpt.py` reads the same state dict.
"""

from __future__ import annotations

import contextlib

import math
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from scratchlm.model.config import GPTConfig
from scratchlm.model.fused_loss import linear_cross_entropy

# The chunked head + loss pays where the (rows, V) scores are large. Below about a million scores
# per forward (4 MiB of float32: the character vocabulary of English text at the baby shape) the
# plain path is faster and small enough (figures: benchmarks/measurements.md).
FUSED_LOSS_MIN_SCORES = 1 << 20


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """Fixed positions (station 6): PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(same).

    Returns (n_pos, dim) float64. An odd `dim` keeps the sine of its last pair only.
    """
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]  # (n_pos, 1)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)  # (ceil(dim/2),)
    angle = pos / (10000.0 ** (two_i / dim))  # (n_pos, ceil(dim/2))
    table = torch.zeros(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table


def rope_tables(n_pos: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of RoPE's angles, each (n_pos, head_dim / 2), float64.

    Pair i of a head (dimension i and i + head_dim/2, the "rotate half" layout) turns by
    pos * theta^(-2i / head_dim).
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (hs/2,)
    angle = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (n_pos, hs/2)
    return torch.cos(angle), torch.sin(angle)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (x1, x2) pair of x (B, H, T, hs) by the angles in cos/sin (T, hs/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (B, H, T, hs/2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps)


class KVCache:
    """Keys and values of every layer for the positions seen so far, so decoding one new token
    costs one position of work instead of the whole sequence.

    Preallocated to `block_size` positions: (n_layer, B, H_kv, block_size, hs) for keys and values,
    with H_kv the key/value heads (n_head, or fewer under grouped-query attention).
    The caller (the sampler) must start a fresh cache before the sequence outgrows the context.
    """

    def __init__(self, config: GPTConfig, batch_size: int, device=None, dtype=torch.float32):
        shape = (config.n_layer, batch_size, config.kv_heads, config.block_size, config.head_dim)
        # empty, not zeros: a position is always written before it is read (update slices to `end`)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0  # positions already stored (equal for all layers between forwards)
        self.block_size = config.block_size

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H_kv, T, hs) after the cached positions; return all keys and values so far."""
        start, end = self.length, self.length + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, H_kv, end, hs)

    def advance(self, n: int) -> None:
        self.length += n


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees itself and the past only (stations 8-10).
    With n_kv_head below n_head (grouped-query attention) c_attn makes fewer key and value heads,
    and each serves n_head / n_kv_head query heads side by side."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.n_kv_head = config.kv_heads
        self.layer = layer
        kv_width = config.kv_heads * config.head_dim  # C, or less when query heads share keys and values
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_width, bias=config.qkv_bias)  # W_Q, W_K, W_V fused
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.proj_bias)  # W_O
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        # "sdpa": PyTorch's fused kernel (FlashAttention class where the device has one).
        # "explicit": the textbook computation, which can hand back the attention weights.
        self.impl = "sdpa"

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        allowed: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        weights_out: list | None = None,
    ) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C).

        allowed: optional bool (B or 1, 1, T, T_keys) mask, True where a query may look at a key;
        None means the plain causal mask over T == T_keys positions (or no mask for a single new
        position after a cache). weights_out: when a list, the explicit path runs and the
        attention weights (B, H, T, T_keys) are appended to it.
        """
        B, T, C = x.shape
        hs, H_kv = C // self.n_head, self.n_kv_head
        qkv = self.c_attn(x)  # (B, T, C + 2 * H_kv * hs): 3C without grouped-query attention
        dropout_p = self.dropout if self.training else 0.0
        q, k, v = qkv.split((C, H_kv * hs, H_kv * hs), dim=2)  # (B, T, C), (B, T, H_kv * hs) twice
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, H, T, hs)
        k = k.view(B, T, H_kv, hs).transpose(1, 2)  # (B, H_kv, T, hs)
        v = v.view(B, T, H_kv, hs).transpose(1, 2)  # (B, H_kv, T, hs)
        if rope is not None:
            q = apply_rope(q, *rope)
            k = apply_rope(k, *rope)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)  # (B, H_kv, T_keys, hs)
        if H_kv != self.n_head:  # each key/value head serves n_head / H_kv query heads, side by side
            k = k.repeat_interleave(self.n_head // H_kv, dim=1)  # (B, H, T_keys, hs)
            v = v.repeat_interleave(self.n_head // H_kv, dim=1)  # (B, H, T_keys, hs)
        T_keys = k.shape[2]
        causal = allowed is None and T > 1
        if allowed is None and T != T_keys and T > 1:
            raise ValueError("a multi-position forward after cached positions needs an explicit mask")

        if self.impl == "sdpa" and weights_out is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, is_causal=causal)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))  # (B, H, T, T_keys) scores
            if causal:
                allowed = torch.ones(T, T_keys, dtype=torch.bool, device=x.device).tril()
            if allowed is not None:
                att = att.masked_fill(~allowed, float("-inf"))  # a masked score gets zero weight
            att = F.softmax(att, dim=-1)  # each row sums to 1 over the keys
            if weights_out is not None:
                weights_out.append(att.detach())
            att = self.attn_dropout(att)
            y = att @ v  # (B, H, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again: (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward (station 11): C -> hidden -> activation -> C."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_hidden
        self.activation = config.activation
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.mlp_bias)
        # swiglu: the first layer's output is [gate | value]; only half the width reaches c_proj
        proj_in = hidden // 2 if config.activation == "swiglu" else hidden
        self.c_proj = nn.Linear(proj_in, config.n_embd, bias=config.mlp_bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        h = self.c_fc(x)  # (B, T, hidden)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)  # x * Phi(x), Phi the standard normal's CDF (erf, exact)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        else:  # swiglu
            gate, value = h.chunk(2, dim=-1)  # (B, T, hidden/2) each
            h = F.silu(gate) * value
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """One Transformer block (station 12). Pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, allowed=None, kv_cache=None, weights_out=None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        if self.pre_norm:
            x = x + self.attn(self.ln_1(x), rope, allowed, kv_cache, weights_out)
            x = x + self.mlp(self.ln_2(x))
        else:  # post-norm, as in the original Transformer: the residual sum itself is normalised
            x = self.ln_1(x + self.attn(x, rope, allowed, kv_cache, weights_out))
            x = self.ln_2(x + self.mlp(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        config.validate()
        self.config = config
        layers = dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),  # token embedding table (V, C)
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
        )
        if config.final_norm:
            layers["ln_f"] = make_norm(config)
        if config.pos_embedding == "learned":
            layers["wpe"] = nn.Embedding(config.block_size, config.n_embd)  # position table (T_max, C)
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight  # one (V, C) matrix, two uses
        # Fixed tables are buffers, not parameters: they move with the model but are not saved.
        if config.pos_embedding == "sinusoidal":
            self.register_buffer("pos_table", torch.empty(0), persistent=False)
        if config.pos_embedding == "rope":
            self.register_buffer("rope_cos", torch.empty(0), persistent=False)
            self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self._build_fixed_tables()
        self.gradient_checkpointing = False
        self.init_weights()

    def _build_fixed_tables(self) -> None:
        """(Re)compute the sinusoidal / RoPE tables in float64 and round once to the buffers' dtype.

        Called again after every .to()/.double()/.half(), so a float64 model gets exact float64
        tables instead of float32 values widened (about 3e-8 off).
        """
        cfg = self.config
        if cfg.pos_embedding == "sinusoidal":
            buf = self.pos_table
            dtype = buf.dtype if buf.is_floating_point() else torch.float32
            self.pos_table = sinusoidal_table(cfg.block_size, cfg.n_embd).to(buf.device, dtype)
        if cfg.pos_embedding == "rope":
            buf = self.rope_cos
            dtype = buf.dtype if buf.is_floating_point() else torch.float32
            cos, sin = rope_tables(cfg.block_size, cfg.head_dim, cfg.rope_theta)
            self.rope_cos = cos.to(buf.device, dtype)
            self.rope_sin = sin.to(buf.device, dtype)

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        self._build_fixed_tables()
        return self

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every tensor; the one place that decides the scheme.

        `xavier` (the seed's): Linear weights xavier-uniform, biases 0; embeddings (token and
        learned position) normal(0, 0.02); norm gamma 1 and beta 0.
        `gpt2`: Linear weights normal(0, 0.02), biases 0, embeddings normal(0, 0.02), and the two
        projections that write into the residual stream (attn.c_proj, mlp.c_proj) normal with std
        0.02 / sqrt(2 * n_layer), so the stream's variance does not grow with depth.
        With tied weights the shared (V, C) matrix is initialised as an embedding.
        """
        cfg = self.config
        residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                if cfg.tie_weights and module is self.lm_head:
                    continue
                if cfg.init == "xavier":
                    nn.init.xavier_uniform_(module.weight)
                elif name.endswith("c_proj"):
                    nn.init.normal_(module.weight, mean=0.0, std=residual_std)
                else:
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def set_attention_impl(self, impl: str) -> None:
        """Choose the attention path for every block: `sdpa` (the default: PyTorch's fused kernel)
        or `explicit` (the scores and weights computed line by line, which can be handed back)."""
        if impl not in ("sdpa", "explicit"):
            raise ValueError(f"attention impl must be 'sdpa' or 'explicit', got {impl!r}")
        for block in self.transformer.h:
            block.attn.impl = impl

    def forward_hidden(
        self,
        idx: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        attn_weights: list | None = None,
    ) -> torch.Tensor:
        """ids (B, T) -> the hidden states lm_head reads (B, T, C): ln_f's output, or the last
        block's where the config has no final norm.

        attention_mask: optional (B, T_total) with 1 for real tokens and 0 for padding (padding
        on the right, so positions count from 0 for every row). kv_cache: continue after the
        positions it holds. attn_weights: a list that receives each layer's (B, H, T, T_keys)
        attention weights, computed on the explicit path.
        """
        B, T = idx.shape
        past = kv_cache.length if kv_cache is not None else 0
        if past + T > self.config.block_size:
            what = f"{past} cached + {T} new positions" if past else f"sequence length {T}"
            raise ValueError(
                f"{what} exceeds the model's context length block_size={self.config.block_size}; "
                "crop the input to the last block_size tokens"
            )
        x = self.transformer.wte(idx)  # (B, T, C)
        kind = self.config.pos_embedding
        if kind == "learned":
            pos = torch.arange(past, past + T, device=idx.device)  # (T,)
            x = x + self.transformer.wpe(pos)  # (T, C) broadcast over B
        elif kind == "sinusoidal":
            x = x + self.pos_table[past : past + T].to(x.dtype)
        rope = (self.rope_cos[past : past + T], self.rope_sin[past : past + T]) if kind == "rope" else None
        x = self.transformer.drop(x)

        allowed = self._attention_mask(B, T, past, attention_mask, idx.device)
        for block in self.transformer.h:
            if self.gradient_checkpointing and self.training and kv_cache is None and attn_weights is None:
                # keep only each block's input; recompute its insides during backward
                x = checkpoint(block, x, rope, allowed, use_reentrant=False)
            else:
                x = block(x, rope, allowed, kv_cache, attn_weights)
        if kv_cache is not None:
            kv_cache.advance(T)
        return self.transformer.ln_f(x) if "ln_f" in self.transformer else x  # (B, T, C)

    @staticmethod
    def _attention_mask(B, T, past, attention_mask, device) -> torch.Tensor | None:
        """None where the plain causal mask is enough, else a bool (B or 1, 1, T, past + T)."""
        if attention_mask is None and (past == 0 or T == 1):
            return None
        q_pos = torch.arange(past, past + T, device=device)[:, None]  # (T, 1)
        k_pos = torch.arange(past + T, device=device)[None, :]  # (1, T_keys)
        allowed = (k_pos <= q_pos)[None, None]  # (1, 1, T, T_keys)
        if attention_mask is not None:
            if attention_mask.shape != (B, past + T):
                raise ValueError(f"attention_mask must be (B, T_total) = {(B, past + T)}, got {tuple(attention_mask.shape)}")
            keys_real = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T_keys)
            # a padding query still sees itself, so its softmax row is never empty (no NaN)
            allowed = (allowed & keys_real) | (k_pos == q_pos)[None, None]
        return allowed

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        attn_weights: list | None = None,
        ignore_index: int = -100,
        return_logits: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """ids (B, T) -> logits (B, T, V), and the mean cross-entropy when targets (B, T) are given.

        Targets equal to `ignore_index` (padding) are left out of the loss. return_logits=False
        (training) returns (None, loss); from FUSED_LOSS_MIN_SCORES scores (B*T x V) on it comes
        from the chunked head + loss of scratchlm.model.fused_loss, which never holds them all: the same
        numbers, much less memory traffic. Below that the plain path is faster and used.
        """
        x = self.forward_hidden(idx, attention_mask=attention_mask, kv_cache=kv_cache, attn_weights=attn_weights)
        if not return_logits:
            if targets is None:
                raise ValueError("return_logits=False needs targets: the loss is all it returns")
            if x.shape[0] * x.shape[1] * self.config.vocab_size >= FUSED_LOSS_MIN_SCORES:
                weight = getattr(self.lm_head, "weight_blocks", None) or self.lm_head.weight  # see model/lora.py
                return None, linear_cross_entropy(x, weight, self.lm_head.bias, targets, ignore_index)
            return None, self._plain_loss(self.lm_head(x), targets, ignore_index)
        logits = self.lm_head(x)  # (B, T, V)
        loss = self._plain_loss(logits, targets, ignore_index) if targets is not None else None
        return logits, loss

    @staticmethod
    def _plain_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        """Mean cross-entropy over the flattened (B*T, V) scores, in float32 even under autocast
        (float64 stays float64)."""
        flat = logits.view(-1, logits.shape[-1])
        flat = flat if flat.dtype == torch.float64 else flat.float()
        return F.cross_entropy(flat, targets.reshape(-1).long(), ignore_index=ignore_index)

    def num_params(self, embeddings: bool = True) -> int:
        """Parameters, shared tensors counted once; without token/position embedding tables if asked."""
        total = sum(p.numel() for p in self.parameters())
        if not embeddings:
            total -= self.transformer.wte.weight.numel()
            if "wpe" in self.transformer:
                total -= self.transformer.wpe.weight.numel()
            if self.config.tie_weights:  # the shared matrix is still needed as lm_head
                total += self.lm_head.weight.numel()
        return total


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode (no dropout) for the block, then back in the mode it was in, whatever
    happens inside."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def gpt_holding(config: GPTConfig, state: dict[str, torch.Tensor]) -> GPT:
    """A float32 CPU model of `config` whose parameters are the tensors of `state` themselves
    (names and shapes checked by the caller): built on the meta device and given them, so a
    load holds one copy of the weights, not two. A tied head is tied again; the fixed
    tables (sinusoidal, RoPE) are computed anew."""
    with torch.device("meta"):
        model = GPT(config)
    state = {k: v if v.dtype == torch.float32 else v.float() for k, v in state.items()}
    model.load_state_dict(state, strict=not config.tie_weights, assign=True)
    if config.tie_weights:
        model.lm_head.weight = model.transformer.wte.weight
    for module in model.modules():
        for name, buf in list(module._buffers.items()):
            if buf is not None and buf.is_meta:
                module._buffers[name] = torch.empty(0)
    model._build_fixed_tables()
    return model

"""The torch model against hand calculations: parameter counts, shapes, causality, masks, cache, init.

Every expected value here comes from somewhere other than the model: a formula written from the
station 14 description, a log-softmax done by hand, a sequence run on its own, a full forward compared
with a cached one, or the statistics an initialisation scheme promises.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn as nn

from scratchlm.inside.introspect import shape_trace
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, KVCache

POSITIONS = ("learned", "sinusoidal", "rope", "none")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
NORM_POSITIONS = ("pre", "post")


def tiny(**overrides) -> GPTConfig:
    """A model small enough that dozens of variants run in a second or two."""
    values = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
    values.update(overrides)
    return GPTConfig(**values)


def make_model(cfg: GPTConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg).eval()


def expected_param_count(cfg: GPTConfig) -> int:
    """Parameters from the architecture's description (station 14), tensor by tensor."""
    C, V, N = cfg.n_embd, cfg.vocab_size, cfg.n_layer
    hidden = cfg.n_inner if cfg.n_inner is not None else 4 * C
    proj_in = hidden // 2 if cfg.activation == "swiglu" else hidden
    norm = 2 * C if cfg.norm == "layernorm" else C  # gamma (+ beta)
    attention = (C * 3 * C + (3 * C if cfg.qkv_bias else 0)) + (C * C + (C if cfg.proj_bias else 0))
    mlp = (C * hidden + (hidden if cfg.mlp_bias else 0)) + (proj_in * C + (C if cfg.mlp_bias else 0))
    block = 2 * norm + attention + mlp
    total = V * C  # token embedding
    total += cfg.block_size * C if cfg.pos_embedding == "learned" else 0
    total += N * block + norm  # blocks + ln_f
    total += 0 if cfg.tie_weights else V * C  # a tied head shares the embedding matrix
    total += V if cfg.lm_head_bias else 0
    return total


def count_unique_params(model: nn.Module) -> int:
    """Count each parameter once (a tied matrix appears under two names), without num_params()."""
    seen = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if isinstance(tensor, nn.Parameter):
            seen[id(tensor)] = tensor.numel()
    return sum(seen.values())


# ---------------------------------------------------------------- parameter counts


def test_smoke_has_exactly_13356928_parameters():
    cfg = GPTConfig.from_name("smoke")
    # the seed's number, and the same number from the tensor-by-tensor formula
    assert expected_param_count(cfg) == 13_356_928
    # spelled out for the smoke sizes (C 128, N 2, context 256, V 50304):
    C, N, T, V = 128, 2, 256, 50304
    by_hand = V * C + T * C + N * (4 * C + 3 * C * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C + V * C + V
    assert by_hand == 13_356_928
    model = GPT(cfg)
    assert count_unique_params(model) == 13_356_928
    assert model.num_params() == 13_356_928
    assert model.num_params(embeddings=False) == 13_356_928 - V * C - T * C


def test_readable_is_seed_002s_model_with_2510336_parameters():
    """Seed 002's model: nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512,
    activation="gelu", norm_first=True) x 2, learned positions (128), a final LayerNorm and
    lm_head = nn.Linear(128, 8192, bias=False), counted by hand from those modules:"""
    V, T, C = 8192, 128, 128
    layer = (3 * C * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C) + 2 * 2 * C  # in/out proj, FFN, 2 LN
    by_hand = V * C + T * C + 2 * layer + 2 * C + V * C
    assert by_hand == 2_510_336
    cfg = GPTConfig.from_name("readable")
    assert (cfg.activation, cfg.norm_position, cfg.pos_embedding) == ("gelu", "pre", "learned")
    assert count_unique_params(make_model(cfg)) == by_hand


def test_gpt2_124m_has_exactly_124439808_parameters():
    cfg = GPTConfig.from_name("gpt2-124m")
    assert expected_param_count(cfg) == 124_439_808
    with torch.device("meta"):  # no memory, no init cost: only the shapes matter here
        model = GPT(cfg)
    assert count_unique_params(model) == 124_439_808
    assert model.num_params() == 124_439_808


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(activation="swiglu", n_inner=24),
        dict(norm="rmsnorm", tie_weights=True, lm_head_bias=False),
        dict(pos_embedding="rope", qkv_bias=True, proj_bias=False, mlp_bias=False),
        dict(pos_embedding="sinusoidal", n_inner=20),
        dict(pos_embedding="none", norm_position="post", activation="gelu"),
    ],
)
def test_param_count_matches_formula_for_variants(overrides):
    cfg = tiny(**overrides)
    model = GPT(cfg)
    assert count_unique_params(model) == expected_param_count(cfg)
    assert model.num_params() == expected_param_count(cfg)


# ---------------------------------------------------------------- shapes (station 13)


def test_smoke_shape_trace_via_introspect():
    model = make_model(GPTConfig.from_name("smoke"))
    stations = {st.name: st.shape for st in shape_trace(model, batch_size=2, seq_len=16)}
    assert stations["ids"] == (2, 16)
    assert stations["embedding sum (tokens + positions)"] == (2, 16, 128)
    assert stations["final norm ln_f"] == (2, 16, 128)
    assert stations["logits lm_head"] == (2, 16, 50304)
    for i in range(2):
        assert stations[f"block {i} output"] == (2, 16, 128)


def test_smoke_shape_trace_via_model():
    model = make_model(GPTConfig.from_name("smoke"))
    idx = torch.randint(0, 50304, (2, 16))
    with torch.no_grad():
        pos = torch.arange(16)
        embedded = model.transformer.wte(idx) + model.transformer.wpe(pos)
        hidden = model.forward_hidden(idx)
        logits, loss = model(idx)
    assert embedded.shape == (2, 16, 128)
    assert hidden.shape == (2, 16, 128)
    assert logits.shape == (2, 16, 50304)
    assert loss is None


# ---------------------------------------------------------------- causality


@pytest.mark.parametrize(
    "pos,norm,act,norm_pos", list(itertools.product(POSITIONS, NORMS, ACTIVATIONS, NORM_POSITIONS))
)
def test_changing_token_t_never_changes_earlier_logits(pos, norm, act, norm_pos):
    cfg = tiny(pos_embedding=pos, norm=norm, activation=act, norm_position=norm_pos)
    model = make_model(cfg)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab_size, (1, cfg.block_size), generator=gen)
    for impl in ("sdpa", "explicit"):
        model.set_attention_impl(impl)
        with torch.no_grad():
            base, _ = model(idx)
            for t in range(cfg.block_size):
                changed = idx.clone()
                changed[0, t] = (idx[0, t] + 1 + t) % cfg.vocab_size
                out, _ = model(changed)
                # the past is untouched (up to float noise far below any real leak)...
                assert torch.allclose(out[:, :t], base[:, :t], rtol=0, atol=1e-6), (impl, t)
                # ...and the change is visible where it happened, so this test can see a change
                assert (out[:, t] - base[:, t]).abs().max() > 1e-4, (impl, t)


# ---------------------------------------------------------------- attention paths, loss at init


def right_padded_mask(lengths: list[int], T: int) -> torch.Tensor:
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_and_explicit_attention_agree(pos, masked):
    cfg = GPTConfig(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_embedding=pos)
    model = make_model(cfg)
    idx = torch.randint(0, cfg.vocab_size, (3, 16), generator=torch.Generator().manual_seed(2))
    mask = right_padded_mask([16, 9, 4], 16) if masked else None
    with torch.no_grad():
        model.set_attention_impl("sdpa")
        fast, _ = model(idx, attention_mask=mask)
        model.set_attention_impl("explicit")
        weights: list[torch.Tensor] = []
        slow, _ = model(idx, attention_mask=mask, attn_weights=weights)
    assert torch.allclose(fast, slow, rtol=0, atol=1e-5)
    assert len(weights) == cfg.n_layer
    for w in weights:
        assert w.shape == (3, 4, 16, 16)
        assert torch.allclose(w.sum(-1), torch.ones(3, 4, 16), atol=1e-6)
        future = torch.ones(16, 16, dtype=torch.bool).triu(1)
        assert w[..., future].abs().max() == 0  # no weight on any later position
        if masked:
            # a real query of row 2 (length 4) puts no weight on padding keys 4..15
            assert w[2, :, :4, 4:].abs().max() == 0


def test_loss_at_init_is_close_to_ln_vocab_smoke():
    model = make_model(GPTConfig.from_name("smoke"))
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 50304, (4, 64), generator=gen)
    targets = torch.randint(0, 50304, (4, 64), generator=gen)
    with torch.no_grad():
        _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(50304)) < 0.1


@pytest.mark.parametrize("init", ["xavier", "gpt2"])
def test_loss_at_init_is_close_to_ln_vocab_tiny(init):
    model = make_model(GPTConfig(vocab_size=512, block_size=16, n_layer=2, n_head=4, n_embd=32, init=init))
    gen = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 512, (16, 16), generator=gen)
    targets = torch.randint(0, 512, (16, 16), generator=gen)
    with torch.no_grad():
        _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(512)) < 0.15


# ---------------------------------------------------------------- errors and the loss


def test_sequence_longer_than_block_size_names_both_lengths():
    model = make_model(tiny(block_size=8))
    with pytest.raises(ValueError, match=r"13.*8"):
        model(torch.zeros(1, 13, dtype=torch.long))
    cache = KVCache(model.config, batch_size=1)
    model(torch.zeros(1, 6, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match=r"6.*3.*8"):
        model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache)


@pytest.mark.parametrize("ignore_index", [-100, 0])
def test_ignored_targets_are_left_out_of_the_loss(ignore_index):
    cfg = tiny(vocab_size=23)
    model = make_model(cfg)
    gen = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 23, (3, 8), generator=gen)
    targets = torch.randint(1, 23, (3, 8), generator=gen)
    targets[0, 5:] = ignore_index
    targets[2, :3] = ignore_index
    with torch.no_grad():
        logits, loss = model(idx, targets, ignore_index=ignore_index)
    # log-softmax by hand, in float64: log p = z - max - log(sum(exp(z - max)))
    z = logits.double()
    shifted = z - z.max(-1, keepdim=True).values
    logp = shifted - shifted.exp().sum(-1, keepdim=True).log()
    nll = []
    for b in range(3):
        for t in range(8):
            if targets[b, t] != ignore_index:
                nll.append(-logp[b, t, targets[b, t]].item())
    assert len(nll) == 24 - 3 - 3
    assert loss.item() == pytest.approx(sum(nll) / len(nll), abs=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
def test_padded_batch_matches_each_sequence_alone(pos):
    cfg = GPTConfig(vocab_size=50, block_size=12, n_layer=2, n_head=2, n_embd=16, pos_embedding=pos)
    model = make_model(cfg)
    gen = torch.Generator().manual_seed(6)
    lengths = [5, 12, 8]
    seqs = [torch.randint(1, 50, (n,), generator=gen) for n in lengths]
    batch = torch.zeros(3, 12, dtype=torch.long)  # pad id 0, on the right
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
    mask = right_padded_mask(lengths, 12)
    with torch.no_grad():
        for impl in ("sdpa", "explicit"):
            model.set_attention_impl(impl)
            padded, _ = model(batch, attention_mask=mask)
            for i, s in enumerate(seqs):
                alone, _ = model(s[None])
                assert torch.allclose(padded[i, : len(s)], alone[0], rtol=0, atol=1e-5), (impl, i)
    # and the loss over the padded batch (targets -100 at padding) is the token-weighted mean of
    # each sequence's own loss
    targets = torch.full((3, 12), -100, dtype=torch.long)
    sums, count = 0.0, 0
    with torch.no_grad():
        for i, s in enumerate(seqs):
            t = torch.randint(0, 50, (len(s),), generator=gen)
            targets[i, : len(s)] = t
            _, own = model(s[None], t[None])
            sums += own.item() * len(s)
            count += len(s)
        _, padded_loss = model(batch, targets, attention_mask=mask)
    assert padded_loss.item() == pytest.approx(sums / count, abs=1e-5)


# ---------------------------------------------------------------- KV cache


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "none"])
def test_kv_cache_decoding_matches_full_forward(pos):
    cfg = GPTConfig(vocab_size=61, block_size=20, n_layer=2, n_head=4, n_embd=32, pos_embedding=pos)
    model = make_model(cfg)
    idx = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(7))
    prefill = 6
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(cfg, batch_size=2)
        first, _ = model(idx[:, :prefill], kv_cache=cache)
        assert cache.length == prefill
        assert torch.allclose(first, full[:, :prefill], rtol=0, atol=1e-5)
        for t in range(prefill, 20):
            step, _ = model(idx[:, t : t + 1], kv_cache=cache)
            assert step.shape == (2, 1, 61)
            assert torch.allclose(step[:, 0], full[:, t], rtol=0, atol=1e-5), t
        assert cache.length == 20


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_prefill_in_chunks_after_cached_positions_matches_full_forward(pos):
    """A prompt fed in chunks of 1, 3 and 4 ids: each chunk after the first attends to the cached
    keys through the explicit mask (_attention_mask with past > 0), diagonal included."""
    cfg = GPTConfig(vocab_size=61, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_embedding=pos)
    model = make_model(cfg)
    idx = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(cfg, batch_size=2)
        start = 0
        for size in (1, 3, 4):
            part, _ = model(idx[:, start : start + size], kv_cache=cache)
            torch.testing.assert_close(part, full[:, start : start + size], rtol=0, atol=1e-5)
            start += size
        # the attention layer itself refuses a chunk after cached positions without a mask
        cache = KVCache(cfg, batch_size=2)
        model(idx[:, :2], kv_cache=cache)
        with pytest.raises(ValueError, match="explicit mask"):
            model.transformer.h[0].attn(torch.zeros(2, 3, cfg.n_embd), kv_cache=cache)


def test_sdpa_impl_calls_sdpa_and_explicit_does_not(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    model = make_model(tiny())
    idx = torch.zeros(1, 4, dtype=torch.long)
    with torch.no_grad():
        model(idx)
        assert len(calls) == 2  # one per block
        model.set_attention_impl("explicit")
        model(idx)
        assert len(calls) == 2


def test_a_config_changed_after_creation_is_still_validated():
    cfg = tiny()
    cfg.n_head = 3  # 8 is not divisible by 3
    with pytest.raises(ValueError, match="n_head"):
        GPT(cfg)


@pytest.mark.parametrize("pos, buffers", [("sinusoidal", {"pos_table"}), ("rope", {"rope_cos", "rope_sin"})])
def test_fixed_position_tables_are_buffers_left_out_of_the_state_dict(pos, buffers):
    model = make_model(tiny(pos_embedding=pos))
    assert buffers <= {n for n, _ in model.named_buffers()}
    assert not buffers & set(model.state_dict())  # recomputed, never saved in a checkpoint


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_init_weights_resets_norms_of_a_model_built_on_the_meta_device(norm):
    """Large models are built on meta, given memory with to_empty (garbage), then init_weights:
    norms must come out as gamma 1, beta 0, whatever the memory held."""
    with torch.device("meta"):
        model = GPT(tiny(norm=norm, init="gpt2"))
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(3.0)
    model.init_weights()
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
    assert len(norms) == 5
    for m in norms:
        assert torch.equal(m.weight, torch.ones_like(m.weight))
        if getattr(m, "bias", None) is not None:
            assert torch.equal(m.bias, torch.zeros_like(m.bias))


def test_training_path_loss_equals_cross_entropy_of_the_logits():
    import torch.nn.functional as F

    model = make_model(tiny(lm_head_bias=True))
    idx = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, _ = model(idx)
        none, loss = model(idx, targets, return_logits=False)
    assert none is None
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs targets"):
        model(idx, return_logits=False)


def test_eval_mode_switches_dropout_off_and_restores_the_mode():
    from scratchlm.model.gpt import eval_mode

    model = GPT(tiny(dropout=0.5)).train()
    idx = torch.randint(0, 13, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), eval_mode(model):
        assert not model.training
        a, b = model(idx)[0], model(idx)[0]
    assert torch.equal(a, b) and model.training  # no dropout inside; training again after


def test_gradient_checkpointing_recomputes_each_block_in_backward():
    model = GPT(tiny()).train()
    model.gradient_checkpointing = True
    calls = []
    for block in model.transformer.h:
        block.register_forward_pre_hook(lambda *args: calls.append(1))  # recompute may stop before the end
    _, loss = model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))
    assert len(calls) == 2
    loss.backward()
    assert len(calls) == 4  # each block ran again during backward


# ---------------------------------------------------------------- initialisation (the seed's xavier, GPT-2's)


def linears(model: GPT):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def test_xavier_init_respects_bound_and_std():
    cfg = GPTConfig(vocab_size=1000, block_size=64, n_layer=2, n_head=4, n_embd=128)
    model = make_model(cfg)
    for name, lin in linears(model):
        fan_out, fan_in = lin.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        w = lin.weight.detach()
        assert w.abs().max() <= bound, name
        assert w.abs().max() > 0.95 * bound, name  # uniform on the whole interval, not a narrower one
        assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.03), name
        assert abs(w.mean().item()) < 0.05 * bound, name
        if lin.bias is not None:
            assert torch.count_nonzero(lin.bias) == 0, name
    for emb in (model.transformer.wte.weight, model.transformer.wpe.weight):
        assert emb.std().item() == pytest.approx(0.02, rel=0.05)
        assert abs(emb.mean().item()) < 0.002
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * cfg.n_layer + 1
    for norm in norms:
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))
        assert torch.equal(norm.bias, torch.zeros_like(norm.bias))


def test_gpt2_init_scales_residual_projections():
    cfg = GPTConfig(vocab_size=1000, block_size=64, n_layer=8, n_head=4, n_embd=128, init="gpt2", qkv_bias=True)
    model = make_model(cfg)
    residual_std = 0.02 / math.sqrt(2 * 8)
    seen_proj = 0
    for name, lin in linears(model):
        expected = residual_std if name.endswith("c_proj") else 0.02
        seen_proj += name.endswith("c_proj")
        assert lin.weight.std().item() == pytest.approx(expected, rel=0.05), name
        assert abs(lin.weight.mean().item()) < 0.05 * expected, name  # centred on 0
        if lin.bias is not None:
            assert torch.count_nonzero(lin.bias) == 0, name
    assert seen_proj == 2 * 8  # attn.c_proj and mlp.c_proj in every block


def test_rmsnorm_gamma_starts_at_one():
    model = make_model(tiny(norm="rmsnorm"))
    norms = [m for m in model.modules() if isinstance(m, nn.RMSNorm)]
    assert len(norms) == 2 * 2 + 1
    for norm in norms:
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))


@pytest.mark.parametrize("init", ["xavier", "gpt2"])
def test_tied_weights_share_storage(init):
    cfg = GPTConfig(vocab_size=1000, block_size=16, n_layer=1, n_head=4, n_embd=64, tie_weights=True, init=init)
    model = make_model(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    # initialised once, as an embedding (xavier for (1000, 64) would have std 0.044)
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    with torch.no_grad():
        model.transformer.wte.weight[3, 5] = 7.0
    assert model.lm_head.weight[3, 5].item() == 7.0


# ---------------------------------------------------------------- overfitting one sentence (station 17)


def test_tiny_model_memorises_one_sentence():
    sentence = "the cat sat on the mat and looked at the hat."
    chars = sorted(set(sentence))
    ids = torch.tensor([chars.index(c) for c in sentence])[None]  # (1, len)
    x, y = ids[:, :-1], ids[:, 1:]
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=len(chars), block_size=x.shape[1], n_layer=2, n_head=4, n_embd=32)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(300):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if loss.item() < 0.05:
            break
    assert losses[0] > 2.0  # it started from not knowing the sentence
    assert losses[-1] < 0.05, f"loss after {len(losses)} steps: {losses[-1]:.4f}"
    model.eval()
    with torch.no_grad():
        logits, _ = model(x)
    assert torch.equal(logits.argmax(-1), y)  # every next character predicted

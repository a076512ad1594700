"""Introspection: inspect's shapes, FLOPs and memory figures, the hand-sized walkthrough, and
attention maps, each checked against something computed another way (a FLOP counter, what
autograd really saves, the NumPy reference, a hand calculation, the SDPA kernel)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scratchlm.cli.main import main
from scratchlm.inside import attention_maps as amaps
from scratchlm.kernels.training_copy import attach_training_kernels
from scratchlm.inside import introspect as ins
from scratchlm.inside import walkthrough as walk
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

from helpers import saved_bytes as _saved_bytes

TINY = dict(vocab_size=23, block_size=12, n_layer=2, n_head=2, n_embd=8)

# variants that change what is computed or kept: norms, activations, positions, tying, biases
VARIANTS = [
    {},
    dict(norm="rmsnorm"),
    dict(activation="gelu_tanh", qkv_bias=True, tie_weights=True, lm_head_bias=False),
    dict(activation="swiglu", pos_embedding="rope"),
    dict(pos_embedding="sinusoidal", norm_position="post"),
    dict(pos_embedding="sinusoidal", norm_position="post", final_norm=False),  # the tutorial preset's layout
    dict(final_norm=False),  # lm_head reads the residual stream itself
    dict(n_kv_head=1, pos_embedding="rope"),  # grouped-query attention: both query heads share one K/V head
    dict(n_kv_head=1, activation="swiglu"),
]


def _model(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **overrides}))


# ------------------------------------------------------------------ inspect: shapes and counts


def test_inspect_smoke_text_and_json_agree(capsys):
    assert main(["inspect", "--preset", "smoke"]) == 0
    text = capsys.readouterr().out
    assert "13,356,928" in text
    # station 13: the (2, 16) batch after embedding, after blocks + final norm, and as logits
    assert "embedding sum (tokens + positions)       (2, 16, 128)" in text
    assert "final norm ln_f                          (2, 16, 128)" in text
    assert "logits lm_head                           (2, 16, 50304)" in text
    for heading in ("FLOPs per token", "training memory", "bf16-mixed", "checkpointing"):
        assert heading in text

    assert main(["inspect", "--preset", "smoke", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parameters"]["total"] == 13_356_928
    assert report["parameters"]["seed_estimate"] == 12 * 2 * 128**2 + 2 * 50304 * 128
    shapes = {s["name"]: tuple(s["shape"]) for s in report["trace"]["stations"]}
    assert shapes["logits lm_head"] == (2, 16, 50304)
    assert [e["precision"] for e in report["memory"]["estimates"]] == list(ins.PRECISIONS)


def test_inspect_checkpoint_reads_the_saved_model(tmp_path, capsys):
    from scratchlm.checkpoint import save_model_checkpoint

    model = _model(activation="swiglu")
    save_model_checkpoint(model, None, tmp_path / "ckpt")
    assert main(["inspect", "--checkpoint", str(tmp_path / "ckpt"), "--json", "-T", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["activation"] == "swiglu"
    assert report["parameters"]["total"] == model.num_params()
    assert report["trace"]["stations"][-1]["shape"] == [2, 5, TINY["vocab_size"]]


def test_inspect_bad_sizes_are_one_error_line(capsys):
    assert main(["inspect", "--preset", "hand", "-T", "4"]) == 2
    assert capsys.readouterr().err.startswith("error: --seq-len 4 exceeds")
    assert main(["inspect", "--preset", "hand", "--train-batch", "0"]) == 2


@pytest.mark.parametrize("overrides", VARIANTS + [dict(GPTConfig.from_name("smoke").to_dict())])
def test_count_params_from_config_matches_the_built_model(overrides):
    model = _model(**overrides)
    counts = ins.count_params(model.config)
    assert counts["total"] == model.num_params()
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert counts["matmul"] == linear_weights


# ------------------------------------------------------------------ FLOPs


def _counted_flops(model: GPT, B: int, T: int, train: bool) -> int:
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
    with FlopCounterMode(display=False) as counter:
        if train:
            _, loss = model(idx, idx)
            loss.backward()
        else:
            with torch.no_grad():
                model(idx)
    return counter.get_total_flops()


@pytest.mark.parametrize("overrides", [dict(GPTConfig.from_name("smoke").to_dict())] + VARIANTS[1:])
def test_flops_match_torch_flop_counter(overrides):
    """FlopCounterMode counts every mm/addmm/bmm the real model runs (2 FLOPs per multiply-add).

    The explicit attention path is used because the counter does not count PyTorch's CPU SDPA
    kernel; both paths do the same matmuls, so the SDPA run must count exactly the attention
    term less.
    """
    model = _model(**overrides)
    B, T = 2, 9
    model.set_attention_impl("explicit")
    flops = ins.flops_per_token(model.config, T)
    assert _counted_flops(model, B, T, train=False) == flops.forward * B * T
    assert _counted_flops(model, B, T, train=True) == flops.training * B * T
    model.set_attention_impl("sdpa")
    assert _counted_flops(model, B, T, train=False) == flops.forward_weights * B * T


# ------------------------------------------------------------------ activation memory


# Sizes picked so no activation has the shape of a weight matrix (B*T = 14, C = 8, V = 23).
B_MEM, T_MEM = 2, 7


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
@pytest.mark.parametrize("overrides", VARIANTS)
def test_activation_estimate_matches_what_autograd_saves(overrides, attention):
    """fp32, no checkpointing: the estimate lists each saved tensor, so it must match the bytes
    the pack hook sees exactly (the tolerance 0 is deliberate: any tensor the list forgets or
    invents shows up)."""
    model = _model(**overrides)
    model.set_attention_impl(attention)
    measured, _, _ = _saved_bytes(model, B_MEM, T_MEM)
    est = ins.memory_estimate(model.config, B_MEM, T_MEM, "fp32", attention=attention)
    assert est.activations == measured


@pytest.mark.skipif(__import__("scratchlm.kernels").kernels.cpu_kernels() is None, reason="no compiled kernels")
@pytest.mark.parametrize("overrides", [dict(pos_embedding="rope", activation="gelu"),
                                       dict(pos_embedding="learned", activation="relu", norm="rmsnorm")])
def test_activation_estimate_of_the_compiled_path_matches_what_autograd_saves(overrides):
    """Heads of 16: the training copy (what a CPU run trains) runs the compiled attention (and
    GELU), which keep other tensors than PyTorch's operations (scratchlm.kernels.train_ops); exact
    again."""
    model = attach_training_kernels(_model(n_embd=32, **overrides))
    measured, _, _ = _saved_bytes(model, B_MEM, T_MEM)
    est = ins.memory_estimate(model.config, B_MEM, T_MEM, "fp32", attention="compiled")
    assert est.activations == measured
    model = _model(n_embd=32, **overrides)  # and the model alone, on PyTorch's SDPA, keeps what "sdpa" lists
    measured, _, _ = _saved_bytes(model, B_MEM, T_MEM)
    assert ins.memory_estimate(model.config, B_MEM, T_MEM, "fp32", attention="sdpa").activations == measured


@pytest.mark.parametrize("overrides", VARIANTS[:3])
def test_checkpointed_activation_estimate(overrides):
    """With checkpointing autograd keeps each block's input (and the parts outside the blocks);
    during backward one block is recomputed, whose saved tensors we measure in a plain run."""
    model = _model(**overrides)
    _, block0, _ = _saved_bytes(model, B_MEM, T_MEM)
    model.gradient_checkpointing = True
    kept, _, _ = _saved_bytes(model, B_MEM, T_MEM)
    est = ins.memory_estimate(model.config, B_MEM, T_MEM, "fp32")
    assert est.activations_checkpointed == kept + block0
    assert est.activations_checkpointed < est.activations


def test_bf16_mixed_estimate_against_cpu_autocast():
    """Under autocast (CPU, bf16) the matmul inputs and outputs are kept in bf16 and the residual
    stream and statistics in fp32, as the estimate assumes for GPUs; the bf16 copies of the
    weights are exactly one per matmul weight. CPU and CUDA autocast differ in a few ops (e.g.
    softmax), so this uses the SDPA path, where they agree, and allows 2%."""
    model = _model()
    measured, _, casts = _saved_bytes(model, B_MEM, T_MEM, autocast=True)
    est = ins.memory_estimate(model.config, B_MEM, T_MEM, "bf16-mixed")
    assert casts == est.weight_copies
    assert est.activations == pytest.approx(measured, rel=0.02)


def test_memory_totals_add_up_and_scale():
    cfg = GPTConfig.from_name("smoke")
    P = 13_356_928
    est = ins.memory_estimate(cfg, 8, 256, "fp32")
    assert est.weights == est.gradients == 4 * P and est.adamw_state == 8 * P
    assert est.loss_temporaries == 8 * 256 * 50304 * 8  # two fp32 B*T*V buffers
    assert est.total == 16 * P + est.activations + est.loss_temporaries
    bf16 = ins.memory_estimate(cfg, 8, 256, "bf16-mixed")
    assert bf16.weight_copies == 2 * (2 * 12 * 128**2 + 50304 * 128)  # 2 bytes per block and lm_head weight


# ------------------------------------------------------------------ the walkthrough (station 22)


def test_walkthrough_torch_and_numpy_agree():
    for init in ("hand", "model"):
        w = walk.walkthrough(init=init)
        keys = [s.key for s in w.steps]
        for key in ("wte", "pos", "x0", "h0.q", "h0.k", "h0.v", "h0.scores", "h0.mask", "h0.weights", "h0.heads",
                    "h0.concat", "h0.attn_out", "h0.resid_1", "h0.ln_2", "h0.mlp_hidden", "logits", "probs"):
            assert key in keys
        assert w.max_diff < 1e-6, [(s.key, s.max_diff) for s in w.steps if s.max_diff >= 1e-6]
        assert w.steps[keys.index("h0.q")].torch.shape == (2, 3, 1)  # (H, T, hs)


def test_walkthrough_matches_a_hand_calculation():
    """Weights set by hand so the attention weights can be worked out on paper.

    x0 rows [1, 0], [0, 1], [1, 0]. LayerNorm of [a, b] (C = 2) is ([a-b, b-a] / 2) / sqrt((a-b)^2/4
    + eps), i.e. [1, -1], [-1, 1], [1, -1] (to 1e-5). W_Q = identity, W_K = diag(1, 2); head h
    takes column h (hs = 1), so
      head 0: q = k = [1, -1, 1]        scores q_i k_j: [[1, -1, 1], [-1, 1, -1], [1, -1, 1]]
      head 1: q = [-1, 1, -1], k = [-2, 2, -2]  scores: [[2, -2, 2], [-2, 2, -2], [2, -2, 2]]
    Causal softmax, row by row:
      head 0: [1, 0, 0]; [e^-1, e^1] / (e^-1 + e) = [1/(1+e^2), e^2/(1+e^2)];
              [e, e^-1, e] / (2e + e^-1) = [e^2, 1, e^2] / (2e^2 + 1)
      head 1: [1, 0, 0]; [1/(1+e^4), e^4/(1+e^4)]; [e^4, 1, e^4] / (2e^4 + 1)
    """
    model = walk.walkthrough_model(init="model")
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    sd["transformer.wte.weight"][1] = torch.tensor([1.0, 0.0])
    sd["transformer.wte.weight"][2] = torch.tensor([0.0, 1.0])
    for name in ("ln_1", "ln_2"):
        sd[f"transformer.h.0.{name}.weight"] += 1.0
    sd["transformer.ln_f.weight"] += 1.0
    sd["transformer.h.0.attn.c_attn.weight"] = torch.tensor(
        [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64
    )  # rows [W_Q; W_K; W_V]
    model.load_state_dict(sd)
    w = walk.walkthrough_of(model, [1, 2, 1])
    weights = {s.key: s for s in w.steps}["h0.weights"]
    e = math.e
    hand = np.array([
        [[1, 0, 0], [1 / (1 + e**2), e**2 / (1 + e**2), 0], [e**2 / (2 * e**2 + 1), 1 / (2 * e**2 + 1), e**2 / (2 * e**2 + 1)]],
        [[1, 0, 0], [1 / (1 + e**4), e**4 / (1 + e**4), 0], [e**4 / (2 * e**4 + 1), 1 / (2 * e**4 + 1), e**4 / (2 * e**4 + 1)]],
    ])
    np.testing.assert_allclose(weights.torch, hand, atol=1e-4)
    np.testing.assert_allclose(weights.numpy, hand, atol=1e-4)
    assert w.max_diff < 1e-6


def test_walkthrough_cli_prints_every_station_and_json(capsys):
    assert main(["walkthrough", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    for needle in ("W_Q", "W_K", "W_V", "W_O", "h0.scores", "h0.mask", "h0.weights", "h0.concat",
                   "h0.mlp_hidden", "probs", "largest difference over all steps"):
        assert needle in text
    assert main(["walkthrough", "--json", "--ids", "4,0"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert data["ids"] == [4, 0] and data["max_diff"] < 1e-6
    masked = [s for s in data["steps"] if s["key"] == "h0.masked_scores"][0]["numpy"]
    assert masked[0][0][1] is None and masked[0][1][0] is not None  # head 0: the future is -inf
    probs = np.array([s for s in data["steps"] if s["key"] == "probs"][0]["numpy"])
    np.testing.assert_allclose(probs.sum(-1), 1.0)
    assert main(["walkthrough", "--ids", "1,9"]) == 2


# ------------------------------------------------------------------ attention weights and maps


def test_explicit_attention_weights_are_causal_distributions_and_reproduce_sdpa():
    model = _model(n_layer=3, n_head=4, n_embd=16).eval()
    T = 10
    ids = torch.randint(0, TINY["vocab_size"], (T,), generator=torch.Generator().manual_seed(1)).tolist()
    weights = amaps.attention_weights(model, ids)
    assert len(weights) == 3
    for w in weights:
        assert w.shape == (4, T, T)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
        assert np.all(w[:, np.triu_indices(T, k=1)[0], np.triu_indices(T, k=1)[1]] == 0.0)

    # weights @ V, heads merged and projected, must give what the SDPA kernel gives
    captured: dict[str, torch.Tensor] = {}
    hooks = []
    for i, block in enumerate(model.transformer.h):
        hooks.append(block.attn.c_attn.register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(f"qkv{i}", o)))
        hooks.append(block.attn.register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(f"out{i}", o)))
    model.set_attention_impl("sdpa")
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    C, H = 16, 4
    for i, block in enumerate(model.transformer.h):
        v = captured[f"qkv{i}"][0, :, 2 * C :].view(T, H, C // H).transpose(0, 1)  # (H, T, hs)
        y = torch.from_numpy(weights[i]) @ v  # (H, T, hs)
        y = y.transpose(0, 1).reshape(T, C)  # (T, C)
        with torch.no_grad():
            out = block.attn.c_proj(y)
        torch.testing.assert_close(out, captured[f"out{i}"][0], atol=1e-5, rtol=1e-5)


def _char_checkpoint(tmp_path, text: str, **overrides):
    from scratchlm.checkpoint import save_model_checkpoint
    from scratchlm.text.tokenizer import CharTokenizer

    tok = CharTokenizer.train([text])
    model = _model(**{**dict(vocab_size=tok.vocab_size, block_size=16), **overrides})
    return save_model_checkpoint(model, tok, tmp_path / "ckpt"), tok


def test_attention_png_has_the_expected_size_and_panels(tmp_path, capsys):
    import matplotlib.image

    ckpt, tok = _char_checkpoint(tmp_path, "the cat sat on the mat", n_layer=2, n_head=2)
    out = tmp_path / "maps" / "att.png"
    assert main(["attention", "--checkpoint", str(ckpt), "--prompt", "the cat", "--out", str(out), "--dpi", "50"]) == 0
    image = matplotlib.image.imread(out)
    assert image.shape[:2] == (2 * 3 * 50, (2 * 3 + 1) * 50)  # 2 layers x 2 heads of 3-inch panels, a colorbar inch
    assert not list(out.parent.glob(".*tmp"))

    assert main(["attention", "--checkpoint", str(ckpt), "--prompt", "at", "--out", str(out), "--dpi", "40",
                 "--layer", "1", "--head", "0", "--head", "1"]) == 0
    assert matplotlib.image.imread(out).shape[:2] == (1 * 3 * 40, (2 * 3 + 1) * 40)

    model_weights = amaps.attention_weights(_model(vocab_size=tok.vocab_size, block_size=16), tok.encode("the cat"))
    fig = amaps.attention_figure(model_weights, amaps.token_labels(tok, tok.encode("the cat")), layers=[0, 1], heads=[1])
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 2
    assert [t.get_text() for t in panels[0].get_xticklabels()] == list("the\u2423cat")

    capsys.readouterr()
    assert main(["attention", "--checkpoint", str(ckpt), "--prompt", "at", "--out", str(out), "--head", "5"]) == 2
    assert "head 5 does not exist" in capsys.readouterr().err


def _has_cjk_font() -> bool:
    if shutil.which("fc-list"):
        listed = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.strip()
        if not listed:
            return False
    return amaps.find_font_for("注意力") is not None


needs_cjk_font = pytest.mark.skipif(not _has_cjk_font(), reason="no font with Chinese glyphs is installed "
                                    "(apt-get install fonts-wqy-microhei or fonts-noto-cjk)")
PICTURES = Path(__file__).resolve().parents[1] / ".test-pictures"  # git-ignored: pictures for people to look at


def _draw_without_missing_glyphs(tok, prompt: str, out: Path) -> tuple[list[str], object]:
    ids = tok.encode(prompt)
    labels = amaps.token_labels(tok, ids)
    weights = amaps.attention_weights(_model(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2), ids)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = amaps.attention_figure(weights, labels)
        amaps.save_figure(fig, out)  # drawing is where matplotlib reports a missing glyph, one by one
    assert not [w for w in caught if "missing from font" in str(w.message) or "no installed font" in str(w.message)], \
        [str(w.message) for w in caught]
    assert (out.stat().st_mode & 0o777) == 0o644
    return labels, fig


@needs_cjk_font
def test_a_mixed_english_chinese_prompt_draws_every_label(tmp_path):
    """"The cat 爱 the mat。": Latin letters and ␣ from DejaVu Sans, 爱 and 。 from a CJK font, each
    character drawn by the first family of the list that has it (fontconfig says which have it)."""
    from scratchlm.text.tokenizer import CharTokenizer

    prompt = "The cat 爱 the mat。"
    tok = CharTokenizer.train([prompt])
    labels, fig = _draw_without_missing_glyphs(tok, prompt, tmp_path / "mixed.png")
    fonts, missing = amaps.fonts_for("".join(labels))
    assert missing == "" and fonts[0] == "DejaVu Sans" and len(fonts) >= 2
    if shutil.which("fc-list"):  # an independent judge of which families hold each glyph
        for ch in {c for c in "".join(labels) if not c.isspace()}:
            holders = subprocess.run(["fc-list", f":charset={ord(ch):x}", "family"], capture_output=True,
                                     text=True).stdout
            assert any(f in holders for f in fonts), (ch, fonts)
    panel = [ax for ax in fig.axes if ax.images][0]
    rotations = {t.get_text(): t.get_rotation() for t in panel.get_xticklabels()}
    assert rotations["爱"] == 0 and rotations["T"] == 90  # CJK upright, Latin turned
    assert len(fig.axes) == 3  # two heads and one colorbar
    PICTURES.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "mixed.png", PICTURES / "attention-mixed.png")


@needs_cjk_font
def test_a_byte_bpe_prompt_labels_whole_characters(tmp_path):
    from scratchlm.text.tokenizer import train_tokenizer

    prompt = "The cat 爱 the mat。"
    tok = train_tokenizer("bpe", ["The cat sat on the mat."] * 5, 270)  # no merges for 爱: three byte tokens
    labels, _ = _draw_without_missing_glyphs(tok, prompt, tmp_path / "bpe.png")
    assert "\ufffd" not in "".join(labels)
    assert [lab for lab in labels if "爱" in lab] == ["\u2423爱[1/3]", "\u2423爱[2/3]", "\u2423爱[3/3]"] or \
        [lab for lab in labels if "爱" in lab] == ["爱[1/3]", "爱[2/3]", "爱[3/3]"]
    PICTURES.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "bpe.png", PICTURES / "attention-byte-bpe.png")


def test_missing_font_falls_back_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(amaps, "fonts_for", lambda text: (["DejaVu Sans"], "\u2f00\u2f01\u2f02"))
    weights = [np.tril(np.ones((1, 3, 3))) / np.arange(1, 4)[:, None]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = amaps.attention_figure(weights, ["\u2f00", "\u2f01", "\u2f02"])
        amaps.save_figure(fig, tmp_path / "x.png")
    assert len(caught) == 1 and "no installed font" in str(caught[0].message)
    assert "fonts-noto-cjk" in str(caught[0].message)
    assert (tmp_path / "x.png").stat().st_size > 0


@pytest.mark.parametrize("overrides", [dict(), dict(pos_embedding="rope", n_head=1), dict(n_layer=2, n_head=1),
                                       dict(norm_position="post", activation="swiglu", n_embd=4, n_head=2),
                                       dict(vocab_size=12, n_embd=8, n_head=4, n_layer=3, block_size=6)])
def test_walkthrough_size_is_known_before_it_is_computed(overrides):
    """printed_size (which the CLI checks before any work) gives the lines format_walkthrough
    prints and the widest row's numbers, from the config alone; counted here on the output."""
    from scratchlm.inside.walkthrough import printed_size, walkthrough_of, format_walkthrough

    cfg = GPTConfig.from_name("hand", **overrides)
    torch.manual_seed(0)
    ids = [1, 2, 0][: cfg.block_size]
    lines = format_walkthrough(walkthrough_of(GPT(cfg).double(), ids)).split("\n")
    import re

    widest = max(len(group.split()) for line in lines for group in re.findall(r"\[([^\]]*)\]", line))
    assert printed_size(cfg, len(ids)) == (len(lines), widest)

"""The `tutorial` preset (issue 33): seed 001's hand example, 床前明 -> 月, as a model. V = 5
(床 前 明 月 山), 3 tokens, d = 2, one head, sinusoidal positions added to the embeddings,
post-norm (H1 = LayerNorm(X + A), H2 = LayerNorm(H1 + F)), an FFN 2 -> 4 -> 2 with ReLU and
biases, and no final norm: logits = H2 W_lm + b_lm.

Checked against the tutorial's formulas written out below in plain NumPy (not the NumPy reference,
which is under test too), the reference's hand-written gradients against autograd for models
without ln_f, the Hugging Face export's refusal, the decoding kernel's fallback, and old saved
configs (without the final_norm field) loading with ln_f as before."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from helpers import perturbed_model, variant_config
from scratchlm.cli.main import main
from scratchlm.errors import UserError
from scratchlm.generation.generate import generate_ids
from scratchlm.hf import hf_rotary
from scratchlm.hf.interop import export_hf, hf_config_from_gpt
from scratchlm.inside.walkthrough import (format_walkthrough, printed_size, torch_trace, walkthrough_model,
                                          walkthrough_of)
from scratchlm.inside.walkthrough_train import default_targets, format_training, training_size, training_walk
from scratchlm.kernels.decode_step import unsupported
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.reference.numpy_backward import gpt_backward
from scratchlm.reference.numpy_gpt import forward_trace, params_from_state_dict
from scratchlm import checkpoint as ck

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENS = "床,前,明,月,山"
IDS = [0, 1, 2]  # 床前明


# ------------------------------------------------------------------ the tutorial, by hand


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Each row minus its mean, over its standard deviation (eps 1e-5, as torch's LayerNorm)."""
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * gamma + beta


def tutorial_by_hand(ids: list[int], w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Seed 001's matrix pipeline (lines 143-151), rows times weight tables as the tutorial writes
    them: `w` holds E (V x d), W_Q, W_K, W_V, W_O (d x d), W1 (d x 4), b1, W2 (4 x d), b2, W_lm
    (d x V), b_lm, and the two norms' g1, be1, g2, be2."""
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)[:, None]
    PE = np.hstack([np.sin(pos), np.cos(pos)])  # d = 2: one sine and one cosine, both of frequency 1
    X = w["E"][ids] + PE  # [n x d]
    Q, K, V = X @ w["W_Q"], X @ w["W_K"], X @ w["W_V"]  # [n x d] each
    S = Q @ K.T / np.sqrt(2.0)  # [n x n]: one head of width d
    S[np.triu_indices(n, 1)] = -np.inf  # a word never sees the words after it
    M = np.exp(S - S.max(axis=1, keepdims=True))
    M /= M.sum(axis=1, keepdims=True)  # rows sum to 1
    A = M @ V @ w["W_O"]
    H1 = _layer_norm(X + A, w["g1"], w["be1"])
    F = np.maximum(H1 @ w["W1"] + w["b1"], 0.0) @ w["W2"] + w["b2"]  # [n x 4] in the middle
    H2 = _layer_norm(H1 + F, w["g2"], w["be2"])
    logits = H2 @ w["W_lm"] + w["b_lm"]  # [n x V]: H2 itself, no norm in between
    return dict(PE=PE, X=X, M=M, A=A, H1=H1, F=F, H2=H2, logits=logits)


def _from_state(state: dict) -> dict[str, np.ndarray]:
    """The tutorial's tables from a state dict: torch's (out, in) matrices transposed to (in, out)."""
    s = {k: v.detach().double().numpy() for k, v in state.items()}
    h = "transformer.h.0."
    W_Q, W_K, W_V = np.split(s[h + "attn.c_attn.weight"], 3)  # rows are [W_Q; W_K; W_V]
    assert h + "attn.c_attn.bias" not in s and h + "attn.c_proj.bias" not in s  # A = O W_O, no bias
    return dict(E=s["transformer.wte.weight"], W_Q=W_Q.T, W_K=W_K.T, W_V=W_V.T, W_O=s[h + "attn.c_proj.weight"].T,
                W1=s[h + "mlp.c_fc.weight"].T, b1=s[h + "mlp.c_fc.bias"], W2=s[h + "mlp.c_proj.weight"].T,
                b2=s[h + "mlp.c_proj.bias"], W_lm=s["lm_head.weight"].T, b_lm=s["lm_head.bias"],
                g1=s[h + "ln_1.weight"], be1=s[h + "ln_1.bias"], g2=s[h + "ln_2.weight"], be2=s[h + "ln_2.bias"])


def test_the_preset_is_the_tutorials_shape():
    cfg = GPTConfig.from_name("tutorial")
    assert (cfg.vocab_size, cfg.block_size, cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.mlp_hidden) == (5, 3, 2, 1, 1, 4)
    assert (cfg.pos_embedding, cfg.norm_position, cfg.activation, cfg.norm) == ("sinusoidal", "post", "relu", "layernorm")
    assert not cfg.final_norm and not cfg.tie_weights and cfg.norm_eps == 1e-5
    assert (cfg.qkv_bias, cfg.proj_bias, cfg.mlp_bias, cfg.lm_head_bias) == (False, False, True, True)
    model = GPT(cfg)
    assert not any("ln_f" in k for k in model.state_dict())
    # E 5x2; norms 2 x (2 + 2); W_Q, W_K, W_V, W_O 4 x 2x2; W1 2x4 + 4; W2 4x2 + 2; W_lm 2x5 + 5
    assert model.num_params() == 10 + 8 + 16 + 12 + 10 + 15
    assert GPTConfig.from_name("hand").final_norm  # the other hand preset keeps its ln_f


def test_the_tutorials_printed_numbers():
    """Its example rows: 明 = [-0.3, 0.8] at position 2 plus PE [0.91, -0.42] is [0.61, 0.38]."""
    model = walkthrough_model("tutorial")
    with torch.no_grad():
        model.transformer.wte.weight[:3] = torch.tensor([[0.2, -0.5], [0.9, 0.1], [-0.3, 0.8]])
    trace = torch_trace(model, IDS)
    np.testing.assert_allclose(trace["pos"][2], [0.91, -0.42], atol=0.005)
    np.testing.assert_allclose(trace["x0"][2], [0.61, 0.38], atol=0.005)
    np.testing.assert_allclose(trace["h0.ln_1"].sum(axis=1), 0.0, atol=1e-12)  # 2 numbers normalised: +a and -a


def test_forward_equals_the_tutorials_formulas():
    """Every weight, bias and norm parameter away from its start, in float64: the model, its
    traced stations and the NumPy reference against the pipeline written out above."""
    model = perturbed_model(GPTConfig.from_name("tutorial"), torch.float64, seed=3)
    hand = tutorial_by_hand(IDS, _from_state(model.state_dict()))
    with torch.no_grad():
        logits = model(torch.tensor([IDS]))[0][0].numpy()
    np.testing.assert_allclose(logits, hand["logits"], atol=1e-12)
    trace = torch_trace(model, IDS)
    for ours, theirs in (("x0", "X"), ("h0.weights", "M"), ("h0.attn_out", "A"), ("h0.ln_1", "H1"),
                         ("h0.mlp_out", "F"), ("h0.out", "H2")):
        np.testing.assert_allclose(np.squeeze(trace[ours]), hand[theirs], atol=1e-12, err_msg=ours)
    reference = forward_trace(np.array(IDS), params_from_state_dict(model.state_dict()), model.config)
    np.testing.assert_allclose(reference["logits"], hand["logits"], atol=1e-12)
    assert "ln_f" not in reference and "ln_f" not in trace  # no station for a norm that is not there


def _walk_json(capsys, *flags: str) -> dict:
    assert main(["walkthrough", "--preset", "tutorial", "--tokens", TOKENS, "--ids", "床,前,明", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_walks_the_tutorial_forward_and_training(capsys):
    report = _walk_json(capsys)
    w = {k: np.array(v) for k, v in report["weights"].items()}
    h = "transformer.h.0."
    tables = dict(E=w["transformer.wte.weight"], W_Q=w[h + "attn.W_Q"].T, W_K=w[h + "attn.W_K"].T,
                  W_V=w[h + "attn.W_V"].T, W_O=w[h + "attn.W_O"].T, W1=w[h + "mlp.c_fc.weight"].T,
                  b1=w[h + "mlp.c_fc.bias"], W2=w[h + "mlp.c_proj.weight"].T, b2=w[h + "mlp.c_proj.bias"],
                  W_lm=w["lm_head.weight"].T, b_lm=w["lm_head.bias"], g1=w[h + "ln_1.weight"],
                  be1=w[h + "ln_1.bias"], g2=w[h + "ln_2.weight"], be2=w[h + "ln_2.bias"])
    hand = tutorial_by_hand(IDS, tables)
    steps = {s["key"]: s for s in report["steps"]}
    assert "ln_f" not in steps and "no final norm" in steps["logits"]["title"]
    assert "b_O" not in steps["h0.attn_out"]["title"]  # W_O has no bias here
    for side in ("torch", "numpy"):
        np.testing.assert_allclose(np.array(steps["logits"][side]), hand["logits"], atol=1e-12)
        np.testing.assert_allclose(np.array(steps["h0.out"][side]), hand["H2"], atol=1e-12)
    assert report["labels"] == TOKENS.split(",") and report["config"]["final_norm"] is False
    training = report["training"]
    assert training["max_diff"] < 1e-12
    grads = {s["key"] for s in training["steps"] if s["key"].startswith("grad ")}
    assert "grad lm_head.bias" in grads and not any("ln_f" in g for g in grads)


def test_the_printed_walk_is_as_long_as_announced(capsys):
    """printed_size and training_size (checked before any work) count what is printed."""
    cfg = GPTConfig.from_name("tutorial")
    model = walkthrough_model(cfg)
    forward = format_walkthrough(walkthrough_of(model, IDS)).split("\n")
    training = format_training(training_walk(model, IDS, default_targets(IDS, 5)), IDS).split("\n")
    for lines, size in ((forward, printed_size(cfg, 3)), (training, training_size(cfg, 3))):
        widest = max(len(group.split()) for line in lines for group in re.findall(r"\[([^\]]*)\]", line))
        assert size == (len(lines), widest)
    assert main(["walkthrough", "--preset", "tutorial", "--tokens", TOKENS, "--ids", "床,前,明"]) == 0
    text = capsys.readouterr().out
    assert "ln_f" not in text and "no final norm" in text


# ------------------------------------------------------------------ gradients without ln_f

NO_FINAL_NORM = {
    "tutorial": GPTConfig.from_name("tutorial"),
    "tutorial-pre-norm": GPTConfig.from_name("tutorial", norm_position="pre"),
    "post-2-layers-learned": variant_config(where="post", final_norm=False),
    "pre-rope-rmsnorm-swiglu-tied": variant_config(pos="rope", norm="rmsnorm", act="swiglu", tie=True, bias="nobias",
                                                   final_norm=False),
}


@pytest.mark.parametrize("name", NO_FINAL_NORM)
def test_numpy_gradients_equal_autograd_without_a_final_norm(name):
    cfg = NO_FINAL_NORM[name]
    model = perturbed_model(cfg, torch.float64, seed=1)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=gen)
    logits, loss = model(idx, targets)
    loss.backward()
    params = params_from_state_dict(model.state_dict())
    if cfg.tie_weights:
        params.pop("lm_head.weight")  # the reference reads a missing head as the tied table
    trace = forward_trace(idx.numpy(), params, cfg, targets=targets.numpy())
    assert "ln_f" not in trace
    np.testing.assert_allclose(trace["logits"], logits.detach().numpy(), atol=1e-12)
    grads = gpt_backward(trace, params, cfg, targets.numpy())
    named = dict(model.named_parameters())
    assert set(grads) == set(named) and not any("ln_f" in k for k in grads)
    for key, p in named.items():
        np.testing.assert_allclose(grads[key], p.grad.numpy(), atol=1e-12, err_msg=key)


# ------------------------------------------------------------------ where a final norm is assumed


@pytest.mark.parametrize("overrides", [dict(), dict(norm_position="pre"), dict(norm_position="pre", pos_embedding="rope")])
def test_hugging_face_export_is_refused_in_one_line(tmp_path, overrides):
    """GPT-2, GPT-NeoX and Llama all end in a final norm; without one, the pre-norm variants here
    would otherwise be a GPT-2 and a GPT-NeoX."""
    cfg = GPTConfig.from_name("tutorial", **overrides)
    assert hf_rotary.architecture(cfg.replace(final_norm=True, norm_position="pre")) in ("gpt2", "gpt_neox")
    model = GPT(cfg)
    for attempt in (lambda: export_hf(model, tmp_path / "out"), lambda: hf_config_from_gpt(cfg)):
        with pytest.raises(UserError) as info:
            attempt()
        assert str(info.value).startswith("final_norm: ") and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_export_hf_command_says_why_in_one_line(tmp_path, capsys):
    ck.save_model_checkpoint(GPT(GPTConfig.from_name("tutorial")), None, tmp_path / "ckpt")
    assert main(["export-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: final_norm: ") and "\n" not in err and "--final_norm" in err
    assert not (tmp_path / "hf").exists()


def test_decoding_falls_back_to_the_model_without_a_final_norm():
    """The compiled step always normalises before the head, so it declines; generation goes
    through the model's own modules and gives the greedy ids of full forwards."""
    cfg = GPTConfig(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=8, final_norm=False)
    model = perturbed_model(cfg, torch.float32, seed=4)
    assert unsupported(model) == "final_norm false is not supported by the fused decoding step (it takes true)"
    assert unsupported(GPT(cfg.replace(final_norm=True))) != unsupported(model)
    idx = torch.tensor([[3, 7]])
    got = generate_ids(model, idx, max_new_tokens=8, greedy=True, dtype="float32")  # 8 steps: the decoding copy
    want = idx
    with torch.no_grad():
        for _ in range(8):
            want = torch.cat([want, model(want)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got, want)


# ------------------------------------------------------------------ saved configs


def test_a_config_saved_before_final_norm_existed_loads_with_ln_f(tmp_path):
    model = perturbed_model(GPTConfig.from_name("hand"), torch.float32)
    ckpt = ck.save_model_checkpoint(model, None, tmp_path / "old")
    path = ckpt / ck.CONFIG_FILE
    saved = json.loads(path.read_text())
    del saved["model"]["final_norm"]  # as every config.json written before the field
    path.write_text(json.dumps(saved))
    loaded, _, info = ck.load_model(ckpt)
    assert info["model_config"].final_norm and "transformer.ln_f.weight" in loaded.state_dict()
    idx = torch.tensor([[1, 3, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model(idx)[0])
    values = GPTConfig.from_name("hand").to_dict()
    del values["final_norm"]
    assert GPTConfig.from_dict(values, complete=True).final_norm
    del values["n_head"]  # any other missing field is still refused
    with pytest.raises(UserError, match="n_head"):
        GPTConfig.from_dict(values, complete=True)


def test_a_model_without_ln_f_saves_and_loads(tmp_path):
    model = perturbed_model(GPTConfig.from_name("tutorial"), torch.float32)
    ckpt = ck.save_model_checkpoint(model, None, tmp_path / "tutorial")
    assert json.loads((ckpt / ck.CONFIG_FILE).read_text())["model"]["final_norm"] is False
    loaded, _, _ = ck.load_model(ckpt)
    assert not loaded.config.final_norm
    idx = torch.tensor([IDS])
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model(idx)[0])

"""The walkthrough's training half (scratchlm/inside/walkthrough_train.py): loss, every gradient, one
AdamW step and the next token, torch beside the hand-written NumPy twin, equal to 1e-12 in
float64 on the hand preset and on three variants; and `scratchlm walkthrough` printing it."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchlm.cli.main import main
from scratchlm.inside.walkthrough import walkthrough_model
from scratchlm.inside.walkthrough_train import default_targets, format_training, training_size, training_walk
from scratchlm.model.config import GPTConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VARIANTS = {
    "hand": {},
    "rope-rmsnorm-swiglu-post": dict(pos_embedding="rope", n_head=1, norm="rmsnorm", activation="swiglu", norm_position="post"),
    "sinusoidal-gelu_tanh-tied": dict(pos_embedding="sinusoidal", activation="gelu_tanh", tie_weights=True,
                                      lm_head_bias=False),
    "none-gelu-qkv-bias-wider": dict(pos_embedding="none", activation="gelu", qkv_bias=True, n_embd=4, block_size=4),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_loss_gradients_and_adamw_step_equal_torch_to_1e_12(name):
    cfg = GPTConfig.from_name("hand", **VARIANTS[name])
    ids = [1, 3, 2, 4][: cfg.block_size]
    model = walkthrough_model(cfg, seed=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    walk = training_walk(model, ids, default_targets(ids, cfg.vocab_size), lr=0.02, seed=5)
    assert walk.max_diff < 1e-12, sorted((s.max_diff, s.key) for s in walk.steps)[-3:]
    keys = {s.key for s in walk.steps}
    assert {"per_position", "loss", "dlogits"} <= keys
    assert sum(k.startswith("grad ") for k in keys) == len(before) + 2 * cfg.n_layer  # c_attn shown as W_Q, W_K, W_V
    assert sum(k.startswith("adamw param ") for k in keys) == len(before)
    # the torch side is the model itself, stepped: every weight moved, by at most about lr
    for n, p in model.named_parameters():
        moved = (p.detach() - before[n]).abs()
        assert 0 < moved.max() <= 0.02 * 1.01 + 0.02 * 0.1, n
    assert walk.loss_after < float({s.key: s for s in walk.steps}["loss"].torch)
    # the next token: the argmax of the last row, and a draw that is a real token of that row
    probs = F.softmax(logits[0, -1], dim=-1)
    assert walk.greedy == (int(probs.argmax()), pytest.approx(float(probs.max()), abs=1e-12))
    assert walk.sampled[1] == pytest.approx(float(probs[walk.sampled[0]]), abs=1e-12)


def test_default_targets_shift_the_row():
    assert default_targets([0, 1, 2], 5) == [1, 2, 3]  # 床前明 -> 前明月
    assert default_targets([4], 5) == [0]


@pytest.mark.parametrize("name", VARIANTS)
def test_training_size_is_known_before_it_is_computed(name):
    cfg = GPTConfig.from_name("hand", **VARIANTS[name])
    ids = [1, 3, 2][: cfg.block_size]
    walk = training_walk(walkthrough_model(cfg), ids, default_targets(ids, cfg.vocab_size))
    lines = format_training(walk, ids).split("\n")
    widest = max(len(group.split()) for line in lines for group in re.findall(r"\[([^\]]*)\]", line))
    assert training_size(cfg, len(ids)) == (len(lines), widest)


def test_cli_walks_the_poem_to_its_next_token(capsys):
    """seed 001's example: V = 5 named 床 前 明 月 山, the input 床前明. The next-token lines name
    the token and its probability, as the model computes them."""
    assert main(["walkthrough", "--tokens", "床,前,明,月,山", "--ids", "床,前,明"]) == 0
    text = capsys.readouterr().out
    model = walkthrough_model("hand")
    with torch.no_grad():
        probs = F.softmax(model(torch.tensor([[0, 1, 2]]))[0][0, -1], dim=-1)
    top = int(probs.argmax())
    assert f"greedy (the argmax): {top} {'床前明月山'[top]}  p = {float(probs[top]):.4f}" in text
    assert "targets 1 前, 2 明, 3 月" in text
    assert "d loss / d transformer.h.0.attn.W_Q" in text and "one AdamW step" in text
    diff = float(re.search(r"gradients and AdamW step: (\S+)", text).group(1))
    assert diff < 1e-12

    assert main(["walkthrough", "--json", "--pos_embedding", "rope", "--n_head", "1", "--norm", "rmsnorm", "--targets", "0,0,0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["pos_embedding"] == "rope" and data["training"]["targets"] == [0, 0, 0]
    assert data["training"]["max_diff"] < 1e-12


@pytest.mark.parametrize("argv, words", [
    (["--tokens", "a,a,b"], "--tokens"),
    (["--tokens", "a,b,c", "--ids", "a,z"], "'z'"),
    (["--targets", "1,2"], "--targets: give 3"),
    (["--lr", "0"], "--lr"),
    (["--n_embd", "3"], "n_embd"),
])
def test_cli_refuses_bad_walkthrough_input_with_one_line(capsys, argv, words):
    assert main(["walkthrough", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


@pytest.fixture()
def char_checkpoint(tmp_path):
    from scratchlm.checkpoint import save_model_checkpoint
    from scratchlm.model.gpt import GPT
    from scratchlm.text.tokenizer import CharTokenizer

    tok = CharTokenizer.train(["ROMEO: what light through yonder window"])
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16,
                          pos_embedding="rope", dropout=0.1))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return save_model_checkpoint(model, tok, tmp_path / "ckpt"), tok, model


def test_cli_walks_a_checkpoint_with_one_head_in_full(capsys, char_checkpoint):
    ckpt, tok, model = char_checkpoint
    assert main(["walkthrough", "--checkpoint", str(ckpt), "--text", "ROMEO", "--layer", "1", "--head", "1",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ids"] == [tok.bos_id, *tok.encode("ROME")]  # the text is a training row: BOS + ids, x = row[:-1]
    assert data["training"]["targets"] == tok.encode("ROMEO")
    assert data["max_diff"] < 1e-12 and data["training"]["max_diff"] < 1e-12  # float64 on both sides, no dropout
    with torch.no_grad():
        probs = F.softmax(model.eval()(torch.tensor([data["ids"]]))[0][0, -1].double(), dim=-1)
    assert data["next"][0][0] == int(probs.argmax()) and abs(data["next"][0][2] - float(probs.max())) < 1e-6
    assert main(["walkthrough", "--checkpoint", str(ckpt), "--text", "ROMEO", "--layer", "1", "--head", "1"]) == 0
    text = capsys.readouterr().out
    assert "h1.weights, head 1" in text and "h0.weights, head" not in text and "h0.weights" in text


@pytest.mark.parametrize("argv, words", [
    (["--layer", "2"], "--layer 2 does not exist"),
    (["--n_layer", "3"], "drop --n_layer"),
    (["--preset", "hand"], "drop --preset"),
    (["--text", "zzz"], "'z'"),
])
def test_cli_checkpoint_walk_refuses_bad_input(capsys, char_checkpoint, argv, words):
    ckpt, _, _ = char_checkpoint
    assert main(["walkthrough", "--checkpoint", str(ckpt), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_printed_weights_are_those_before_the_step_and_post_norm_titles_say_so(capsys):
    """The weights block shows the model the forward pass used, not the one the AdamW step left
    behind; under --norm_position post the stations' titles name post-norm's inputs."""
    assert main(["walkthrough", "--json"]) == 0
    walked = json.loads(capsys.readouterr().out)
    want = walkthrough_model("hand").transformer.wte.weight.detach().numpy()
    np.testing.assert_array_equal(np.array(walked["weights"]["transformer.wte.weight"]), want)
    assert main(["walkthrough", "--forward-only", "--norm_position", "post"]) == 0
    text = capsys.readouterr().out
    assert "Q = x W_Q^T (post-norm" in text and "Q = ln_1(x)" not in text


def test_a_closed_pipe_ends_quietly():
    import subprocess
    import sys

    result = subprocess.run(f"{sys.executable} -m scratchlm walkthrough | head -1", shell=True, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.startswith("walkthrough:") and "error" not in result.stderr, result.stderr

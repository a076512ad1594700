"""Hugging Face GPT-2 as the judge: import, export, round trips, refusals, tokenizer files, CLI.

`transformers` is the one implementation here that nobody on this project wrote, so agreement
with it (logits to 1e-5, identical greedy continuations) is the strongest check of the model and
of the weight mapping. Every HF model is built locally from a GPT2Config: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.hf.interop import (
    export_hf,
    gpt_config_from_hf,
    gpt_from_hf,
    import_hf_dir,
    import_hf_tokenizer,
)
from scratchlm.model.gpt import GPT

from conftest import SHARED_DATA, needs_shared

GPT2_RANK_FILE = SHARED_DATA / "gpt2" / "gpt2.tiktoken"


def small_hf_config(**overrides) -> GPT2Config:
    values = dict(
        vocab_size=101, n_positions=48, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        # no end-of-text id, so HF's generate never stops before the 20 tokens we compare
        bos_token_id=None, eos_token_id=None,
    )
    values.update(overrides)
    return GPT2Config(**values)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int, scale: float = 0.1) -> None:
    """Make every tensor distinctive: biases and norm parameters too, not just HF's/our init,
    so a bias or gamma/beta mapped to the wrong place shows up in the logits."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen) * scale
        if "ln_" in name and name.endswith("weight"):
            p.copy_(1.0 + noise)
        else:
            p.copy_(noise)


def random_hf(cfg: GPT2Config, seed: int = 0, attn: str = "eager", scale: float = 0.1) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg)
    randomize(model, seed, scale)
    model.set_attn_implementation(attn)
    return model.eval()


def random_ours(cfg: GPTConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(cfg)
    randomize(model, seed)
    if model.lm_head.bias is not None:
        with torch.no_grad():
            model.lm_head.bias.zero_()  # GPT-2 has no head bias; a zero one is exportable
    return model.eval()


@torch.no_grad()
def our_greedy(model: GPT, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """The plain station 19 loop with a full forward per token: no cache, nothing shared with HF."""
    ids = prompt
    for _ in range(n):
        logits, _ = model(ids[:, -model.config.block_size :])
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@torch.no_grad()
def hf_greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    return model.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n, pad_token_id=0
    )


@torch.no_grad()
def assert_same_function(ours: GPT, hf, vocab: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (2, 20), generator=gen)
    hf_logits = hf(idx).logits
    our_logits, _ = ours(idx)
    assert our_logits.shape == hf_logits.shape
    assert torch.allclose(our_logits, hf_logits, rtol=0, atol=1e-5), (our_logits - hf_logits).abs().max()
    prompt = idx[:1, :5]
    theirs = hf_greedy(hf, prompt, 20)
    mine = our_greedy(ours, prompt, 20)
    assert theirs.shape == (1, 25)
    assert torch.equal(mine, theirs)


# ---------------------------------------------------------------- import


@pytest.mark.parametrize(
    "overrides,attn",
    [
        (dict(), "eager"),  # GPT-2's own switches: gelu_new, tied
        (dict(), "sdpa"),  # HF's default attention kernel agrees too
        (dict(activation_function="gelu", tie_word_embeddings=False), "eager"),
        (dict(activation_function="relu", n_inner=48, layer_norm_epsilon=1e-6), "eager"),
        (dict(activation_function="gelu_pytorch_tanh", n_layer=3, n_head=2), "sdpa"),
    ],
)
def test_import_in_memory_matches_transformers(overrides, attn):
    cfg = small_hf_config(**overrides)
    hf = random_hf(cfg, attn=attn)
    ours = gpt_from_hf(hf)
    assert ours.config.tie_weights == cfg.tie_word_embeddings
    assert ours.config.mlp_hidden == (cfg.n_inner or 4 * cfg.n_embd)
    assert_same_function(ours, hf, cfg.vocab_size)


def test_gpt2_defaults_are_the_gpt2_124m_preset():
    # GPT2Config() is GPT-2 small as OpenAI released it; dropout is off in our preset
    imported = gpt_config_from_hf(GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    assert imported == GPTConfig.from_name("gpt2-124m")


@pytest.mark.slow
def test_gpt2_124m_architecture_matches_transformers():
    # GPT-2 small's real sizes with random weights; short sequences keep it to seconds on a CPU
    cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(3)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # HF's init leaves biases 0 and gammas 1: make them count
        gen = torch.Generator().manual_seed(3)
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    assert hf.num_parameters() == 124_439_808
    ours = gpt_from_hf(hf)
    assert ours.config == GPTConfig.from_name("gpt2-124m")
    assert ours.num_params() == 124_439_808
    idx = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(ours(idx)[0], hf(idx).logits, rtol=0, atol=1e-5)
    prompt = idx[:1, :4]  # 10 tokens here (20 on the small models): each full forward costs
    assert torch.equal(our_greedy(ours, prompt, 10), hf_greedy(hf, prompt, 10))


def test_reorder_and_upcast_attn_is_the_same_math():
    # accepted on import because it only reorders the score computation; show HF agrees in fp32
    cfg = small_hf_config(reorder_and_upcast_attn=True)
    hf = random_hf(cfg, attn="eager")
    assert_same_function(gpt_from_hf(hf), hf, cfg.vocab_size)


def test_scale_attn_by_inverse_layer_idx_changes_the_math_so_it_is_refused():
    plain = random_hf(small_hf_config(), seed=4)
    scaled = random_hf(small_hf_config(scale_attn_by_inverse_layer_idx=True), seed=4)
    idx = torch.randint(0, 101, (1, 12))
    with torch.no_grad():
        assert not torch.allclose(plain(idx).logits, scaled(idx).logits, atol=1e-3)
    with pytest.raises(UserError, match="scale_attn_by_inverse_layer_idx"):
        gpt_from_hf(scaled)


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(add_cross_attention=True), "add_cross_attention"),
        (dict(scale_attn_weights=False), "scale_attn_weights"),
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (dict(activation_function="quick_gelu"), "activation_function"),
        (dict(model_type="llama"), "model_type"),
    ],
)
def test_import_refuses_what_it_cannot_represent(change, field):
    config = {**small_hf_config().to_dict(), **change}
    with pytest.raises(UserError) as info:
        gpt_config_from_hf(config)
    assert str(info.value).startswith(f"{field}:")


def test_import_reads_hub_style_keys_and_skips_old_mask_buffers():
    # GPT2Model checkpoints (as on the Hub) have no "transformer." prefix; old ones also stored the
    # causal mask as h.{i}.attn.bias and a fill value as h.{i}.attn.masked_bias
    cfg = small_hf_config()
    hf = random_hf(cfg, seed=9)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for i in range(cfg.n_layer):
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, cfg.n_positions, cfg.n_positions).tril()
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    assert_same_function(gpt_from_hf(state, cfg.to_dict()), hf, cfg.vocab_size)


def test_import_refuses_mismatched_weights(tmp_path):
    hf = random_hf(small_hf_config())
    state = hf.state_dict()
    with pytest.raises(UserError, match="transformer.h.0.mlp.c_fc.weight: shape"):
        gpt_from_hf(state, small_hf_config(n_inner=64))
    state.pop("transformer.h.1.ln_2.bias")
    with pytest.raises(UserError, match="missing transformer.h.1.ln_2.bias"):
        gpt_from_hf(state, small_hf_config())
    with pytest.raises(UserError, match="config.json"):
        import_hf_dir(tmp_path)


# ---------------------------------------------------------------- files: save_pretrained -> import -> export


def read_hf_dir(path: Path) -> tuple[dict, dict]:
    return json.loads((path / "config.json").read_text()), load_file(path / "model.safetensors")


@pytest.mark.parametrize("tied", [True, False])
def test_save_pretrained_import_export_round_trip(tmp_path, tied):
    cfg = small_hf_config(tie_word_embeddings=tied, activation_function="relu", n_inner=40)
    hf = random_hf(cfg, seed=5)
    hf.save_pretrained(tmp_path / "hf")
    ours = import_hf_dir(tmp_path / "hf")
    assert_same_function(ours, hf, cfg.vocab_size)
    export_hf(ours, tmp_path / "again")
    (cfg_a, weights_a), (cfg_b, weights_b) = read_hf_dir(tmp_path / "hf"), read_hf_dir(tmp_path / "again")
    assert sorted(weights_a) == sorted(weights_b)
    assert ("lm_head.weight" in weights_b) == (not tied)
    for key in weights_a:
        assert torch.equal(weights_a[key], weights_b[key]), key
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
                "layer_norm_epsilon", "tie_word_embeddings", "model_type"):
        assert cfg_a[key] == cfg_b[key], key


def test_pytorch_model_bin_is_read_with_weights_only(tmp_path):
    cfg = small_hf_config(tie_word_embeddings=False)
    hf = random_hf(cfg, seed=6)
    cfg.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert_same_function(import_hf_dir(tmp_path), hf, cfg.vocab_size)


class _NotATensor:
    """Unpickling this needs a global the weights-only loader does not allow."""


def test_pickle_with_code_is_refused(tmp_path):
    small_hf_config().save_pretrained(tmp_path)
    torch.save({"transformer.wte.weight": _NotATensor()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError, match="could not read the weights"):
        import_hf_dir(tmp_path)


# ---------------------------------------------------------------- export


EXPORTABLE = [
    # the seed's switches: ReLU, no Q/K/V bias, a (zero) lm_head bias, untied
    dict(),
    # GPT-2's switches
    dict(activation="gelu_tanh", tie_weights=True, qkv_bias=True, lm_head_bias=False, init="gpt2"),
    # exact GELU, more biases switched off, custom MLP width and eps
    dict(activation="gelu", proj_bias=False, mlp_bias=False, n_inner=48, norm_eps=1e-6, n_layer=3),
    # fixed positions: written as GPT-2's position table holding the sinusoid, or zeros for none
    dict(pos_embedding="sinusoidal"),
    dict(pos_embedding="none", activation="gelu_tanh"),
]


@pytest.mark.parametrize(
    "overrides,attn",
    [(EXPORTABLE[0], "eager"), (EXPORTABLE[0], "sdpa"), (EXPORTABLE[1], "sdpa")] + [(o, "eager") for o in EXPORTABLE[2:]],
)
def test_export_loads_in_transformers_with_same_logits_and_greedy(tmp_path, overrides, attn):
    cfg = GPTConfig(**{**dict(vocab_size=97, block_size=48, n_layer=2, n_head=4, n_embd=32), **overrides})
    ours = random_ours(cfg)
    export_hf(ours, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation=attn).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert hf.config.tie_word_embeddings == cfg.tie_weights
    assert_same_function(ours, hf, cfg.vocab_size)


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(norm="rmsnorm"), "norm"),
        (dict(activation="swiglu"), "activation"),
        (dict(norm_position="post"), "norm_position"),
    ],
)
def test_export_refuses_what_no_architecture_computes(tmp_path, change, field):
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, **change))
    with pytest.raises(UserError) as info:
        export_hf(model, tmp_path / "out")
    assert str(info.value).startswith(f"{field}:")
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temp dir


def test_export_refuses_a_nonzero_lm_head_bias(tmp_path):
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, lm_head_bias=True))
    with torch.no_grad():
        model.lm_head.bias[7] = 0.5
    with pytest.raises(UserError, match="^lm_head_bias:"):
        export_hf(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_export_never_overwrites_and_never_half_writes(tmp_path):
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        export_hf(model, busy)
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]

    empty = tmp_path / "empty"
    empty.mkdir()
    export_hf(model, empty)  # an empty directory is fine to fill
    assert (empty / "model.safetensors").is_file()

    class BrokenTokenizer:
        kind, bos_id, eos_id = "bpe", 0, 1

        def save(self, directory):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        export_hf(model, tmp_path / "half", tokenizer=BrokenTokenizer())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "empty"]  # no out_dir, no temp dir


# ---------------------------------------------------------------- tokenizer files


TEXTS = [
    "Hello world, it's a test.\n\nSecond paragraph   with  spaces\tand tabs",
    "naïve café, 日本語 and 🙂 emoji; don't we'll they've 12345",
    "<|endoftext|> typed by a user stays text",
]


def test_bpe_tokenizer_exports_for_autotokenizer(tmp_path):
    from scratchlm.text.tokenizer import train_tokenizer

    corpus = ["the quick brown fox jumps over the lazy dog. " * 20, "tokenizers learn merges from text. " * 20]
    tok = train_tokenizer("bpe", corpus, vocab_size=300)
    model = random_ours(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    export_hf(model, tmp_path / "out", tokenizer=tok)
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    for text in TEXTS:
        ids = tok.encode(text)
        assert hf_tok.encode(text, add_special_tokens=False) == ids
        assert hf_tok.decode(ids) == tok.decode(ids) == text
    assert hf_tok.convert_tokens_to_ids(hf_tok.eos_token) == tok.eos_id
    assert hf_tok.convert_tokens_to_ids(hf_tok.bos_token) == tok.bos_id
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (tok.bos_id, tok.eos_id)
    back = import_hf_tokenizer(tmp_path / "out")
    assert back.kind == "bpe" and all(back.encode(t) == tok.encode(t) for t in TEXTS)


def _char_export(tmp_path, text: str, unk: bool = False):
    from scratchlm.text.tokenizer import CharTokenizer

    tok = CharTokenizer(set(text), unk=unk)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16))
    export_hf(model, tmp_path / "out", tokenizer=tok)
    return tok, AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)


def test_char_tokenizer_exports_for_autotokenizer(tmp_path):
    """AutoTokenizer, offline, encodes and decodes as scratchlm's char tokenizer does: every
    character one id, special tokens typed as text stay characters, decoding glues the pieces."""
    text = "ROMEO: but soft! what light through yonder window breaks?\n\tnaïve café — 東京 🎉 <|bos|>"
    tok, hf = _char_export(tmp_path, text)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for piece in (text, "ROMEO:", "", " ", "\n\n", text[::-1]):
        assert hf(piece, add_special_tokens=False)["input_ids"] == tok.encode(piece), piece
        assert hf.decode(tok.encode(piece)) == tok.decode(tok.encode(piece))
    assert hf.bos_token_id == tok.bos_id and hf.eos_token_id == tok.eos_id and hf.pad_token_id == tok.eos_id
    assert hf.decode([tok.bos_id, *tok.encode("ROMEO"), tok.eos_id]) == tok.decode([tok.bos_id, *tok.encode("ROMEO"), tok.eos_id])
    from scratchlm.hf.interop import import_hf_tokenizer

    back = import_hf_tokenizer(tmp_path / "out")
    assert back.kind == "char" and back.chars == tok.chars and back.encode(text) == tok.encode(text)


def test_char_tokenizer_with_unk_exports_its_unk(tmp_path):
    tok, hf = _char_export(tmp_path, "abc ", unk=True)
    assert hf("abz", add_special_tokens=False)["input_ids"] == tok.encode("abz") == [1, 2, tok.unk_id]


@needs_shared("tinyshakespeare.txt")
def test_char_tokenizer_export_round_trips_300k_characters(tmp_path):
    text = (SHARED_DATA / "tinyshakespeare.txt").read_text(encoding="utf-8")[:300_000]
    tok, hf = _char_export(tmp_path, text)
    ids = hf(text, add_special_tokens=False)["input_ids"]
    assert ids == tok.encode(text) and hf.decode(ids) == text


@pytest.mark.slow
@needs_shared("gpt2/gpt2.tiktoken")
def test_gpt2_tokenizer_exports_for_autotokenizer(tmp_path):
    from scratchlm.text.tokenizer import GPT2Tokenizer

    tok = GPT2Tokenizer.from_rank_file(GPT2_RANK_FILE)
    model = random_ours(GPTConfig(vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=8,
                                  activation="gelu_tanh", tie_weights=True, lm_head_bias=False))
    export_hf(model, tmp_path / "out", tokenizer=tok)
    out = tmp_path / "out"
    assert {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    hf_tok = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = tok.encode(text)  # tiktoken's answer
        assert hf_tok.encode(text, add_special_tokens=False) == ids
        assert hf_tok.decode(ids) == text
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == 50256
    # and back: vocab.json/merges.txt -> tiktoken ranks
    back = import_hf_tokenizer(out)
    assert back.kind == "gpt2" and all(back.encode(t) == tok.encode(t) for t in TEXTS)


# ---------------------------------------------------------------- command line


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scratchlm", *map(str, args)],
                          capture_output=True, text=True, timeout=180)


def test_cli_export_and_import(tmp_path):
    from scratchlm.checkpoint import load_model, save_model_checkpoint

    # export-hf: a checkpoint -> a directory transformers loads
    cfg = GPTConfig(vocab_size=97, block_size=48, n_layer=2, n_head=4, n_embd=32)
    ours = random_ours(cfg)
    save_model_checkpoint(ours, None, tmp_path / "ckpt")
    result = run_cli("export-hf", tmp_path / "ckpt", tmp_path / "hf_out")
    assert result.returncode == 0, result.stderr
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_out").eval()
    assert_same_function(ours, hf, cfg.vocab_size)

    # import-hf: a save_pretrained directory -> a checkpoint load_model reads
    hf_cfg = small_hf_config()
    hf = random_hf(hf_cfg, seed=8)
    hf.save_pretrained(tmp_path / "hf_in")
    result = run_cli("import-hf", tmp_path / "hf_in", tmp_path / "imported")
    assert result.returncode == 0, result.stderr
    model, tokenizer, _ = load_model(tmp_path / "imported")
    assert tokenizer is None
    assert_same_function(model, hf, hf_cfg.vocab_size)


def test_cli_refusals_are_one_error_line(tmp_path):
    from scratchlm.checkpoint import save_model_checkpoint

    post = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, norm_position="post"))
    save_model_checkpoint(post, None, tmp_path / "ckpt")
    results = {
        "norm_position": run_cli("export-hf", tmp_path / "ckpt", tmp_path / "out"),
        "model_type": run_cli("import-hf", tmp_path / "ckpt", tmp_path / "x"),  # ours, not an HF directory
    }
    for named, result in results.items():
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "out") and not os.path.exists(tmp_path / "x")


# ---------------------------------------------------------------- a char tokenizer.json with other ids

ROMEO = "ROMEO: But soft, what light through yonder window breaks?\nnaïve café 東京"


def _renumbered_char_export(tmp_path: Path, seed: int, drop: str = "") -> Path:
    """export-hf's char tokenizer.json with its ids shuffled (characters and special tokens alike,
    in the vocabulary and among the added tokens) and the characters in `drop` deleted: the ids
    another program may have given, with gaps where characters went."""
    import random

    _char_export(tmp_path, ROMEO)
    path = tmp_path / "out" / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    order = list(range(len(vocab)))
    random.Random(seed).shuffle(order)
    spec["model"]["vocab"] = {p: order[i] for p, i in vocab.items() if p not in drop}
    for token in spec["added_tokens"]:
        token["id"] = spec["model"]["vocab"][token["content"]]
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return tmp_path / "out"


@pytest.mark.parametrize("drop", ["", "Rbw"], ids=["permuted", "permuted-with-3-gaps"])
def test_import_hf_keeps_a_char_tokenizers_ids_as_transformers_reads_them(tmp_path, drop):
    from scratchlm.checkpoint import load_model

    hf_dir = _renumbered_char_export(tmp_path, seed=3, drop=drop)
    hf = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    result = run_cli("import-hf", hf_dir, tmp_path / "imported")
    assert result.returncode == 0, result.stderr
    _, tok, _ = load_model(tmp_path / "imported")
    assert tok.kind == "char"
    kept = "".join(c for c in ROMEO if c not in drop)
    for text in ("ROMEO" if not drop else "OMEO", kept, kept[::-1], " \n"):
        assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"], text
    assert (tok.bos_id, tok.eos_id) == (hf.convert_tokens_to_ids("<|bos|>"), hf.convert_tokens_to_ids("<|endoftext|>"))
    # every id decodes as transformers decodes it: gaps to nothing, special tokens to their spelling
    every = list(range(tok.vocab_size))
    assert tok.decode(every) == hf.decode(every)
    if drop:  # a dropped character is unknown to both
        with pytest.raises(Exception):
            hf("R", add_special_tokens=False)
        with pytest.raises(UserError, match="'R'"):
            tok.encode("R")
        left = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
        assert tok.vocab_size == max(left.values()) + 1 > len(left)  # the gaps stay gaps
    # and out again: the ids survive a second export
    again = export_hf(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16)),
                      tmp_path / "again", tokenizer=tok)
    hf_again = AutoTokenizer.from_pretrained(again, local_files_only=True)
    assert hf_again(kept, add_special_tokens=False)["input_ids"] == hf(kept, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("change, words", [
    (lambda s: s.update(normalizer={"type": "Lowercase"}), "normalizer"),
    (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer"),
    (lambda s: s["model"]["vocab"].update(ab=999), "'ab'"),
    (lambda s: s["added_tokens"][0].update(id=1), "added tokens"),
    (lambda s: s["model"]["vocab"].update(z=10**6), "ids run to"),
])
def test_import_hf_refuses_a_char_tokenizer_it_would_read_otherwise(tmp_path, change, words):
    _char_export(tmp_path, "abc ")
    path = tmp_path / "out" / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    change(spec)
    path.write_text(json.dumps(spec), encoding="utf-8")
    result = run_cli("import-hf", tmp_path / "out", tmp_path / "imported")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert words in lines[0] and "tokenizer.json" in lines[0], lines[0]
    assert not (tmp_path / "imported").exists()

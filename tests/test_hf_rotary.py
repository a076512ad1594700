"""Rotary models exported to Hugging Face (scratchlm.hf.hf_rotary): GPT-NeoX for RoPE + LayerNorm +
GELU/ReLU, Llama for RoPE + RMSNorm + SwiGLU. The exported folder is loaded offline by
transformers' own classes and must give the same logits (1e-4) and the same greedy tokens."""

from __future__ import annotations

import pytest
import torch

from scratchlm.errors import UserError
from scratchlm.generation.generate import generate_ids
from scratchlm.hf.hf_rotary import architecture
from scratchlm.hf.interop import export_hf
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = dict(vocab_size=61, block_size=32, n_layer=2, n_head=4, n_embd=32, pos_embedding="rope", lm_head_bias=False)
CASES = {
    "neox-gelu": dict(norm="layernorm", activation="gelu"),
    "neox-gelu_tanh-tied-qkv-bias": dict(norm="layernorm", activation="gelu_tanh", tie_weights=True, qkv_bias=True),
    "neox-relu-no-biases": dict(norm="layernorm", activation="relu", proj_bias=False, mlp_bias=False, rope_theta=500.0),
    "llama": dict(norm="rmsnorm", activation="swiglu", mlp_bias=False, proj_bias=False),
    "llama-biases-tied": dict(norm="rmsnorm", activation="swiglu", qkv_bias=True, tie_weights=True, n_inner=48),
    "llama-gqa": dict(norm="rmsnorm", activation="swiglu", n_kv_head=2, qkv_bias=True, proj_bias=False),
}


def _model(seed: int, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():  # every parameter away from its initial value, so a misplaced one shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("name", CASES)
def test_export_loads_in_transformers_with_the_same_logits_and_greedy_tokens(tmp_path, name):
    model = _model(1, **CASES[name])
    arch = architecture(model.config)
    assert arch == ("llama" if name.startswith("llama") else "gpt_neox")
    export_hf(model, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    assert type(hf).__name__ == {"gpt_neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM"}[arch]
    idx = torch.randint(0, BASE["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(input_ids=idx).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    prompt = idx[:1, :5]
    want = generate_ids(model, prompt, max_new_tokens=12, greedy=True, use_cache=False)
    got = hf.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("overrides, field, words", [
    (dict(pos_embedding="rope", norm="rmsnorm", activation="gelu"), "activation", "--activation swiglu"),
    (dict(pos_embedding="rope", norm="layernorm", activation="swiglu"), "norm", "Llama --norm rmsnorm"),
    (dict(pos_embedding="learned", norm="rmsnorm", activation="gelu"), "norm", "--norm layernorm"),
    (dict(pos_embedding="sinusoidal", activation="swiglu"), "activation", "--pos_embedding rope"),
    (dict(norm_position="post"), "norm_position", "--norm_position pre"),
])
def test_what_no_architecture_computes_is_refused_with_the_flags_that_would_do(overrides, field, words):
    with pytest.raises(UserError) as info:
        architecture(GPTConfig(**{**BASE, **overrides}))
    assert str(info.value).startswith(f"{field}:") and words in str(info.value)


def test_a_nonzero_head_bias_is_refused_with_its_flag(tmp_path):
    model = _model(3, **{**CASES["neox-gelu"], "lm_head_bias": True})
    with pytest.raises(UserError, match="--no-lm_head_bias"):
        export_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("name", ["gpt2", "neox-gelu", "neox-gelu_tanh-tied-qkv-bias"])
def test_a_head_bias_is_folded_into_ln_f_when_the_vocabulary_fits_the_width(tmp_path, name):
    """V = 29 <= C = 32: W delta = b has an exact solution, so ln_f's beta + delta gives the same
    logits without a head bias (the char presets' case). transformers is the judge."""
    overrides = {"pos_embedding": "learned"} if name == "gpt2" else CASES[name]
    model = _model(7, **{**overrides, "vocab_size": 29, "lm_head_bias": True})
    assert model.lm_head.bias.abs().max() > 0.05
    beta_before = model.transformer.ln_f.bias.detach().clone()
    export_hf(model, tmp_path / "hf")
    assert torch.equal(model.transformer.ln_f.bias, beta_before)  # the model itself is untouched
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    idx = torch.randint(0, 29, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=idx).logits, model(idx)[0], atol=1e-4, rtol=1e-4)


def test_a_head_bias_without_a_beta_to_fold_into_is_refused(tmp_path):
    model = _model(8, **{**CASES["llama"], "vocab_size": 29, "lm_head_bias": True})  # RMSNorm: no beta
    with pytest.raises(UserError, match="--no-lm_head_bias"):
        export_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("name, kind", [("gpt2", "bpe"), ("neox-gelu", "bpe"), ("llama", "bpe"), ("neox-gelu", "char"),
                                        ("gpt2", "char")])
def test_a_pipeline_with_default_arguments_continues_as_scratchlm_generate_greedy(tmp_path, name, kind):
    """`pipeline("text-generation", model=DIR)(prompt)` with no arguments: generation_config.json
    caps prompt plus continuation at the context (transformers' own default of 20 new tokens ran
    past it) and asks for greedy decoding; a pad token lets it batch. The text equals scratchlm's
    greedy continuation of the same length."""
    from scratchlm.generation.generate import generate
    from scratchlm.text.tokenizer import train_tokenizer

    text = ["the king speaks to the queen of the night and the day"] * 30
    tok = train_tokenizer("bpe", text, 300) if kind == "bpe" else train_tokenizer("char", text)
    overrides = {"pos_embedding": "learned"} if name == "gpt2" else CASES[name]
    model = _model(5, **{**overrides, "vocab_size": tok.vocab_size, "block_size": 24})
    export_hf(model, tmp_path / "hf", tok)
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), device="cpu")
    prompt = "the king"
    out = pipe(prompt)[0]["generated_text"]
    n_prompt = len(tok.encode(prompt))
    want = generate(model, tok, prompt, max_new_tokens=24 - n_prompt, greedy=True)
    assert out == prompt + want.text
    assert len(pipe([prompt, "the queen of"], batch_size=2)) == 2  # batched: a pad token exists


@pytest.mark.parametrize("name", CASES)
def test_import_hf_reads_the_export_back(tmp_path, name):
    from scratchlm.hf.interop import import_hf_dir

    model = _model(6, **CASES[name])
    export_hf(model, tmp_path / "hf")
    back = import_hf_dir(tmp_path / "hf")
    idx = torch.randint(0, BASE["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(back(idx)[0], model(idx)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["gpt_neox", "llama", "llama-gqa"])
def test_import_hf_reads_a_model_transformers_made(tmp_path, arch):
    """A random model built and saved by transformers itself, then imported: the same logits
    (llama-gqa: 4 query heads sharing 2 key/value heads, read as n_kv_head=2)."""
    common = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                  max_position_embeddings=32)
    if arch == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(**common, use_parallel_residual=False, rotary_pct=1.0, hidden_act="gelu")
        hf = transformers.GPTNeoXForCausalLM(cfg)
    else:
        kv_heads = 2 if arch == "llama-gqa" else 4
        cfg = transformers.LlamaConfig(**common, num_key_value_heads=kv_heads, mlp_bias=True, attention_bias=True)
        hf = transformers.LlamaForCausalLM(cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.eval().save_pretrained(tmp_path / "hf")
    from scratchlm.hf.interop import import_hf_dir

    model = import_hf_dir(tmp_path / "hf")
    assert model.config.kv_heads == getattr(cfg, "num_key_value_heads", 4)
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(input_ids=idx).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch, change, field", [
    ("gpt_neox", dict(use_parallel_residual=True), "use_parallel_residual"),
    ("gpt_neox", dict(rotary_pct=0.25), "rotary_pct"),
    ("llama", dict(num_key_value_heads=3), "num_key_value_heads"),
])
def test_import_hf_refuses_what_scratchlm_does_not_compute(arch, change, field):
    from scratchlm.hf.hf_rotary import config_from_hf

    hf = {**dict(model_type=arch, vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                 intermediate_size=48, max_position_embeddings=32, use_parallel_residual=False), **change}
    with pytest.raises(UserError) as info:
        config_from_hf(hf)
    assert str(info.value).startswith(f"{field}:")

"""LoRA (scratchlm/model/lora.py and a LoRA run, scratchlm/training/lora_run.py): with B = 0 the
adapted model gives the base's logits exactly; an adapted matrix computes x W^T + b + (alpha / r)
x A^T B^T by hand in float64 and what peft's own LoRA layers compute with the same A and B; merged
equals unmerged within 1e-5; a LoRA fine-tune trains only the adapters and the new rows, its
checkpoints hold only them beside one copy of the base, it resumes bit for bit, and a base that is
not the adapters' own is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import assert_same_weights
from scratchlm.checkpoint import load_model
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.model.lora import LoRALinear, add_lora, count_trainable, merge_lora, trainable_state
from scratchlm.training.train import TrainConfig, resume_config, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VARIANTS = [dict(), dict(tie_weights=False, lm_head_bias=True), dict(pos_embedding="rope", norm="rmsnorm", activation="swiglu",
                                                                     qkv_bias=False, mlp_bias=False)]


def _model(seed=0, **variant) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0, **variant)).eval()


def _nudge(model, seed=1):
    """Every trainable tensor moved off its start (B off zero), as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("variant", VARIANTS, ids=["gpt", "untied", "llama"])
def test_b_zero_is_the_base_exactly_and_merged_equals_unmerged(variant):
    base = _model(**variant)
    x = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        want, _ = base(x)
        adapted = add_lora(_model(**variant), rank=4, alpha=8.0, new_rows_from=45)
        got, _ = adapted(x)
        assert torch.equal(got, want)
        _nudge(adapted)
        unmerged, _ = adapted(x)
        merged, _ = merge_lora(adapted)(x)
    assert not torch.equal(unmerged, want)
    assert torch.allclose(merged, unmerged, atol=1e-5, rtol=0)
    names = set(trainable_state(adapted))
    assert all(n.endswith(("lora_A", "lora_B", ".rows")) for n in names)
    assert {n for n, p in adapted.named_parameters() if p.requires_grad} == names


def test_an_adapted_matrix_is_the_formula_by_hand():
    torch.manual_seed(3)
    lin = torch.nn.Linear(6, 5)
    lora = LoRALinear(lin, rank=2, alpha=3.0)
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(4, 6)
    W, b, A, B = (t.detach().double().numpy() for t in (lin.weight, lin.bias, lora.lora_A, lora.lora_B))
    by_hand = x.double().numpy() @ W.T + b + (3.0 / 2) * (x.double().numpy() @ A.T) @ B.T
    np.testing.assert_allclose(lora(x).detach().double().numpy(), by_hand, rtol=1e-5, atol=1e-6)
    assert [c[3] for c in count_trainable(_model().config, 4)] == [4 * (16 + 48), 4 * (16 + 16), 4 * (16 + 64), 4 * (64 + 16)]


def test_the_adapted_model_computes_what_peft_computes_with_the_same_matrices():
    peft = pytest.importorskip("peft", reason="peft (dev extra) judges the LoRA layers")
    ours = add_lora(_model(), rank=4, alpha=8.0)
    _nudge(ours)
    theirs = peft.inject_adapter_in_model(
        peft.LoraConfig(r=4, lora_alpha=8.0, lora_dropout=0.0, target_modules=["c_attn", "c_proj", "c_fc"]), _model())
    with torch.no_grad():
        for name, module in ours.named_modules():
            if isinstance(module, LoRALinear):
                layer = theirs.get_submodule(name)
                layer.lora_A["default"].weight.copy_(module.lora_A)
                layer.lora_B["default"].weight.copy_(module.lora_B)
        x = torch.randint(0, 50, (2, 12))
        assert torch.allclose(ours(x)[0], theirs(x)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", [dict(tie_weights=True), dict(tie_weights=False, lm_head_bias=True)],
                         ids=["tied", "untied"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain-loss", "fused-loss"])
def test_the_new_rows_get_the_gradient_the_whole_matrix_would_give_them(variant, fused, monkeypatch):
    """The trained new rows (3 of 50 ids) against the base model with every weight trainable: their
    gradient (embedding and head use, tied or not) is that model's gradient's last 3 rows, on the
    plain loss and on the chunked one that reads the head as its two blocks of rows."""
    import scratchlm.model.gpt as gpt_module

    monkeypatch.setattr(gpt_module, "FUSED_LOSS_MIN_SCORES", 1 if fused else 1 << 40)
    x, y = torch.randint(0, 50, (2, 12)), torch.randint(0, 50, (2, 12))
    x[0, :4], y[1, :4] = torch.tensor([47, 48, 49, 47]), torch.tensor([49, 48, 47, 49])  # the new ids, in and out
    whole = _model(**variant).train()
    _, loss = whole(x, y, return_logits=False)
    loss.backward()
    adapted = add_lora(_model(**variant).train(), rank=4, alpha=8.0, new_rows_from=47)
    _, adapted_loss = adapted(x, y, return_logits=False)
    adapted_loss.backward()
    torch.testing.assert_close(adapted_loss, loss)
    grads = {n: p.grad for n, p in adapted.named_parameters() if n.endswith(".rows")}
    torch.testing.assert_close(grads["transformer.wte.new.rows"], whole.transformer.wte.weight.grad[47:])
    if variant["tie_weights"]:  # one NewRows for both uses
        assert list(grads) == ["transformer.wte.new.rows"]
    else:
        torch.testing.assert_close(grads["lm_head.new.rows"], whole.lm_head.weight.grad[47:])
        torch.testing.assert_close(adapted.lm_head.bias, whole.lm_head.bias)  # frozen, its grad none
        assert adapted.lm_head.bias.grad is None


ARCHS = {"gpt2": dict(lm_head_bias=False), "gpt_neox": dict(pos_embedding="rope", lm_head_bias=False),
         "llama": dict(pos_embedding="rope", norm="rmsnorm", activation="swiglu", qkv_bias=False, proj_bias=False,
                       mlp_bias=False, lm_head_bias=False, tie_weights=False)}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_peft_puts_the_exported_adapter_on_the_exported_base_and_gives_the_merged_exports_logits(tmp_path, arch):
    peft = pytest.importorskip("peft", reason="peft (dev extra) judges the adapter export")
    transformers = pytest.importorskip("transformers")
    from scratchlm.hf.interop import export_hf
    from scratchlm.hf.peft_export import export_peft

    adapted = add_lora(_model(**ARCHS[arch]), rank=4, alpha=8.0, new_rows_from=45)
    _nudge(adapted)
    export_peft(adapted, tmp_path / "apart")
    export_hf(merge_lora(adapted), tmp_path / "merged")
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["model_type"] == arch
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "apart" / "base").eval()
    x = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        plain = base(x).logits
        joined = peft.PeftModel.from_pretrained(base, tmp_path / "apart" / "adapter").eval()(x).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(x).logits
    assert torch.allclose(joined, merged, atol=1e-5, rtol=0)
    assert not torch.allclose(plain, merged, atol=1e-3, rtol=0)  # the adapter is what makes the difference


# --- a LoRA run

POEM = "床前看月光，疑是地上霜。举头望山月，低头思故乡。\n"
CHATS = [("写一首诗。", "床前看月光，疑是地上霜。"), ("题为《月》。", "举头望山月，低头思故乡。"),
         ("再写一首。", "床前看月光。"), ("写《霜》。", "疑是地上霜。"), ("写山。", "举头望山月。"),
         ("写月。", "床前看月光。"), ("写故乡。", "低头思故乡。"), ("写地上。", "疑是地上霜。")]


def _config(tmp_path: Path, name: str, **overrides) -> TrainConfig:
    values = dict(tokenizer="char", batch_size=2, max_steps=4, lr=1e-2, warmup_steps=1, eval_interval=0, eval_iters=1,
                  log_interval=1, checkpoint_interval=2, sample_tokens=0, progress="quiet", out_dir=str(tmp_path / name),
                  data_cache=str(tmp_path / "data"), threads=1)
    return TrainConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lora-base")
    os.environ.setdefault("SCRATCHLM_CACHE", str(tmp / "cache"))
    (tmp / "poem.txt").write_text(POEM * 40, encoding="utf-8")
    train(_config(tmp, "run", data=str(tmp / "poem.txt"), max_steps=10,
                  model_overrides=dict(n_layer=1, n_head=2, n_embd=32, block_size=32, dropout=0.0, lm_head_bias=False)))
    return tmp / "run"


def _lora_sft(tmp_path, name, base, **overrides) -> TrainConfig:
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CHATS]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return _config(tmp_path, name, data=str(path), stage="sft", init_from=str(base), val_fraction=0.25, lora_rank=4,
                   **overrides)


def test_a_lora_fine_tune_trains_only_the_adapters_and_saves_only_them(tmp_path, base):
    train(_lora_sft(tmp_path, "lora", base))
    run = tmp_path / "lora"
    source, _, _ = load_model(base)
    copy_of_base, _, _ = load_model(run / "base")
    for name, tensor in source.state_dict().items():  # the base is the source, its old rows untouched
        assert torch.equal(copy_of_base.state_dict()[name][: len(tensor)], tensor), name
    from safetensors.torch import load_file

    saved = load_file(str(run / "ckpt-00000004" / "model.safetensors"))
    assert saved and all(n.endswith(("lora_A", "lora_B", ".rows")) for n in saved)
    adapted, _, _ = load_model(run, merged=False)
    merged, _, _ = load_model(run)
    assert isinstance(merged.transformer.h[0].attn.c_attn, torch.nn.Linear)
    with torch.no_grad():
        assert not torch.equal(merged.transformer.h[0].attn.c_attn.weight, copy_of_base.transformer.h[0].attn.c_attn.weight)
        x = torch.randint(0, merged.config.vocab_size, (1, 10))
        assert torch.allclose(merged(x)[0], adapted(x)[0], atol=1e-5, rtol=0)


def test_a_lora_fine_tune_resumes_exactly(tmp_path, base):
    whole = train(_lora_sft(tmp_path, "whole", base))
    train(_lora_sft(tmp_path, "split", base, max_steps=2))
    again = train(resume_config(tmp_path / "split", max_steps=4))
    assert again.losses == {s: whole.losses[s] for s in (3, 4)}
    assert_same_weights(tmp_path / "whole", tmp_path / "split")


def test_adapters_on_another_base_and_lora_without_a_source_are_one_line(tmp_path, base):
    train(_lora_sft(tmp_path, "lora", base, max_steps=2))
    other = tmp_path / "other"
    train(_lora_sft(tmp_path, "other", base, max_steps=2, seed=5))
    weights = tmp_path / "lora" / "base" / "model.safetensors"
    weights.write_bytes((other / "ckpt-00000002" / "model.safetensors").read_bytes())  # not the base's bytes
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    for args, words in ((["generate", "--checkpoint", str(tmp_path / "lora"), "--prompt", "床"],
                         "is not the base these adapters were trained on"),
                        (["train", "--lora_rank", "4", "--out_dir", str(tmp_path / "none")], "give --init_from")):
        proc = subprocess.run([sys.executable, "-m", "scratchlm", *args], capture_output=True, text=True, timeout=300,
                              env=env)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "none").exists()


def test_inspect_counts_what_lora_trains_as_r_times_d_in_plus_d_out():
    proc = subprocess.run([sys.executable, "-m", "scratchlm", "inspect", "--n_layer", "3", "--n_embd", "64", "--n_head", "4",
                           "--lora-rank", "8", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lora = json.loads(proc.stdout)["lora"]
    C = 64  # by hand: W_QKV C -> 3C, W_O C -> C, the MLP C -> 4C and 4C -> C
    assert lora["trainable"] == 3 * 8 * ((C + 3 * C) + (C + C) + (C + 4 * C) + (4 * C + C))
    model = add_lora(GPT(GPTConfig.from_name("smoke", n_layer=3, n_embd=64, n_head=4)), rank=8, alpha=16.0)
    assert lora["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)  # brute force


def test_export_hf_of_a_lora_run_is_the_merged_model_in_transformers(tmp_path, base):
    transformers = pytest.importorskip("transformers")
    train(_lora_sft(tmp_path, "lora", base))
    out = tmp_path / "hf"
    proc = subprocess.run([sys.executable, "-m", "scratchlm", "export-hf", str(tmp_path / "lora"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "scratchlm", "export-hf", str(tmp_path / "lora"), str(tmp_path / "apart"),
                           "--lora", "adapter"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "apart" / "adapter").iterdir()) == ["adapter_config.json",
                                                                                  "adapter_model.safetensors"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    merged, _, _ = load_model(tmp_path / "lora")
    plain_base, _, _ = load_model(tmp_path / "lora" / "base")
    x = torch.randint(0, merged.config.vocab_size, (2, 12))
    with torch.no_grad():
        theirs = hf(x).logits
        assert torch.allclose(theirs, merged(x)[0], atol=1e-4, rtol=0)
        assert not torch.allclose(theirs, plain_base(x)[0], atol=1e-4, rtol=0)  # the adapters are in it


def test_train_init_from_with_lora_adapts_the_source_and_keeps_its_vocabulary(tmp_path, base):
    (tmp_path / "more.txt").write_text(POEM * 20, encoding="utf-8")
    train(_config(tmp_path, "more", data=str(tmp_path / "more.txt"), init_from=str(base), lora_rank=2, max_steps=2))
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "more" / "ckpt-00000002" / "model.safetensors"))
    assert saved and all(n.endswith(("lora_A", "lora_B")) for n in saved)  # no new ids: no rows train
    source, _, _ = load_model(base)
    copy_of_base, _, _ = load_model(tmp_path / "more" / "base")
    assert list(copy_of_base.state_dict()) == list(source.state_dict())
    assert all(torch.equal(copy_of_base.state_dict()[n], t) for n, t in source.state_dict().items())

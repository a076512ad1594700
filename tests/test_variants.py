"""Every value of every variant field through every adapter (scratchlm.model.variants): each either
declines, saying which field, or computes what the plain model and the NumPy twin compute.

The adapters: the training copy (forward and gradients), the decoding copy and the fused decoding
step (a prompt and one-token steps on a KV cache), each Hugging Face architecture (transformers'
logits), each llama.cpp architecture (the file written, and, where llama-cpp-python is installed,
its logits), the parameter count (the model's own parameters) and the training memory estimate
(the bytes autograd saves). A value added to the config's lists (a fake one here) makes every one
of them decline or refuse.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import pkgutil

import numpy as np
import pytest
import torch

import scratchlm
from scratchlm.errors import ConfigError, UserError
from scratchlm.gguf.export import export_gguf
from scratchlm.gguf.tensors import GGUF_ARCHITECTURES, gguf_arch
from scratchlm.hf import hf_rotary
from scratchlm.hf.interop import export_hf
from scratchlm.kernels import cpu_kernels
from scratchlm.kernels.decode_step import FUSED_STEP, unsupported
from scratchlm.kernels.decoding_copy import DECODING_COPY, Decoder, DecodingLinear, decoding_model
from scratchlm.kernels.training_copy import TRAINING_COPY, TrainingAttention, attach_training_kernels, training_copy_declines
from scratchlm.machine.flops import PARAMETER_COUNT, count_params
from scratchlm.machine.memory import footprint
from scratchlm.machine.training_memory import SAVED_ACTIVATIONS, memory_estimate
from scratchlm.model import config as model_config
from scratchlm.model import variants
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, KVCache
from scratchlm.model.variants import Supports, variant_fields
from scratchlm.reference.numpy_gpt import gpt_forward, params_from_state_dict
from scratchlm.text.tokenizer import CharTokenizer

from helpers import llama_cpp_scores, saved_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "the king speaks to the queen of night and day; ROMEO: my lord!\n"
TOKENIZER = CharTokenizer.train([TEXT])
# heads of 16 (the compiled training attention's smallest), no lm_head bias (every exporter's head has none)
BASE = dict(vocab_size=TOKENIZER.vocab_size, block_size=24, n_layer=2, n_head=2, n_embd=32, lm_head_bias=False)
# what each adapter declares, by name: a Supports declared anywhere in the package and missing here fails
DECLARED = {"training copy": TRAINING_COPY, "decoding copy": DECODING_COPY, "fused step": FUSED_STEP,
            **{f"hf {name}": s for name, s in hf_rotary.ARCHITECTURES.items()},
            **{f"gguf {name}": s for name, s in GGUF_ARCHITECTURES.items()},
            "parameter count": PARAMETER_COUNT, "training memory": SAVED_ACTIVATIONS}


def one_value_each() -> dict[str, dict]:
    """Each value of each variant field, the rest as BASE, and the three layouts exporters know."""
    as_fields = {"grouped_kv": lambda grouped: {"n_kv_head": 1 if grouped else None}}  # 2 query heads, 1 K/V head
    cases = {f"{field}={value}": as_fields.get(field, lambda v, f=field: {f: v})(value)
             for field, values in variant_fields().items() for value in values}
    cases["gpt2"] = dict(activation="gelu_tanh", qkv_bias=True, tie_weights=True)
    cases["neox"] = dict(pos_embedding="rope", activation="gelu")
    cases["llama"] = dict(pos_embedding="rope", norm="rmsnorm", activation="swiglu", mlp_bias=False, proj_bias=False)
    cases["llama-gqa"] = dict(cases["llama"], n_head=4, n_kv_head=2, qkv_bias=True)  # heads of 8: 2 query heads a group
    return cases


CASES = one_value_each()


def model_of(overrides: dict, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():  # every parameter away from its initial value, so a misplaced one shows
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def ids(seed: int = 1, length: int = 20) -> torch.Tensor:
    return torch.randint(0, BASE["vocab_size"], (2, length), generator=torch.Generator().manual_seed(seed))


def names_field(reason: str | None, field_prefixes: tuple[str, ...]) -> bool:
    return reason is not None and reason.startswith(field_prefixes) and "\n" not in reason


def test_every_declared_allow_list_is_walked_here():
    """A Supports at the top of any scratchlm module is one of DECLARED (a new adapter cannot
    escape this file), and each lists only fields and values the config has."""
    found = {}
    for info in pkgutil.walk_packages(scratchlm.__path__, "scratchlm."):
        if info.name.startswith("scratchlm.serve.static") or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, Supports):
                found[id(value)] = f"{info.name}.{name}"
            elif isinstance(value, dict) and value and all(isinstance(v, Supports) for v in value.values()):
                found.update({id(v): f"{info.name}.{name}[{k}]" for k, v in value.items()})
    assert set(found) == {id(s) for s in DECLARED.values()}, sorted(found.values())
    fields = variant_fields()
    for supports in DECLARED.values():
        assert set(supports.values) == set(fields), supports.name
        for field, values in supports.values.items():
            assert set(values) <= set(fields[field]), (supports.name, field)


@pytest.mark.parametrize("name", CASES)
def test_the_plain_model_computes_what_the_numpy_twin_does(name):
    model = model_of(CASES[name])
    idx = ids()
    with torch.no_grad():
        ours, _ = model(idx)
    twin = gpt_forward(idx.numpy(), params_from_state_dict(model.state_dict()), model.config)
    np.testing.assert_allclose(ours.numpy(), twin, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", CASES)
def test_the_training_copy_declines_or_trains_as_the_model(name):
    model = model_of(CASES[name]).train()
    fast = attach_training_kernels(copy.deepcopy(model))
    reason = training_copy_declines(model.config)
    if reason is not None:
        assert not any(isinstance(b.attn, TrainingAttention) for b in fast.transformer.h)
        return
    assert all(isinstance(b.attn, TrainingAttention) for b in fast.transformer.h)
    idx = ids()
    losses = []
    for m in (model, fast):
        m.zero_grad()
        _, loss = m(idx, idx.roll(-1, dims=1))
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)
    for (key, p), q in zip(model.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("name", CASES)
def test_the_decoding_copy_and_the_fused_step_decline_or_decode_as_the_model(name):
    """A prompt of 5 and then one token at a time on a KV cache, beside the model's full forward."""
    model = model_of(CASES[name])
    copy_only = decoding_model(model, "float32")
    takes_copy = DECODING_COPY.takes(model.config)
    assert any(isinstance(m, DecodingLinear) for m in copy_only.modules()) == takes_copy
    built = Decoder.build(model, "float32")
    reason = unsupported(built.model)
    if not takes_copy or FUSED_STEP.first_unsupported(model.config) is not None or cpu_kernels() is None:
        assert built.step is None
        if cpu_kernels() is not None and takes_copy:
            assert reason == FUSED_STEP.first_unsupported(model.config)
    else:
        assert reason is None and built.step is not None
    idx = ids(length=9)
    with torch.no_grad():
        want, _ = model(idx)
        for decoder in (Decoder(copy_only), built):
            cache = KVCache(decoder.model.config, 2)
            got = [decoder.last_logits(idx[:, :5], cache)]
            got += [decoder.last_logits(idx[:, t : t + 1], cache) for t in range(5, 9)]
            torch.testing.assert_close(torch.stack(got, 1), want[:, 4:], atol=1e-4, rtol=1e-4)


def _one_line_refusal(attempt, error=UserError) -> str:
    with pytest.raises(error) as info:
        attempt()
    assert "\n" not in str(info.value)
    return str(info.value)


def exported_or_refused_for_its_head_bias(export, model) -> bool:
    """True when `export` wrote; False when it refused, in one line, a head bias the format has no
    place for (a nonzero lm_head bias that cannot be folded into the final norm's)."""
    try:
        export()
    except UserError as refused:
        assert model.config.lm_head_bias and str(refused).startswith("lm_head_bias") and "\n" not in str(refused)
        return False
    return True


@pytest.mark.parametrize("name", CASES)
def test_each_hugging_face_architecture_refuses_or_loads_with_the_models_logits(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = model_of(CASES[name])
    taking = [arch for arch, s in hf_rotary.ARCHITECTURES.items() if s.takes(model.config)]
    assert len(taking) <= 1  # the three lists do not overlap: one config, one architecture
    if not taking:
        _one_line_refusal(lambda: hf_rotary.architecture(model.config))
        _one_line_refusal(lambda: export_hf(model, tmp_path / "hf"))
        assert not (tmp_path / "hf").exists()
        return
    assert hf_rotary.architecture(model.config) == taking[0]
    if not exported_or_refused_for_its_head_bias(lambda: export_hf(model, tmp_path / "hf"), model):
        return
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    idx = ids()
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(input_ids=idx).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", CASES)
def test_each_llama_cpp_architecture_refuses_or_writes_a_file_that_computes_the_model(name, tmp_path):
    """The file's logits through llama.cpp where llama-cpp-python is installed (.ci/run builds it):
    within 5e-3, llama.cpp's GELU being a 16-bit table (2e-4 for the Llama layout, which has none)."""
    model = model_of(CASES[name])
    taking = [arch for arch, s in GGUF_ARCHITECTURES.items() if s.takes(model.config)]
    assert len(taking) <= 1
    out = tmp_path / "m.gguf"
    if not taking:
        _one_line_refusal(lambda: gguf_arch(model.config))
        _one_line_refusal(lambda: export_gguf(model, TOKENIZER, out))
        assert not out.exists()
        return
    assert gguf_arch(model.config) == taking[0]
    if not exported_or_refused_for_its_head_bias(lambda: export_gguf(model, TOKENIZER, out), model):
        return
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (.ci/run builds it from source): the file is written, "
                    "its logits unchecked")
    idx = ids()[0].tolist()
    with torch.no_grad():
        want, _ = model(torch.tensor([idx]))
    (rows,) = llama_cpp_scores(out, BASE["block_size"], [idx], tmp_path)
    assert np.abs(rows - want[0].double().numpy()).max() <= (2e-4 if taking[0] == "llama" else 5e-3)


@pytest.mark.parametrize("name", CASES)
def test_the_counts_refuse_or_count_what_the_model_holds_and_autograd_saves(name):
    model = model_of(CASES[name]).train()
    for supports, count in ((PARAMETER_COUNT, lambda: count_params(model.config)),
                            (SAVED_ACTIVATIONS, lambda: memory_estimate(model.config, 2, 7))):
        if not supports.takes(model.config):
            assert _one_line_refusal(count, ConfigError).startswith(supports.first_unsupported(model.config).split()[0])
            return
    assert count_params(model.config)["total"] == sum(p.numel() for p in model.parameters())
    measured, _, _ = saved_bytes(model, 2, 7)
    assert memory_estimate(model.config, 2, 7, "fp32").activations == measured


# ------------------------------------------------------------------ a value no adapter has opted in to


FAKES = {"pos_embedding": "alibi", "norm": "layernorm_nobias", "activation": "geglu", "norm_position": "sandwich"}


@pytest.mark.parametrize("field", [*FAKES, "a new switch"])
def test_a_variant_value_the_config_gains_makes_every_adapter_decline_or_refuse(field, monkeypatch, tmp_path):
    """The value is added to the config's list (as a newcomer adding it would), and the model object
    is one of the known variants carrying that config, since every adapter reads the config: the
    fast paths leave the model to its own code, the exporters and counts refuse in one line, and
    no file is written."""
    model = model_of({})
    took = {name: supports.takes(model.config) for name, supports in DECLARED.items()}
    if field == "a new switch":  # a boolean field the variant list gains: qk_norm, on
        monkeypatch.setattr(variants, "SWITCHES", (*variants.SWITCHES, "qk_norm"))
        fake = dataclasses.replace(model.config)
        object.__setattr__(fake, "qk_norm", True)
        prefix = "qk_norm"
    else:
        name = {"pos_embedding": "POS_EMBEDDINGS", "norm": "NORMS", "activation": "ACTIVATIONS",
                "norm_position": "NORM_POSITIONS"}[field]
        monkeypatch.setattr(model_config, name, (*getattr(model_config, name), FAKES[field]))
        fake = model.config.replace(**{field: FAKES[field]})
        prefix = field
    model.config = fake
    for name, supports in DECLARED.items():  # each declines (an architecture may name another field first)
        assert not supports.takes(fake), name
        assert not took[name] or names_field(supports.first_unsupported(fake), (prefix,)), name

    assert names_field(training_copy_declines(fake), (prefix,))
    trained = attach_training_kernels(copy.deepcopy(model))
    assert not any(isinstance(b.attn, TrainingAttention) for b in trained.transformer.h)
    copied = decoding_model(model, "float32")
    assert not any(isinstance(m, DecodingLinear) for m in copied.modules())
    built = Decoder.build(model, "float32")
    assert built.step is None and names_field(unsupported(built.model), (prefix,))

    assert prefix in _one_line_refusal(lambda: hf_rotary.architecture(fake))
    assert prefix in _one_line_refusal(lambda: export_hf(model, tmp_path / "hf"))
    assert prefix in _one_line_refusal(lambda: gguf_arch(fake))
    assert prefix in _one_line_refusal(lambda: export_gguf(model, TOKENIZER, tmp_path / "m.gguf"))
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m.gguf").exists()
    for count in (lambda: count_params(fake), lambda: footprint(fake), lambda: memory_estimate(fake, 2, 7)):
        assert _one_line_refusal(count, ConfigError).startswith(f"{prefix}: ")


def test_the_walkthrough_of_a_grouped_query_model_matches_the_twin_and_says_so():
    """Each query head is shown with the key and value head of its group, computed twice."""
    from scratchlm.inside.walkthrough import format_walkthrough, walkthrough_of

    model = model_of(CASES["llama-gqa"]).double()
    w = walkthrough_of(model, ids()[0, :6].tolist())
    assert w.max_diff < 1e-10
    assert {s.key for s in w.steps} >= {"h0.k", "h0.v", "h1.weights"}
    assert w.weights["transformer.h.0.attn.W_K"].shape == (2 * 8, BASE["n_embd"])  # 2 K heads of 8
    assert "H=4, H_kv=2," in format_walkthrough(w).splitlines()[0]

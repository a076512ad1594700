"""The decoding copy (scratchlm.kernels.decoding_copy: decoding_model, Decoder) and bfloat16 decoding.

The copy must compute what the model computes: in float32 to rounding, in bfloat16 what the
model computes with its Linear weights (and their inputs) rounded to bfloat16. References are
built here independently: the model's own forward on weights rounded by hand.
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.errors import ConfigError
from scratchlm.kernels.decoding_copy import DecodingLinear, decoder_for, decoding_model
from scratchlm.generation.generate import generate, generate_ids, iter_tokens
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT

from helpers import bf16_reference

TINY = dict(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32)
VARIANTS = [
    dict(pos_embedding="learned", tie_weights=True, qkv_bias=True, lm_head_bias=False),
    dict(pos_embedding="rope", norm="rmsnorm", activation="swiglu", mlp_bias=False, proj_bias=False),
    dict(pos_embedding="sinusoidal", norm_position="post", activation="gelu_tanh"),
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py


def _model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():  # unit-scale embeddings, so the next token depends on the context
        model.transformer.wte.weight.normal_(0.0, 1.0)
    return model


def _logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.lm_head(model.forward_hidden(idx)).float()


def _float32_layouts() -> list:
    from scratchlm.kernels import cpu_kernels, kernel_status

    kernel = pytest.param("kernel", marks=pytest.mark.skipif(cpu_kernels() is None, reason=kernel_status()))
    return [None, kernel, "packed", "in_out"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", _float32_layouts())
@pytest.mark.parametrize("rows", [11, 1])  # a prompt; one position (through the kernel where it builds)
def test_float32_copy_computes_the_models_logits(variant, layout, rows):
    model = _model(**variant)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = decoding_model(model, layout=layout)
    assert all(isinstance(m, DecodingLinear) for m in (fast.lm_head, fast.transformer.h[0].attn.c_attn))
    idx = torch.randint(0, TINY["vocab_size"], (3, rows), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(fast, idx), _logits(model, idx), atol=1e-5, rtol=1e-5)
    # the original is untouched and shares nothing with the copy
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    own = {p.data_ptr() for p in model.parameters()}
    assert not own & {t.data_ptr() for t in list(fast.parameters()) + [fast.lm_head.bias] if t is not None}
    assert isinstance(model.lm_head, torch.nn.Linear)


def _bf16_layouts() -> list:
    from scratchlm.kernels.decoding_copy import mkldnn_packing_available
    from scratchlm.kernels import cpu_kernels, kernel_status

    return [
        None,  # the default
        pytest.param("kernel", marks=pytest.mark.skipif(cpu_kernels() is None, reason=kernel_status())),
        pytest.param("packed", marks=pytest.mark.skipif(not mkldnn_packing_available(), reason="no oneDNN packing")),
        "in_out",
    ]


def _bf16_path_reference(model: GPT, fast: GPT, rows: int) -> tuple[GPT, float]:
    """The by-hand reference for the bfloat16 copy `fast` running `rows` rows at once, and how
    close (relative to the logits' size) it must come. It follows the path that runs: a bfloat16
    matmul (oneDNN's, or PyTorch's own) rounds its input and its output to bfloat16; the compiled
    kernel's loop returns float32 and rounds the input only where `rounds_input` says so
    (the AVX512-BF16 loop; the widening loops keep it float32, see scratchlm/kernels/bf16_dot.h).
    What is left is float32 summation order; where inputs are rounded, an input that lands on the
    other side of a rounding boundary moves the logits by about one bfloat16 step (2^-8)."""
    kernel = fast.lm_head.kernel if fast.lm_head.layout == "kernel" else None
    if kernel is not None and rows <= kernel.max_rows:
        reference = bf16_reference(model, round_output=False, round_input=kernel.rounds_input)
        return reference, 2e-3 if kernel.rounds_input else 1e-5
    return bf16_reference(model), 5e-3


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", _bf16_layouts())
@pytest.mark.parametrize("shape", [(2, 13), (3, 1), (1, 5)])  # a prompt; one step of 3 rows; a few rows
def test_bfloat16_copy_matches_weights_rounded_by_hand(variant, layout, shape):
    model = _model(**variant)
    idx = torch.randint(0, TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(2))
    fast = decoding_model(model, "bfloat16", layout=layout)
    got = _logits(fast, idx)
    reference, tolerance = _bf16_path_reference(model, fast, idx.numel())
    want = _logits(reference, idx)
    full = _logits(model, idx)
    # The copy is bfloat16 for real (far from the float32 logits) and does what the by-hand
    # rounding of the path that ran does, up to summation order.
    scale = full.abs().max()
    assert (got - full).abs().max() > 1e-3 * scale
    assert (got - want).abs().max() <= tolerance * scale
    assert got.dtype == torch.float32


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(3, 1), (1, 5)])
def test_every_kernel_variant_rounds_as_it_documents(kernel_variant, variant, shape):
    """The kernel layout built for each variant this CPU runs, against the reference of its own
    rounding, and clearly away from the other rounding (so the check can tell them apart)."""
    model = _model(**variant)
    idx = torch.randint(0, TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(2))
    fast = decoding_model(model, "bfloat16", layout="kernel")
    assert fast.lm_head.kernel is kernel_variant
    got = _logits(fast, idx)
    scale = _logits(model, idx).abs().max()
    own = _logits(bf16_reference(model, round_output=False, round_input=kernel_variant.rounds_input), idx)
    other = _logits(bf16_reference(model, round_output=False, round_input=not kernel_variant.rounds_input), idx)
    assert (got - own).abs().max() <= (2e-3 if kernel_variant.rounds_input else 1e-5) * scale
    assert (got - other).abs().max() > 1e-3 * scale


@pytest.mark.parametrize("variant", VARIANTS)
def test_bfloat16_cached_steps_match_the_uncached_loop(variant):
    model = _model(seed=3, **variant)
    idx = torch.randint(0, TINY["vocab_size"], (2, 4), generator=torch.Generator().manual_seed(3))
    cached = list(iter_tokens(model, idx, max_new_tokens=30, greedy=True, dtype="bfloat16"))
    # Every step's logits against the plain loop's on the same prefix (the window of the last
    # block_size ids the cached run chose), through the same bfloat16 copy: the two round in
    # different places, so within bfloat16's precision, not bit for bit. Greedy ids may part
    # ways between two separate runs, so the prefixes are the cached run's own.
    decoder = decoder_for(model, 30, "bfloat16")
    seq, block = idx, model.config.block_size
    with torch.no_grad():
        for step, (chosen, a) in enumerate(cached):
            b = decoder.last_logits(seq[:, -block:], None)
            assert ((a - b).abs().max() / b.abs().max()) < 2e-2, f"step {step}"
            seq = torch.cat([seq, chosen[:, None]], dim=1)
    # MUTATION (issue 21): a cached step fed the previous token instead of the newest passed the
    # old version of this test, which compared step 0 only; it fails here from step 1.
    ids = torch.stack([t for t, _ in cached], 1)
    # every chosen id is the argmax of its logits (greedy), and the cache crossed the context
    assert all(torch.equal(t, logits.argmax(-1)) for t, logits in cached)
    assert idx.shape[1] + ids.shape[1] > TINY["block_size"]


def test_decoding_copy_is_rebuilt_when_the_weights_change():
    model = _model(seed=4)
    idx = torch.tensor([[1, 2, 3]])
    first = generate_ids(model, idx, max_new_tokens=12, greedy=True)
    with torch.no_grad():  # make token 7 win every step
        model.lm_head.bias.zero_()
        model.lm_head.bias[7] = 1e4
    again = generate_ids(model, idx, max_new_tokens=12, greedy=True)
    assert not torch.equal(first, again)
    assert again[0, 3:].tolist() == [7] * 12
    bf16 = generate_ids(model, idx, max_new_tokens=12, greedy=True, dtype=torch.bfloat16)
    assert bf16[0, 3:].tolist() == [7] * 12


def test_one_decoder_per_model_and_dtype_is_kept_until_the_weights_change():
    """decoder_for hands back the same Decoder (copy and compiled step) while the weights stay as
    they were, a new one after an in-place change; a Decoder given to the loops is used as it is,
    with the tokens of the model it was built from."""
    from scratchlm.kernels.decoding_copy import Decoder, decoder_for

    model = _model(seed=6)
    first = decoder_for(model, 12, torch.bfloat16)
    assert first.model is not model and decoder_for(model, 12, "bfloat16") is first
    assert decoder_for(model, 12, torch.float32) is not first  # another dtype, another copy
    assert decoder_for(model, 3, None).model is model  # too few steps for a copy to pay
    idx = torch.tensor([[1, 2, 3]])
    want = generate_ids(model, idx, max_new_tokens=12, greedy=True, dtype=torch.bfloat16)
    built = Decoder.build(model, torch.bfloat16)
    assert decoder_for(built, 12, None) is built
    assert torch.equal(generate_ids(built, idx, max_new_tokens=12, greedy=True), want)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)
    again = decoder_for(model, 12, torch.bfloat16)
    assert again is not first and again.signature != first.signature


def test_dtype_option_is_checked():
    model = _model()
    for bad in ("int8", "nonsense", torch.int64):
        with pytest.raises(ConfigError):
            generate_ids(model, torch.tensor([[1]]), max_new_tokens=9, greedy=True, dtype=bad)


def test_generate_text_in_bfloat16_and_on_the_command_line(tmp_path, capsys):
    checkpoint = pytest.importorskip("scratchlm.checkpoint")
    from scratchlm.cli.main import main
    from scratchlm.text.tokenizer import CharTokenizer

    tok = CharTokenizer("abcdefgh \n")
    model = _model(seed=12, vocab_size=tok.vocab_size)  # a seed whose 20 choices are clear (and not all one letter)
    path = checkpoint.save_model_checkpoint(model, tok, tmp_path / "ckpt")
    # The judge: the plain loop in float64, written out here. Its choices must be clear enough
    # (top-2 gap above bfloat16's error) for the bfloat16 cached path to make the same ones.
    ids, block = tok.encode("abc"), model.config.block_size
    wide = GPT(model.config).double().eval()
    wide.load_state_dict(model.state_dict())
    with torch.no_grad():
        while len(ids) < 23:
            logits = wide(torch.tensor([ids[-block:]]))[0][0, -1]
            top = logits.topk(2).values
            assert top[0] - top[1] > 0.02 * logits.abs().max(), "the reference choice is too close to call"
            ids.append(int(logits.argmax()))
            if ids[-1] == tok.eos_id:
                break
    want = generate(model, tok, "abc", max_new_tokens=20, greedy=True, dtype="bfloat16")
    assert want.ids == [i for i in ids[3:] if i != tok.eos_id]
    assert want.finish_reasons[0] in ("length", "eos")
    code = main(["generate", "--checkpoint", str(path), "--prompt", "abc", "--greedy", "--max-new-tokens", "20",
                 "--dtype", "bfloat16"])
    out = capsys.readouterr().out
    assert code == 0
    assert out == "abc" + want.text + "\n"


@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_copy_decodes_step_by_step_like_the_model(variant):
    """Cached steps of the decoding copy (its compiled attention where it builds; the model's own
    code for RoPE) against the model's own forward over the whole sequence, at every step."""
    from scratchlm.kernels.decoding_copy import DecodingAttention
    from scratchlm.kernels import cpu_kernels
    from scratchlm.model.gpt import KVCache

    model = _model(seed=6, **variant)
    fast = decoding_model(model, layout="in_out")
    assert isinstance(fast.transformer.h[0].attn, DecodingAttention) == (cpu_kernels() is not None)
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(6))
    cache = KVCache(model.config, 2)
    with torch.no_grad():
        fast.forward_hidden(idx[:, :3], kv_cache=cache)  # a prompt of 3
        for n in range(3, TINY["block_size"]):  # then one position at a time, up to the full context
            got = fast.lm_head(fast.forward_hidden(idx[:, n : n + 1], kv_cache=cache))[:, -1]
            want = model.lm_head(model.forward_hidden(idx[:, : n + 1]))[:, -1]
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)



def test_auto_dtype_decodes_in_bfloat16_where_this_cpu_reads_it_fast(monkeypatch):
    """dtype="auto": bfloat16 with a vectorised kernel loop or native bfloat16 matmuls, float32
    with only the portable loop on a CPU without bfloat16 units (there bfloat16 is slower)."""
    from scratchlm import kernels
    from scratchlm.kernels.decoding_copy import _as_dtype, auto_decoding_dtype

    model = _model()
    monkeypatch.setenv("SCRATCHLM_CPU_BF16", "0")
    for variant in kernels.runnable_variants():
        monkeypatch.setenv("SCRATCHLM_KERNEL_VARIANT", variant)
        loaded = kernels.cpu_kernels()
        if loaded is None:
            continue
        want = torch.float32 if loaded.loop == "portable" else torch.bfloat16
        assert auto_decoding_dtype(torch.device("cpu")) == want == _as_dtype("auto", model), variant
    monkeypatch.setenv("SCRATCHLM_NO_KERNELS", "1")
    monkeypatch.setattr(kernels, "_loaded", {})
    assert auto_decoding_dtype(torch.device("cpu")) == torch.float32
    monkeypatch.setenv("SCRATCHLM_CPU_BF16", "1")
    assert auto_decoding_dtype(torch.device("cpu")) == torch.bfloat16
    # and the ids are those of the dtype it chose
    idx = torch.tensor([[1, 2, 3]])
    assert torch.equal(generate_ids(model, idx, max_new_tokens=6, greedy=True, dtype="auto"),
                       generate_ids(model, idx, max_new_tokens=6, greedy=True, dtype=torch.bfloat16))

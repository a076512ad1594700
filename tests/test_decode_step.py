"""The compiled decoding step (scratchlm/kernels/decode_step.c through
scratchlm.kernels.decode_step.FusedDecodeStep): a whole one-token step of a pre-norm GPT in one
call. Checked at every position of a sequence against the model's own full forward over the whole
prefix, on weights (and matmul inputs) rounded to bfloat16 by hand (tests/test_decoding.py's
reference), so a wrong norm, activation, position, head split or cache write shows in the logits.
"""

from __future__ import annotations

import contextlib
import ctypes

import pytest
import torch

from scratchlm import kernels
from scratchlm.kernels.decoding_copy import Decoder, decoding_model, decoder_for
from scratchlm.generation.generate import generate_ids
from scratchlm.kernels.decode_step import FusedDecodeStep, unsupported
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, KVCache

from helpers import bf16_reference as _bf16_reference  # the model on weights (and matmul inputs) rounded by hand


KERNEL = kernels.cpu_kernels()
pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(KERNEL is None, reason=f"decoding kernels: {kernels.kernel_status()}")]

TINY = dict(vocab_size=40, block_size=12, n_layer=2, n_head=2, n_embd=32)
FUSED_VARIANTS = {
    "gpt2": dict(pos_embedding="learned", activation="gelu_tanh", tie_weights=True, qkv_bias=True, lm_head_bias=False),
    "llama": dict(pos_embedding="rope", norm="rmsnorm", activation="swiglu", mlp_bias=False, proj_bias=False,
                  lm_head_bias=False),
    "sinusoidal-gelu": dict(pos_embedding="sinusoidal", activation="gelu", norm_eps=1e-2),
    # widths that are not multiples of 32 (the vector tails) and five heads of 8
    "odd-widths-relu": dict(n_embd=40, n_head=5, n_inner=72, activation="relu", vocab_size=37),
}


def _model(seed: int, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():  # unit-scale embeddings; norm parameters and biases away from 1 and 0
        model.transformer.wte.weight.normal_(0.0, 1.0)
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.3)  # biases too, which start at zero
    return model


def _steps(model: GPT, step: FusedDecodeStep, idx: torch.Tensor, prompt: int, dtype: str = "bfloat16"):
    """(fused logits, reference logits, float32 model logits) at every position after the prompt;
    in bfloat16 the reference rounds the matmul inputs where the loaded kernel's loop does
    (`rounds_input`); in float32 the reference is the model itself."""
    fast = decoding_model(model, dtype)
    ref = _reference(model) if dtype == "bfloat16" else model
    cache = KVCache(model.config, idx.shape[0])
    out = []
    with torch.no_grad():
        fast.forward_hidden(idx[:, :prompt], kv_cache=cache)  # the prompt through the model's code
        for n in range(prompt, idx.shape[1]):
            got = step(idx[:, n : n + 1], cache)
            assert got is not None and cache.length == n + 1
            want = ref.lm_head(ref.forward_hidden(idx[:, : n + 1]))[:, -1]
            full = model.lm_head(model.forward_hidden(idx[:, : n + 1]))[:, -1]
            out.append((got, want, full))
    return out


def _reference(model: GPT) -> GPT:
    """The by-hand bfloat16 reference of the loop the loaded kernels run (bf16_dot.h): weights
    rounded, matmul inputs rounded only where the loop rounds them, outputs float32."""
    return _bf16_reference(model, round_output=False, round_input=kernels.cpu_kernels().rounds_input)


def _check(steps) -> None:
    # Where the loop rounds its inputs, an input that the reference's float32 arithmetic puts on
    # the other side of a bfloat16 rounding boundary moves the logits by about one bfloat16 step,
    # and a key or value so moved stays in the cache for every step after it: at most 2**-7 of the
    # logits' scale (a bfloat16 step at the top of its binade). Which inputs land on a boundary
    # follows the CPU's float32 summation order: the bound held at 2e-3 on an AMD EPYC and reached
    # 2.5e-3 on an Intel Xeon (llama, 3 rows), where every step before the crossing matched to
    # 1e-7. Where the loop keeps its inputs float32, only the summation order differs.
    tolerance = 2**-7 if kernels.cpu_kernels().rounds_input else 1e-5
    for got, want, full in steps:
        scale = full.abs().max()
        off_ref = (got - want).abs().max()
        off_full = (got - full).abs().max()
        # bfloat16 for real (clearly off the float32 model) and what the by-hand rounding gives
        assert off_full > 1e-3 * scale
        assert off_ref <= tolerance * scale, (off_ref, off_full, scale)


def _check_last(model: GPT, ref: GPT, prefix: torch.Tensor, got: torch.Tensor, dtype: str) -> None:
    """A call's logits `got` against the last position of the model's forward over `prefix`: the
    by-hand bfloat16 reference (`ref`) in bfloat16, the model itself in float32."""
    full = model.lm_head(model.forward_hidden(prefix))[:, -1]
    if dtype == "bfloat16":
        _check([(got, ref.lm_head(ref.forward_hidden(prefix))[:, -1], full)])
    else:
        torch.testing.assert_close(got, full, atol=1e-5 * full.abs().max(), rtol=1e-5)


@contextlib.contextmanager
def _recorded_calls(decoder: Decoder):
    """Wrap the compiled step of `decoder` so that each call is recorded, as ("step", positions,
    taken) or ("greedy", cache length, steps, taken); the step is put back afterwards."""
    step = decoder.step
    calls: list[tuple] = []

    class Recording:
        describes = step.describes

        def __call__(self, idx, cache):
            out = step(idx, cache)
            calls.append(("step", idx.shape[1], out is not None))
            return out

        def greedy(self, last, steps, cache):
            length = cache.length
            out = step.greedy(last, steps, cache)
            calls.append(("greedy", length, steps, out is not None))
            return out

    decoder._step = Recording()
    try:
        yield calls
    finally:
        decoder._step = step


@pytest.mark.parametrize("name", FUSED_VARIANTS)
@pytest.mark.parametrize("batch", [1, 3, 8])  # 8: the most rows the kernel takes
def test_each_step_matches_the_model_on_rounded_weights(kernel_variant, name, batch):
    model = _model(1, **FUSED_VARIANTS[name])
    decoder = Decoder.build(model, "bfloat16")
    step = decoder.step
    assert step is not None, unsupported(decoder.model)
    V = model.config.vocab_size
    idx = torch.randint(0, V, (batch, TINY["block_size"]), generator=torch.Generator().manual_seed(batch))
    # The prompt goes through the modules; with more rows than the kernel takes, those multiply in
    # bfloat16 and round their outputs too, which the reference does not, so keep it within the kernel.
    _check(_steps(model, step, idx, prompt=2 if 2 * batch <= KERNEL.max_rows else 1))


@pytest.mark.parametrize("name", FUSED_VARIANTS)
@pytest.mark.parametrize("batch", [1, 2])
def test_float32_steps_match_the_model(kernel_variant, name, batch):
    model = _model(7, **FUSED_VARIANTS[name])
    decoder = Decoder.build(model, "float32")
    step = decoder.step
    assert step is not None, unsupported(decoder.model)
    idx = torch.randint(0, model.config.vocab_size, (batch, TINY["block_size"]),
                        generator=torch.Generator().manual_seed(batch))
    for got, want, full in _steps(model, step, idx, prompt=2, dtype="float32"):
        assert want is not None and torch.equal(want, full)
        torch.testing.assert_close(got, full, atol=1e-5 * full.abs().max(), rtol=1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_several_positions_per_call_match_the_model(kernel_variant, name, dtype):
    """A short prompt, then pieces of 3 and 2 positions, then single steps (two sequences): each
    call's logits are the last position's, and the cache holds what the next calls need."""
    model = _model(8, **FUSED_VARIANTS[name])
    step = Decoder.build(model, dtype).step
    ref = _reference(model) if dtype == "bfloat16" else model
    idx = torch.randint(0, model.config.vocab_size, (2, TINY["block_size"]), generator=torch.Generator().manual_seed(8))
    cache = KVCache(model.config, 2)
    n = 0
    with torch.no_grad():
        for width in [4, 3, 2] + [1] * (TINY["block_size"] - 9):
            got = step(idx[:, n : n + width], cache)
            n += width
            assert got is not None and cache.length == n
            _check_last(model, ref, idx[:, :n], got, dtype)
    assert n == TINY["block_size"]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_two_threads_share_the_work_and_get_the_same_result(kernel_variant, name):
    model = _model(2, **FUSED_VARIANTS[name])
    idx = torch.randint(0, model.config.vocab_size, (2, TINY["block_size"]), generator=torch.Generator().manual_seed(0))
    torch.set_num_threads(2)  # the fixture puts it back
    _check(_steps(model, Decoder.build(model, "bfloat16").step, idx, prompt=1))
    for got, _, full in _steps(model, Decoder.build(model, "float32").step, idx, prompt=1, dtype="float32"):
        torch.testing.assert_close(got, full, atol=1e-5 * full.abs().max(), rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_every_matrix_row_is_computed_once_and_two_threads_share_them(kernel_variant, threads):
    """decode_step.c's matrices (linear_team) share their rows out among the team: counted by the
    kernel itself (its counting entry, put in the step's place here: the step itself counts
    nothing), every (weight row, input row) product of a step is computed exactly once, by thread
    0 alone with one thread, and by both with two. The counts come from the loop that computes,
    not from a copy of it (MUTATION, issue 21: `omp for` removed gave every thread every row, and
    the results were still right)."""
    model = _model(2, **FUSED_VARIANTS["gpt2"])
    C, V, n_layer = model.config.n_embd, model.config.vocab_size, model.config.n_layer
    hidden = model.transformer.h[0].mlp.c_fc.out_features
    B, steps = 2, 6
    idx = torch.randint(0, V, (B, steps + 1), generator=torch.Generator().manual_seed(0))
    step = Decoder.build(model, "float32").step
    counted = kernels.cpu_kernels().lib.scratchlm_decode_step_counted  # the variant's library, the step's
    rows_of_thread = torch.zeros(4, dtype=torch.int64)
    step._fn = lambda *args: counted(*args, rows_of_thread.data_ptr())  # an instance attribute: this step only
    cache = KVCache(model.config, B)
    torch.set_num_threads(threads)  # the fixture puts it back
    with torch.no_grad():
        decoding_model(model, "float32").forward_hidden(idx[:, :1], kv_cache=cache)
        for n in range(1, steps + 1):
            assert step(idx[:, n : n + 1], cache) is not None
    counts = rows_of_thread.tolist()
    per_step = B * n_layer * (3 * C + C + hidden + C) + B * V  # qkv, attention out, fc, mlp out; the head
    assert sum(counts) == steps * per_step, (counts, per_step)
    assert counts[threads:] == [0] * (4 - threads)
    assert all(c > 0 for c in counts[:threads]), counts  # each thread of the team took rows


def test_the_scratch_is_allocated_once_per_copy_and_too_little_is_refused(kernel_variant):
    """A step works in scratch its decoding copy allocated once: the same block at every token
    (made again only for more threads), a block of its own for a step running beside another; and
    decode_step.c refuses a scratch smaller than the size it asks for, writing nothing."""
    model = _model(3, **FUSED_VARIANTS["llama"])
    step = Decoder.build(model, "float32").step
    seen = []  # (address, bytes) of the scratch each C call was given: its last two arguments
    real = step._fn
    step._fn = lambda *args: (seen.append(args[-2:]), real(*args))[1]
    torch.set_num_threads(1)  # the fixture puts it back
    cache = KVCache(model.config, 1)
    idx = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for n in range(4):
            assert step(idx[:, n : n + 1], cache) is not None
        assert len(seen) == 4 and len(set(seen)) == 1  # the same memory at every token
        (address, size), = set(seen)
        with step._scratch(1) as held:  # another caller's step is running: this one gets its own block
            assert step(idx[:, :1], KVCache(model.config, 1)) is not None
        assert held == (address, size) and seen[-1][0] != address
        torch.set_num_threads(2)
        assert step(idx[:, :1], KVCache(model.config, 1)) is not None
    assert seen[-1][1] > size  # room for a second thread's part
    library = kernel_variant.lib
    assert size == library.scratchlm_decode_scratch_bytes(ctypes.byref(step._model), 1)
    k_before, v_before = cache.k.clone(), cache.v.clone()
    logits = torch.full((1, model.config.vocab_size), 7.0)
    scratch = torch.empty(size, dtype=torch.uint8)
    rc = library.scratchlm_decode_step(ctypes.byref(step._model), idx[:, :1].contiguous().data_ptr(), 1, 1,
                                       cache.length, cache.k.data_ptr(), cache.v.data_ptr(), logits.data_ptr(), 1,
                                       scratch.data_ptr(), size - 1)
    assert rc == -1
    bits = lambda t: t.view(torch.int32)  # noqa: E731 - the cache's unused rows are uninitialised: maybe NaNs
    assert torch.equal(bits(cache.k), bits(k_before)) and torch.equal(bits(cache.v), bits(v_before))
    assert bool((logits == 7.0).all())


def test_models_and_calls_it_does_not_take_go_the_usual_way():
    post = Decoder.build(_model(4, norm_position="post"), "bfloat16")
    assert unsupported(post.model) == "norm_position 'post' is not supported by the fused decoding step (it takes " \
        "'pre')" and post.step is None
    assert Decoder.build(_model(4), "float32", layout="in_out").step is None  # not the kernel layout
    model = _model(4, **{**FUSED_VARIANTS["gpt2"], "block_size": 24})  # room for a prompt of 17
    decoder = Decoder.build(model, "bfloat16")
    step = decoder.step
    V, block = model.config.vocab_size, model.config.block_size

    def declined(idx, cache) -> bool:
        cache.k.zero_(), cache.v.zero_()  # torch.empty may hold NaNs, which equal nothing
        k, v, length = cache.k.clone(), cache.v.clone(), cache.length
        result = step(idx, cache)
        untouched = torch.equal(k, cache.k) and torch.equal(v, cache.v) and cache.length == length
        return result is None and untouched

    rows = KERNEL.max_rows + 1
    cache = KVCache(model.config, rows)
    cache.length = 1
    assert declined(torch.zeros(rows, 1, dtype=torch.long), cache)  # more rows than the kernel takes
    cache = KVCache(model.config, 1)
    cache.length = 1
    assert declined(torch.tensor([[V]]), cache)  # an id outside the vocabulary
    assert declined(torch.tensor([[-1]]), cache)
    assert declined(torch.arange(step.max_prompt + 1)[None] % V, cache)  # a prompt of more rows than it takes
    assert declined(torch.tensor([[1] * KERNEL.max_rows + [V]]), cache)  # a bad id in the second piece
    cache.length = block - 1
    assert declined(torch.tensor([[1, 2]]), cache)  # two positions with room for one
    cache.length = 1
    assert declined(torch.tensor([[1]]), KVCache(model.config, 2))  # a cache for another batch
    cache64 = KVCache(model.config, 1, dtype=torch.float64)
    cache64.length = 1
    assert declined(torch.tensor([[1]]), cache64)
    cache.length = block
    assert declined(torch.tensor([[1]]), cache)  # a full cache
    with pytest.raises(IndexError):  # declined, so the model's own path reports the bad id
        decoder.last_logits(torch.tensor([[V]]), KVCache(model.config, 1))


def test_generation_uses_it_and_keeps_greedy_tokens(monkeypatch):
    """Greedy ids through generate_ids in bfloat16, with the step and without it (the module
    path), agree: same argmax at every step for a model whose choices are clear."""
    from scratchlm.generation import engine as gen

    model = _model(5, **FUSED_VARIANTS["gpt2"])
    idx = torch.tensor([[3, 1, 4]])
    ids_plain = generate_ids(model, idx, max_new_tokens=8, greedy=True, dtype="bfloat16", use_cache=False)
    decoder = decoder_for(model, 8, torch.bfloat16)  # the Decoder generate_ids will reuse
    monkeypatch.setattr(gen, "GREEDY_LATENCY", 10.0)  # chunk sizes that do not depend on the machine's speed
    with _recorded_calls(decoder) as calls:
        ids = generate_ids(model, idx, max_new_tokens=8, greedy=True, dtype="bfloat16")
        # the prompt (3 rows), then one step (timed), then the other 6 in one call
        assert calls == [("step", 3, True), ("greedy", 3, 1, True), ("greedy", 4, 6, True)]
        assert torch.equal(ids, ids_plain)
        calls.clear()  # a repetition penalty changes the scores between steps: one call per step
        ids = generate_ids(model, idx, max_new_tokens=8, greedy=True, dtype="bfloat16", repetition_penalty=1.3)
        assert calls == [("step", 3, True)] + [("step", 1, True)] * 7
    assert torch.equal(ids, generate_ids(model, idx, max_new_tokens=8, greedy=True, dtype="bfloat16",
                                         repetition_penalty=1.3, use_cache=False))


def test_a_copy_converted_after_it_was_built_drops_the_step():
    """.double() gives every parameter new storage; the step's addresses would then describe the
    old tensors, so the next call must go through the model's own code (in float64 here)."""
    model = _model(9, **FUSED_VARIANTS["gpt2"])
    decoder = Decoder.build(model, "float32")
    assert decoder.step is not None
    with torch.no_grad():
        decoder.model.transformer.wte.weight.mul_(2.0)  # in place: the step still describes the copy
    assert decoder.step is not None and decoder.step.describes(decoder.model)
    decoder.model.double()
    idx = torch.tensor([[1, 2, 3]])
    logits = decoder.last_logits(idx, KVCache(model.config, 1, dtype=torch.float64))
    assert decoder.step is None and logits.dtype == torch.float64


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("batch, prompt", [(1, 16), (3, 5)])  # 16 rows in two calls; 15 in pieces of 6, 6, 3
def test_a_prompt_of_more_rows_goes_in_pieces_and_matches_the_model(kernel_variant, name, dtype, batch, prompt):
    """The pieces before the last skip the head; the last position's logits, and the steps that
    follow from the cache the pieces left, match the model."""
    model = _model(10, **{**FUSED_VARIANTS[name], "block_size": 24})
    step = Decoder.build(model, dtype).step
    assert batch * prompt > KERNEL.max_rows and batch * prompt <= step.max_prompt
    ref = _reference(model) if dtype == "bfloat16" else model
    idx = torch.randint(0, model.config.vocab_size, (batch, prompt + 3), generator=torch.Generator().manual_seed(10))
    cache = KVCache(model.config, batch)
    with torch.no_grad():
        for n in range(prompt, prompt + 4):
            got = step(idx[:, cache.length : n], cache)
            assert got is not None and cache.length == n
            _check_last(model, ref, idx[:, :n], got, dtype)


@pytest.mark.parametrize("name", ["gpt2", "llama", "odd-widths-relu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_steps_in_one_call_equal_one_step_at_a_time(kernel_variant, name, dtype, batch):
    """step.greedy(last, n, cache) against n rounds of step(last, cache) and NumPy's argmax
    (greedy_ids) on a copy of the cache: the same ids, logits and cache contents."""
    from scratchlm.generation.sampling import greedy_ids

    model = _model(11, **FUSED_VARIANTS[name])
    step = Decoder.build(model, dtype).step
    idx = torch.randint(0, model.config.vocab_size, (batch, 2), generator=torch.Generator().manual_seed(11))
    cache = KVCache(model.config, batch)
    cache.k.zero_(), cache.v.zero_()
    step(idx[:, :1], cache)
    other = KVCache(model.config, batch)
    other.k.copy_(cache.k), other.v.copy_(cache.v)
    other.length = cache.length
    steps = model.config.block_size - 1
    ids, logits = step.greedy(idx[:, 1:], steps, cache)
    assert ids.shape == (steps, batch) and logits.shape == (steps, batch, model.config.vocab_size)
    last = idx[:, 1:]
    for s in range(steps):
        scores = step(last, other)
        last = greedy_ids(scores)[:, None]
        assert torch.equal(scores, logits[s]) and torch.equal(last[:, 0], ids[s])
    assert cache.length == other.length == model.config.block_size
    assert torch.equal(cache.k, other.k) and torch.equal(cache.v, other.v)
    assert step.greedy(last, 1, cache) is None  # no room left: declined


def test_greedy_takes_the_first_of_equal_maxima_and_the_first_nan():
    """Rows 3 and 7 of the head equal, with the largest bias: every step's top two scores are
    exactly equal, and the lower id wins (as torch.argmax and NumPy's do). With NaN rows 5 and 9
    the first NaN wins (NumPy's rule, which greedy_ids follows)."""
    from scratchlm.generation.sampling import greedy_ids

    model = _model(12, **{**FUSED_VARIANTS["gpt2"], "tie_weights": False, "lm_head_bias": True})
    with torch.no_grad():
        head = model.lm_head
        head.weight[7] = head.weight[3]
        head.bias[3] = head.bias[7] = 50.0
    step = Decoder.build(model, "float32").step
    cache = KVCache(model.config, 2)
    step(torch.tensor([[1], [2]]), cache)
    ids, logits = step.greedy(torch.tensor([[4], [6]]), 5, cache)
    for s in range(5):
        for b in range(2):
            row = logits[s, b].tolist()
            assert row[3] == row[7] == max(row)  # a true tie
            assert row.index(max(row)) == 3 and int(ids[s, b]) == 3
    with torch.no_grad():
        head.weight[5] = float("nan")
        head.weight[9] = float("nan")
    step = Decoder.build(model, "float32").step
    cache = KVCache(model.config, 1)
    step(torch.tensor([[1]]), cache)
    ids, logits = step.greedy(torch.tensor([[4]]), 3, cache)
    for s in range(3):
        row = logits[s, 0]
        assert row[5].isnan() and row[9].isnan() and not row[:5].isnan().any()
        assert int(ids[s, 0]) == 5 == int(greedy_ids(row[None])[0])


def test_greedy_generation_crosses_the_context_in_chunks_and_keeps_the_plain_tokens(monkeypatch):
    """Greedy steps go in chunks: one step first (to time it), then up to GREEDY_CHUNK while a
    chunk stays within GREEDY_LATENCY, the last ending at the context's edge, where the window
    starts to slide (a re-prefill per step); the ids are those of the plain loop without a cache
    all the way. A step slower than the latency budget allows goes one per call."""
    from scratchlm.generation import engine as gen

    model = _model(13, **FUSED_VARIANTS["llama"])  # float32: clear choices, block_size 12
    idx = torch.tensor([[3, 1, 4]])
    plain = generate_ids(model, idx, max_new_tokens=30, greedy=True, use_cache=False, dtype="float32")
    decoder = decoder_for(model, 30, torch.float32)
    block = model.config.block_size
    with _recorded_calls(decoder) as calls:
        monkeypatch.setattr(gen, "GREEDY_LATENCY", 10.0)  # a tiny model's steps fit many times over
        assert torch.equal(generate_ids(model, idx, max_new_tokens=30, greedy=True, temperature=0.0), plain)
        # from the prompt (3 positions) to the edge; past it every step re-prefills, which leaves the cache full
        chunks = [(length, steps) for kind, length, steps, *_ in calls if kind == "greedy"]
        assert chunks == [(3, 1), (4, gen.GREEDY_CHUNK)] and 4 + gen.GREEDY_CHUNK == block
        calls.clear()
        monkeypatch.setattr(gen, "GREEDY_LATENCY", 0.0)  # no step fits: one per call
        assert torch.equal(generate_ids(model, idx, max_new_tokens=30, greedy=True), plain)
        assert [(length, steps) for kind, length, steps, *_ in calls if kind == "greedy"] == \
            [(n, 1) for n in range(3, block)]


def test_greedy_generation_of_more_sequences_than_the_step_takes_goes_the_usual_way():
    """Nine sequences: the step declines the first chunk, so every later step goes through the
    model's own modules, and the ids are still the plain loop's."""
    model = _model(14, **FUSED_VARIANTS["gpt2"])
    idx = torch.randint(0, model.config.vocab_size, (KERNEL.max_rows + 1, 2), generator=torch.Generator().manual_seed(14))
    decoder = decoder_for(model, 9, torch.float32)
    with _recorded_calls(decoder) as calls:
        ids = generate_ids(model, idx, max_new_tokens=9, greedy=True, dtype="float32")
    assert [taken for kind, *_, taken in calls if kind == "greedy"] == [False]  # declined once, then not asked again
    assert torch.equal(ids, generate_ids(model, idx, max_new_tokens=9, greedy=True, use_cache=False, dtype="float32"))

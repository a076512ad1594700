"""scratchlm.generation.sampling: each stage of the pipeline (repetition penalty, temperature, top-k, top-p,
min-p, the draw, greedy's argmax) against brute force, NumPy or a hand calculation; the draws
against their distributions; and SamplingOptions, checked once when made, one object for every
generation function."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scratchlm.errors import ConfigError, UserError
from scratchlm.generation.generate import generate_ids, iter_tokens
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.generation.sampling import (
    SamplingOptions,
    apply_repetition_penalty,
    choose_next,
    make_generator,
    min_p_filter,
    sample,
    top_k_filter,
    top_p_filter,
)

from helpers import TINY, plain_loop, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py



@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("temperature", float("nan")), ("top_k", 0),
                                          ("top_k", 2.5), ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.1),
                                          ("repetition_penalty", 0.0), ("temperature", True)])
def test_a_meaningless_value_is_refused_naming_the_option(field, value):
    with pytest.raises(ConfigError, match=field):
        SamplingOptions(**{field: value})


def test_options_come_as_an_object_or_as_keywords_never_both():
    options = SamplingOptions(temperature=0.5, top_k=3)
    assert SamplingOptions.of(options) is options
    assert SamplingOptions.of(None, temperature=0.5, top_k=3) == options
    with pytest.raises(TypeError, match="twice"):
        SamplingOptions.of(options, top_k=3)
    with pytest.raises(TypeError):
        SamplingOptions.of(None, topk=3)  # a misspelt keyword is an error, not ignored
    assert SamplingOptions(temperature=0).is_greedy and SamplingOptions(greedy=True).is_greedy
    assert not SamplingOptions().is_greedy


def test_the_object_and_the_keywords_give_the_same_tokens():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=23, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.tensor([[1, 2, 3]])
    options = SamplingOptions(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.2)
    by_object = generate_ids(model, idx, max_new_tokens=12, sampling=options, seed=4)
    by_keywords = generate_ids(model, idx, max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.9,
                               repetition_penalty=1.2, seed=4)
    assert torch.equal(by_object, by_keywords)
    logits = torch.randn(4, 23, generator=torch.Generator().manual_seed(1))
    a = choose_next(logits, None, options, generator=torch.Generator().manual_seed(2))
    b = choose_next(logits, None, generator=torch.Generator().manual_seed(2), temperature=0.7, top_k=5, top_p=0.9,
                    repetition_penalty=1.2)
    assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="top_p"):  # checked before the first step
        next(iter_tokens(model, idx, max_new_tokens=2, top_p=2.0))


# --------------------------------------------------------------------------------------------
# The sampling filters against brute force
# --------------------------------------------------------------------------------------------


def test_top_k_1_equals_greedy():
    model = tiny_model(seed=5)
    idx = torch.randint(0, TINY["vocab_size"], (3, 4), generator=torch.Generator().manual_seed(0))
    greedy = generate_ids(model, idx, max_new_tokens=60, greedy=True)
    for seed in range(3):
        assert torch.equal(generate_ids(model, idx, max_new_tokens=60, top_k=1, seed=seed), greedy)


def test_temperature_towards_zero_equals_greedy():
    model = tiny_model(seed=6)
    idx = torch.randint(0, TINY["vocab_size"], (3, 4), generator=torch.Generator().manual_seed(0))
    greedy = generate_ids(model, idx, max_new_tokens=60, greedy=True)
    assert torch.equal(generate_ids(model, idx, max_new_tokens=60, temperature=0.0), greedy)
    assert torch.equal(generate_ids(model, idx, max_new_tokens=60, temperature=1e-5, seed=1), greedy)
    # and the plain argmax, computed here, is what greedy means
    assert torch.equal(greedy, plain_loop(model, idx, 60)[0])


def _brute_force_nucleus_size(probs: np.ndarray, p: float) -> int:
    """Size of the smallest subset of tokens whose probabilities sum to at least p, by trying
    every subset of every size."""
    V = len(probs)
    for size in range(1, V + 1):
        if any(sum(probs[list(c)]) >= p for c in itertools.combinations(range(V), size)):
            return size
    return V


@settings(max_examples=150, deadline=None)
@given(
    logits=st.lists(st.floats(-8, 8, allow_nan=False, width=32), min_size=1, max_size=7),
    p=st.floats(1e-6, 1.0, exclude_min=False),
)
def test_top_p_matches_brute_force_and_is_never_empty(logits, p):
    row = torch.tensor([logits], dtype=torch.float32)  # (1, V)
    probs = torch.softmax(row.double(), dim=-1)[0].numpy()
    # Keep clear of sums that equal p to within float32 rounding, where either answer is right.
    cums = np.cumsum(np.sort(probs)[::-1])
    assume(np.all(np.abs(cums - p) > 1e-5))
    kept = torch.isfinite(top_p_filter(row, p))[0].numpy()
    assert kept.sum() >= 1
    assert kept.sum() == _brute_force_nucleus_size(probs, p)
    assert probs[kept].sum() >= p - 1e-6
    if (~kept).any():  # a kept token is never less likely than a dropped one
        assert probs[kept].min() >= probs[~kept].max()
    # kept scores are untouched
    assert torch.equal(top_p_filter(row, p)[0][torch.from_numpy(kept)], row[0][torch.from_numpy(kept)])


@settings(max_examples=100, deadline=None)
@given(
    logits=st.lists(st.floats(-4, 4, allow_nan=False, width=32), min_size=2, max_size=7),
    k=st.integers(0, 6),
    offset=st.floats(1e-4, 2e-3),
    above=st.booleans(),
)
def test_top_p_just_above_and_below_each_cumulative_sum(logits, k, offset, above):
    """p placed a hair away from where one more token becomes necessary: the borderline cases."""
    row = torch.tensor([logits], dtype=torch.float32)
    probs = torch.softmax(row.double(), dim=-1)[0].numpy()
    cums = np.cumsum(np.sort(probs)[::-1])
    p = float(cums[min(k, len(cums) - 1)] + (offset if above else -offset))
    assume(0.0 < p < 1.0 and np.all(np.abs(cums - p) > 5e-5))
    kept = torch.isfinite(top_p_filter(row, p))[0].numpy()
    assert kept.sum() == _brute_force_nucleus_size(probs, p)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.99, 0.999999])
def test_top_p_over_a_gpt2_sized_vocabulary_against_a_full_sort(p):
    """Rows peaked to flat (nuclei from one token to most of 50,257) in one batch, so the filter's
    shortcut (sort only the likeliest k) is tried at every depth, and shared by rows that need
    different k; the kept set against NumPy's full sort of every row."""
    gen = torch.Generator().manual_seed(int(p * 1e6))
    scales = torch.tensor([[12.0], [4.0], [1.5], [0.3], [0.0]])
    logits = torch.randn(5, 50257, generator=gen) * scales
    logits[4] = torch.arange(50257) * 1e-4  # all distinct, nearly flat
    kept = torch.isfinite(top_p_filter(logits, p)).numpy()
    probs = torch.softmax(logits.double(), dim=-1).numpy()
    for r in range(5):
        order = np.argsort(-probs[r], kind="stable")
        before = np.cumsum(probs[r][order]) - probs[r][order]  # mass ranked above each, float64
        # float32 running sums over 50k tokens may be off by ~1e-5: those close to p go either way
        must, may = max(1, int((before < p - 1e-4).sum())), max(1, int((before < p + 1e-4).sum()))
        n = int(kept[r].sum())
        assert must <= n <= may, (r, must, n, may)
        assert kept[r][order[:n]].all()  # the n most probable


def test_top_p_by_hand():
    row = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    for p, want in [(0.1, [False, True, False]), (0.4999, [False, True, False]), (0.5001, [False, True, True]),
                    (0.7999, [False, True, True]), (0.8001, [True, True, True]), (1.0, [True, True, True])]:
        assert torch.isfinite(top_p_filter(row, p))[0].tolist() == want, p


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.one_of(st.floats(-1e4, 1e4, width=32), st.just(float("-inf"))), min_size=1, max_size=9),
    p=st.floats(0.0, 1.0, exclude_min=True),
)
def test_top_p_keeps_at_least_one_token_even_at_extremes(logits, p):
    assume(any(math.isfinite(x) for x in logits))
    kept = torch.isfinite(top_p_filter(torch.tensor([logits]), p))
    assert kept.sum() >= 1


def test_top_k_and_min_p_against_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 30)).astype(np.float32)
    t = torch.from_numpy(logits)
    for k in (1, 3, 30, 50):
        kept = torch.isfinite(top_k_filter(t, k)).numpy()
        want = np.zeros_like(kept)
        for r in range(4):
            want[r, np.argsort(-logits[r])[: min(k, 30)]] = True
        assert (kept == want).all()
    for min_p in (0.0, 0.05, 0.3, 1.0):
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        want = probs >= min_p * probs.max(1, keepdims=True) - 1e-7
        assert (torch.isfinite(min_p_filter(t, min_p)).numpy() == want).all()


def test_repetition_penalty_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    previous = torch.tensor([[0, 1, 1]])  # tokens 0 and 1 already present (1 twice)
    got = apply_repetition_penalty(logits, previous, 2.0)
    assert torch.equal(got, torch.tensor([[1.0, -2.0, 0.5, 3.0]]))
    assert torch.equal(logits, torch.tensor([[2.0, -1.0, 0.5, 3.0]]))  # input untouched
    # with a strong penalty the greedy choice moves away from a seen token
    assert choose_next(torch.tensor([[3.0, 2.9]]), torch.tensor([[0]]), repetition_penalty=1.5, greedy=True).item() == 1


def test_multinomial_draws_follow_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(20000, 1)
    draws = sample(logits, make_generator(0))
    freq = torch.bincount(draws, minlength=4).double() / 20000
    want = torch.softmax(torch.tensor([0.0, 1.0, 2.0, -1.0], dtype=torch.float64), 0)
    assert torch.allclose(freq, want, atol=0.015)


def test_a_draw_never_lands_on_a_filtered_token_and_bad_scores_are_refused():
    inf = float("-inf")
    rows = torch.tensor([[inf, 0.0, inf, 0.0, inf], [3.0, inf, inf, inf, inf], [inf, inf, inf, inf, -2.0]])
    draws = sample(rows.repeat(4000, 1), make_generator(1)).view(4000, 3)
    assert set(draws[:, 0].tolist()) == {1, 3} and abs((draws[:, 0] == 1).double().mean() - 0.5) < 0.03
    assert (draws[:, 1] == 0).all() and (draws[:, 2] == 4).all()  # the only finite score, first or last
    with pytest.raises(ValueError, match="NaN"):
        sample(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="-inf"):
        sample(torch.tensor([[inf, inf]]))


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-53, 1.0])  # the ends of [0, 1), and one past (rounding)
def test_a_uniform_at_either_end_picks_the_first_or_last_token_that_can_be_drawn(u, monkeypatch):
    inf = float("-inf")
    rows = torch.tensor([[inf, inf, 1.0, 0.5, inf], [inf, 0.0, inf, 0.0, inf]])
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.full(shape, u, dtype=kw.get("dtype")))
    want = [2, 1] if u == 0.0 else [3, 3]
    assert sample(rows).tolist() == want


def _frequencies(logits: torch.Tensor, n_batches: int = 20, **options) -> torch.Tensor:
    gen = make_generator(4)
    draws = torch.cat([choose_next(logits[None].repeat(5000, 1), generator=gen, **options) for _ in range(n_batches)])
    return torch.bincount(draws, minlength=logits.numel()).double() / draws.numel()


def test_top_k_with_top_p_and_min_p_draws_what_the_numpy_pipeline_says():
    """The draw after top-k (narrowed to the k candidates) against the whole pipeline written
    out in NumPy over the full vocabulary: top-k, then the nucleus, then min-p, then softmax."""
    logits = torch.randn(300, generator=torch.Generator().manual_seed(5)) * 2.0
    x = logits.double().numpy() / 0.9
    keep = x >= np.sort(x)[::-1][39]  # top 40
    probs = np.where(keep, np.exp(x - x.max()), 0.0)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    nucleus = np.zeros_like(keep)
    nucleus[order[: max(1, int((before < 0.8).sum()))]] = True
    probs = np.where(nucleus & (probs >= 0.03 * probs.max()), probs, 0.0)
    want = torch.from_numpy(probs / probs.sum())
    freq = _frequencies(logits, temperature=0.9, top_k=40, top_p=0.8, min_p=0.03)
    assert (freq[want == 0] == 0).all() and (want > 0).sum() > 5
    assert torch.allclose(freq, want, atol=0.006)


def test_top_k_keeps_tokens_tied_with_the_kth_in_the_draw():
    logits = torch.tensor([3.0, 2.0, 1.0, 2.0, 0.0])  # k = 2: tokens 1 and 3 tie for second place
    freq = _frequencies(logits, n_batches=4, top_k=2)
    want = torch.softmax(torch.tensor([3.0, 2.0, -math.inf, 2.0, -math.inf], dtype=torch.float64), 0)
    assert torch.allclose(freq, want, atol=0.015) and freq[3] > 0.1


def test_draws_follow_a_wide_distribution():
    """1000 tokens of very different probabilities (GPT-2 has 50,257): the frequency of each
    decile of the vocabulary, and of the 5 likeliest tokens, against softmax in float64."""
    logits = torch.linspace(-6.0, 2.0, 1000)[torch.randperm(1000, generator=torch.Generator().manual_seed(0))]
    gen = make_generator(3)
    draws = torch.cat([sample(logits[None].repeat(5000, 1), gen) for _ in range(20)])  # 100,000 draws
    want = torch.softmax(logits.double(), 0)
    freq = torch.bincount(draws, minlength=1000).double() / 100_000
    assert torch.allclose(freq.view(10, 100).sum(1), want.view(10, 100).sum(1), atol=0.006)
    top = torch.topk(want, 5).indices
    assert torch.allclose(freq[top], want[top], atol=0.004)


def test_one_seed_one_output_whatever_the_global_rng_does():
    model = tiny_model(seed=7)
    idx = torch.zeros(2, 1, dtype=torch.long)
    opts = dict(max_new_tokens=50, temperature=1.3, top_k=10, top_p=0.95, min_p=0.01)
    torch.manual_seed(123)
    a = generate_ids(model, idx, seed=42, **opts)
    torch.manual_seed(999)
    torch.rand(10)
    b = generate_ids(model, idx, seed=42, **opts)
    c = generate_ids(model, idx, seed=43, **opts)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # the cache does not change what a seed draws either
    assert torch.equal(generate_ids(model, idx, seed=42, use_cache=False, **opts), a)


def test_bad_options_are_refused_by_name():
    model = tiny_model()
    idx = torch.zeros(1, 1, dtype=torch.long)
    for bad, name in [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(max_new_tokens=10**6), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=2.0), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
    ]:
        with pytest.raises(UserError, match=name):
            generate_ids(model, idx, **{"max_new_tokens": 3, **bad})


def test_greedy_ids_takes_the_first_of_equal_maxima_row_by_row():
    from scratchlm.generation.sampling import greedy_ids

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        logits = torch.randn(5, 300, generator=g, dtype=dtype)
        logits[1, 7] = logits[1, 200] = 99.0  # a tie: the first one wins
        logits[2, :] = -1.0  # all equal: index 0
        logits[3, -1] = float("inf")
        got = greedy_ids(logits)
        rows = logits.tolist()
        want = [max(range(len(row)), key=lambda i: (row[i], -i)) for row in rows]  # brute force, first on ties
        assert got.dtype == torch.int64 and got.shape == (5,)
        assert got.tolist() == want
        assert want[1] == 7 and want[2] == 0 and want[3] == 299


# --------------------------------------------------------------------------------------------
# Closing what mutation testing walked through (python scripts/mutate.py sampling)
# --------------------------------------------------------------------------------------------


def test_max_new_tokens_bounds_are_exact():
    from scratchlm.generation.sampling import MAX_NEW_TOKENS_LIMIT, check_max_new_tokens

    for fine in (0, 1, MAX_NEW_TOKENS_LIMIT):
        check_max_new_tokens(fine)
    for bad in (-1, MAX_NEW_TOKENS_LIMIT + 1, True, 2.0, "3"):
        with pytest.raises(ConfigError, match="max_new_tokens"):
            check_max_new_tokens(bad)
    model = tiny_model(seed=3)
    idx = torch.tensor([[1, 2]])
    assert torch.equal(generate_ids(model, idx, max_new_tokens=0, greedy=True), idx)  # nothing added, no error


def test_repetition_penalty_on_small_scores_and_nothing_seen_by_hand():
    logits = torch.tensor([[0.5, -0.5, 0.0, 2.0]])
    got = apply_repetition_penalty(logits, torch.tensor([[0, 1, 2]]), 2.0)
    assert torch.equal(got, torch.tensor([[0.25, -1.0, 0.0, 2.0]]))  # 0.5 is positive: divided, not multiplied
    nothing = torch.zeros(1, 0, dtype=torch.long)
    assert torch.equal(apply_repetition_penalty(logits, nothing, 2.0), logits)
    assert torch.equal(apply_repetition_penalty(logits, torch.tensor([[0]]), 1.0), logits)


def test_temperature_by_hand():
    from scratchlm.generation.sampling import apply_temperature

    logits = torch.tensor([[3.0, -1.5, 0.75]])
    assert torch.equal(apply_temperature(logits, 1.5), logits / 1.5)
    assert torch.equal(apply_temperature(logits, 0.5), logits / 0.5)
    assert torch.equal(apply_temperature(logits, 1.0), logits)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="greedy"):
            apply_temperature(logits, bad)


def test_top_k_on_a_single_row_by_hand():
    """One row (B = 1 < k): the filter and the draw keep the k best of the row's V scores."""
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    assert top_k_filter(logits, 2).tolist() == [[float("-inf"), 5.0, float("-inf"), 4.0, float("-inf")]]
    assert torch.equal(top_k_filter(logits, 5), logits)
    g = torch.Generator().manual_seed(0)
    drawn = {int(choose_next(logits, top_k=2, temperature=3.0, generator=g)) for _ in range(200)}
    assert drawn == {1, 3}


def test_top_p_drops_the_token_whose_mass_above_equals_p():
    """The documented rule, at its edge: a token stays while the mass ranked above it is < p,
    so with p equal to the top token's probability (as computed) the second token goes."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    top = float(torch.softmax(logits, dim=-1)[0, 0])
    kept = top_p_filter(logits, top).isfinite().tolist()[0]
    assert kept == [True, False, False, False]
    above = float(torch.nextafter(torch.tensor(top), torch.tensor(1.0)))  # p a hair above: the second stays
    assert top_p_filter(logits, above).isfinite().tolist()[0] == [True, True, False, False]


def test_greedy_ids_of_rows_numpy_cannot_take():
    """bfloat16 rows and rows that require grad take torch's path: the same first-of-equal-maxima."""
    from scratchlm.generation.sampling import greedy_ids

    rows = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 3.0, 3.0]])
    assert greedy_ids(rows.bfloat16()).tolist() == [1, 0]
    assert greedy_ids(rows.clone().requires_grad_()).tolist() == [1, 0]


def test_float64_scores_are_drawn_at_float64_precision(monkeypatch):
    """Two tokens 2e-12 apart around one half: float64 tells them apart, float32 cannot. A
    uniform just below the first token's stretch end must land on it."""
    logits = torch.tensor([[1e-12, -1e-12]], dtype=torch.float64)
    first = float(torch.softmax(logits, dim=-1)[0, 0])
    assert first > 0.5 and torch.tensor(first, dtype=torch.float32) == 0.5
    u = (0.5 + first) / 2  # inside token 0's stretch, beyond what float32 can hold apart from 0.5
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.full(shape, u, dtype=kw.get("dtype")))
    assert sample(logits).tolist() == [0]


def test_options_are_frozen_once_checked():
    import dataclasses

    options = SamplingOptions(top_p=0.9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.top_p = 5.0  # a check passed once must stay true


def test_the_edges_of_each_range():
    for fine in (dict(top_p=1.0), dict(min_p=1.0), dict(min_p=0.0), dict(temperature=0.0)):
        SamplingOptions(**fine)
    for name, bad in (("top_p", 1.0001), ("min_p", 1.2), ("min_p", -1e-9)):
        with pytest.raises(ConfigError, match=name):
            SamplingOptions(**{name: bad})


def test_unseeded_generators_draw_differently():
    a, b = make_generator(None), make_generator(None)
    assert not torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=b))
    c, d = make_generator(7), make_generator(7)
    assert torch.equal(torch.rand(8, generator=c), torch.rand(8, generator=d))


def test_a_single_row_keeps_tokens_tied_with_the_kth():
    """One row at a time (as generation draws): ties with the k-th stay candidates."""
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 0.0]])  # k = 2: tokens 1, 2 and 3 tie for second place
    g = make_generator(1)
    drawn = {int(choose_next(logits, top_k=2, temperature=5.0, generator=g)) for _ in range(300)}
    assert drawn == {0, 1, 2, 3}


def test_the_nucleus_reaches_p_when_the_big_tokens_fall_just_short():
    """Two tokens hold 0.9 of the mass, many small ones the rest; with p a few millionths above
    0.9 the nucleus needs a third token, though the two big ones hold p to within the 1e-5 margin
    that only decides how many tokens to sort."""
    logits = torch.cat([torch.tensor([5.0, 5.0]), torch.linspace(-2.0, -2.5, 40)])[None]
    probs = torch.softmax(logits, dim=-1)
    p = float(probs[0, :2].sum()) + 5e-6
    kept = top_p_filter(logits, p).isfinite()[0]
    assert int(kept.sum()) == 3 and bool(kept[:2].all())

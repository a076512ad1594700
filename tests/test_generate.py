"""Generation at the level of ids: the KV cache against the plain loop, the seeded draw, end-of-text
rows, and beam search against an exhaustive search (scratchlm.generation.engine, through the
entry points of scratchlm.generation.generate). Text in / text out: test_generate_text.py; the
command line: test_generate_cli.py; the settings record and the Engine: test_engine.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchlm.errors import UserError
from scratchlm.generation.generate import beam_search, generate, generate_ids, iter_tokens, stream
from scratchlm.model.gpt import GPT

from helpers import TINY, LettersTokenizer, letters_model, lively_model, plain_loop, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py


# --------------------------------------------------------------------------------------------
# KV cache == plain loop
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "none"])
def test_cached_greedy_equals_plain_loop_over_200_tokens_across_the_boundary(pos):
    model = lively_model(pos)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, TINY["vocab_size"], (2, 5), generator=gen)  # batch of 2 different prompts
    expected, expected_logits = plain_loop(model, idx, 200)  # crosses block_size=16 at step 12
    steps = list(iter_tokens(model, idx, max_new_tokens=200, greedy=True, use_cache=True))
    cached = torch.cat([idx, torch.stack([t for t, _ in steps], dim=1)], dim=1)
    assert torch.equal(cached, expected)
    plain = list(iter_tokens(model, idx, max_new_tokens=200, greedy=True, use_cache=False))
    for step, ((_, got), (_, ours_plain), want) in enumerate(zip(steps, plain, expected_logits)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=f"step {step}")
        torch.testing.assert_close(got, ours_plain, atol=1e-4, rtol=0, msg=f"step {step}")
    uncached = generate_ids(model, idx, max_new_tokens=200, greedy=True, use_cache=False)
    assert torch.equal(uncached, expected)
    # the output is not a trivial repetition of one token, or the comparison would say little
    assert min(len(set(row[5:].tolist())) for row in expected) > 2


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "none"])
def test_cached_sampling_draws_what_the_plain_loop_draws(pos):
    model = lively_model(pos)
    idx = torch.randint(0, TINY["vocab_size"], (2, 3), generator=torch.Generator().manual_seed(2))
    block = model.config.block_size
    ref, gen = idx, torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _ in range(100):  # station 19 with a draw by the inverse CDF, written out here in NumPy
            probs = torch.softmax(model(ref[:, -block:])[0][:, -1, :].double(), dim=-1).numpy()
            u = torch.rand((len(probs), 1), generator=gen, dtype=torch.float64).numpy()
            picks = [int(np.flatnonzero(np.cumsum(row) > x * row.sum())[0]) for row, x in zip(probs, u[:, 0])]
            ref = torch.cat([ref, torch.tensor(picks)[:, None]], dim=1)
    for use_cache in (True, False):
        got = generate_ids(model, idx, max_new_tokens=100, generator=torch.Generator().manual_seed(7), use_cache=use_cache)
        assert torch.equal(got, ref)
    assert len(set(ref[0].tolist())) > 5


@pytest.mark.parametrize("prompt_len", [1, 15, 16, 17, 40])
def test_cache_exact_for_prompts_at_and_beyond_the_context(prompt_len):
    model = tiny_model(seed=3, pos_embedding="rope")
    idx = torch.randint(0, TINY["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    expected, expected_logits = plain_loop(model, idx, 20)
    steps = list(iter_tokens(model, idx, max_new_tokens=20, greedy=True))
    assert torch.equal(torch.cat([idx, torch.stack([t for t, _ in steps], 1)], 1), expected)
    for (_, got), want in zip(steps, expected_logits):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_generation_restores_training_mode_and_needs_no_grad():
    model = tiny_model(dropout=0.5)
    model.train()
    idx = torch.zeros(1, 3, dtype=torch.long)
    a = generate_ids(model, idx, max_new_tokens=30, greedy=True)
    b = generate_ids(model, idx, max_new_tokens=30, greedy=True)
    assert torch.equal(a, b)  # dropout was off while generating
    assert model.training
    # no graph is built: every step runs under inference mode, on the model itself (few steps)
    # and on its decoding copy (MUTATION, issue 21: @torch.inference_mode() removed passed)
    for steps in (3, 30):
        for _, logits in iter_tokens(model, idx, max_new_tokens=steps, greedy=True, use_cache=steps > 3):
            assert logits.is_inference() and not logits.requires_grad and logits.grad_fn is None
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------


def test_beam_width_1_equals_greedy_with_and_without_cache():
    model = tiny_model(seed=8)
    idx = torch.randint(0, TINY["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(2))
    greedy = plain_loop(model, idx, 30)[0][0].tolist()
    for use_cache in (True, False):
        [(ids, _)] = beam_search(model, idx, beams=1, max_new_tokens=30, use_cache=use_cache)
        assert ids == greedy


@torch.no_grad()
def _score(model: GPT, prompt: list[int], continuation: list[int]) -> float:
    """log p(continuation | prompt) from one plain forward over the whole sequence."""
    ids = torch.tensor([prompt + continuation])
    logp = F.log_softmax(model(ids)[0][0].double(), dim=-1)  # (T, V)
    return sum(float(logp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(continuation))


def test_wide_beam_equals_exhaustive_search_and_reports_the_models_own_scores():
    V, steps, prompt = 3, 4, [0, 2]
    model = tiny_model(seed=9, vocab_size=V, block_size=8, n_embd=16)
    everything = {c: _score(model, prompt, list(c)) for c in itertools.product(range(V), repeat=steps)}
    best = max(everything, key=everything.get)
    width = V**steps  # as wide as the number of possible continuations: nothing is pruned
    results = beam_search(model, torch.tensor(prompt), beams=width, max_new_tokens=steps, num_samples=width)
    ids, logprob = results[0]
    assert ids == prompt + list(best)
    assert logprob == pytest.approx(everything[best], abs=1e-4)
    assert {tuple(r[0][len(prompt) :]) for r in results} == set(everything)
    for seq, lp in results:
        assert lp == pytest.approx(everything[tuple(seq[len(prompt) :])], abs=1e-4)
    # a narrow beam still reports true scores for what it returns
    for seq, lp in beam_search(model, torch.tensor(prompt), beams=2, max_new_tokens=steps, num_samples=2):
        assert lp == pytest.approx(_score(model, prompt, seq[len(prompt) :]), abs=1e-4)


def test_wide_beam_with_eos_equals_exhaustive_search_with_length_penalty():
    V, steps, prompt, eos = 3, 3, [1], 2
    model = tiny_model(seed=10, vocab_size=V, block_size=8, n_embd=16)
    # every possible output: stop at the first eos, or run all steps
    candidates = set()
    for c in itertools.product(range(V), repeat=steps):
        c = list(c)
        candidates.add(tuple(c[: c.index(eos) + 1]) if eos in c else tuple(c))
    for alpha in (0.0, 1.0, 2.0):
        ranked = sorted(candidates, key=lambda c: _score(model, prompt, list(c)) / len(c) ** alpha, reverse=True)
        [(ids, lp)] = beam_search(model, torch.tensor(prompt), beams=V**steps, max_new_tokens=steps,
                                  length_penalty=alpha, eos_id=eos)
        assert ids == prompt + list(ranked[0])
        assert lp == pytest.approx(_score(model, prompt, list(ranked[0])), abs=1e-4)
        # the whole ranking, finished (eos) beams among the live ones: every candidate, in order
        every = beam_search(model, torch.tensor(prompt), beams=V**steps, max_new_tokens=steps, length_penalty=alpha,
                            eos_id=eos, num_samples=len(candidates))
        assert [tuple(ids[len(prompt) :]) for ids, _ in every] == ranked  # eos-ended ones included


def test_beam_search_cache_is_exact_across_the_boundary():
    model = tiny_model(seed=11, pos_embedding="learned")
    idx = torch.randint(0, TINY["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(4))
    a = beam_search(model, idx, beams=4, max_new_tokens=20, num_samples=4, use_cache=True)
    b = beam_search(model, idx, beams=4, max_new_tokens=20, num_samples=4, use_cache=False)
    assert [x for x, _ in a] == [x for x, _ in b]
    for (seq, lp_a), (_, lp_b) in zip(a, b):
        assert lp_a == pytest.approx(lp_b, abs=1e-4)


# --------------------------------------------------------------------------------------------
# Closing what mutation testing walked through (python scripts/mutate.py generate)
# --------------------------------------------------------------------------------------------


def test_bad_prompts_and_beam_settings_are_refused():
    model = tiny_model()
    for bad in (torch.zeros(3, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long)):
        with pytest.raises(ValueError, match="idx"):
            next(iter_tokens(model, bad, max_new_tokens=2))
    for width, n_best, name in ((0, 1, "beams"), (2, 0, "num_samples")):
        with pytest.raises(UserError, match=name):
            beam_search(model, torch.tensor([1]), beams=width, max_new_tokens=3, num_samples=n_best)
    tok = LettersTokenizer()
    model = letters_model()
    for options, name in ((dict(num_samples=0), "num_samples"), (dict(beams=0), "beams"), (dict(beams=True), "beams"),
                          (dict(num_samples=2.5), "num_samples")):
        with pytest.raises(UserError, match=name):
            generate(model, tok, "abc", max_new_tokens=2, **options)
    with pytest.raises(UserError, match="max_new_tokens"):
        stream(model, tok, "abc", max_new_tokens=-1)  # at the call, before the first piece is asked for


def test_generate_ids_stops_rows_at_eos_and_pads_them_with_it():
    """By hand: the plain greedy loop, with each row frozen at eos once it has produced it."""
    model = tiny_model(seed=4)
    idx = torch.tensor([[1, 2], [3, 4], [5, 6]])
    free = generate_ids(model, idx, max_new_tokens=12, greedy=True)
    eos = int(free[0, 4])  # a token row 0 produces at its third step
    got = generate_ids(model, idx, max_new_tokens=12, greedy=True, eos_id=eos)
    want = free.clone()
    for row in range(3):
        hits = (free[row, 2:] == eos).nonzero()
        if len(hits):
            want[row, 2 + int(hits[0]) :] = eos
    n = got.shape[1]
    assert torch.equal(got, want[:, :n])
    assert n == free.shape[1] or bool((got[:, -1] == eos).all())  # stopped early only when every row was done


def test_beams_2_is_beam_search():
    tok = LettersTokenizer()
    model = letters_model(seed=13)
    out = generate(model, tok, "abc", max_new_tokens=5, beams=2, num_samples=2)
    best = beam_search(model, torch.tensor(tok.encode("abc")), beams=2, max_new_tokens=5, num_samples=2,
                       eos_id=tok.eos_id, vocab=tok.vocab_size)
    want = [[i for i in ids[3:] if i != tok.eos_id] for ids, _ in best]  # text rows end before eos
    assert out.all_ids == want and out.logprobs == pytest.approx([lp for _, lp in best])



# ------------------------------------------------------------------------------ mutation survivors (issue 21)


def test_generate_ids_seed_fixes_a_sampled_draw():
    """seed builds the draw's generator: the same seed twice gives the same ids, whatever the
    global RNG did in between, and another seed other ids."""
    model, idx = tiny_model(seed=3), torch.tensor([[1, 2, 3]])
    first = generate_ids(model, idx, max_new_tokens=20, seed=11, temperature=1.5)
    torch.manual_seed(999)
    torch.rand(7)  # move the global stream: a draw that used it would now differ
    assert torch.equal(generate_ids(model, idx, max_new_tokens=20, seed=11, temperature=1.5), first)
    assert not torch.equal(generate_ids(model, idx, max_new_tokens=20, seed=12, temperature=1.5), first)


def test_beam_search_checks_max_new_tokens():
    from scratchlm.errors import ConfigError

    with pytest.raises(ConfigError, match="max_new_tokens"):
        beam_search(tiny_model(), torch.tensor([1, 2]), beams=2, max_new_tokens=-1)


def test_when_every_beam_ends_at_eos_only_finished_beams_are_returned():
    """With one allowed id (vocab=1), the end-of-text token, every candidate finishes at the first
    step and no live beam is left: the result is that one finished beam (log p = 0), never the
    bare prompt as well."""
    best = beam_search(tiny_model(seed=5), torch.tensor([1, 2, 3]), beams=2, max_new_tokens=5, num_samples=2, eos_id=0,
                       vocab=1)
    assert best == [([1, 2, 3, 0], 0.0)]
    # and with the whole vocabulary, every beam returned still ends where it finished
    model = tiny_model(seed=5)
    with torch.no_grad():
        model.lm_head.bias.zero_()
        model.lm_head.bias[7] = 50.0  # p(eos) ~ 1 at every position
    assert all(ids[-1] == 7 for ids, _ in beam_search(model, torch.tensor([1, 2, 3]), beams=3, max_new_tokens=5,
                                                    num_samples=3, eos_id=7))

"""What the playground's token popup stands on (issue 34): the distribution the draw used (q,
after the repetition penalty, temperature and filters) beside the model's own (p), and a
continuation that starts from a token the reader chose ("take this token instead": the `forced`
ids of POST /api/generate, Engine.stream_tokens(forced=...)).

q is checked against a NumPy computation written here from the definitions and against the
draw's own frequencies; a continuation against generating from the same ids given as the prompt.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from helpers import cli_generate, parse_sse, request


def events_of(port: int, body: dict) -> list[tuple[str, dict]]:
    status, text = request(port, "POST", "/api/generate", body)
    assert status == 200, text
    return parse_sse(text)


def numpy_q(logits: np.ndarray, previous: list[int], temperature=1.0, top_k=None, top_p=None, min_p=None,
            repetition_penalty=1.0, greedy=False) -> np.ndarray:
    """The draw's distribution by the definitions, in float64 NumPy: seen tokens' scores divided
    (positive) or multiplied (negative) by the penalty; greedy all on the first largest; else
    scores / T, then keep the k largest (and ties), the smallest likeliest set holding p (a token
    stays while the mass ranked above it is < p), and those at least min_p times the top one."""
    z = logits.astype(np.float64).copy()
    for i in set(previous):
        z[i] = z[i] / repetition_penalty if z[i] > 0 else z[i] * repetition_penalty
    if greedy or temperature == 0:
        q = np.zeros_like(z)
        q[int(np.argmax(z))] = 1.0
        return q
    z = z / temperature
    keep = np.ones(z.shape, bool)
    if top_k is not None:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    if top_p is not None:
        probs = np.where(keep, np.exp(z - z[keep].max()), 0)
        probs /= probs.sum()
        order = np.argsort(-z, kind="stable")
        above = np.cumsum(probs[order]) - probs[order]
        keep_p = np.zeros_like(keep)
        keep_p[order] = above < top_p
        keep_p[order[0]] = True
        keep &= keep_p
    if min_p is not None:
        keep &= z >= z[keep].max() + np.log(min_p)
    q = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    return q / q.sum()


OPTIONS = [dict(temperature=0.7), dict(temperature=1.3, top_k=5), dict(top_p=0.6), dict(min_p=0.2, temperature=2.0),
           dict(repetition_penalty=1.8, top_k=10), dict(greedy=True, repetition_penalty=3.0),
           dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.2)]


@pytest.mark.parametrize("options", OPTIONS, ids=[",".join(o) for o in OPTIONS])
def test_sampling_probs_is_the_distribution_by_its_definition(options):
    from scratchlm.generation.sampling import sampling_probs

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 40, generator=g) * 2.5
    previous = torch.randint(0, 40, (4, 12), generator=g)
    q = sampling_probs(logits, previous, **options)
    for row in range(4):
        expected = numpy_q(logits[row].numpy(), previous[row].tolist(), **options)
        np.testing.assert_allclose(q[row].numpy(), expected, atol=1e-6)
        assert (q[row].numpy() == 0).tolist() == (expected == 0).tolist()  # filtered means exactly 0


def test_the_draw_follows_the_distribution_shown():
    """choose_next's draws, 40,000 of one row, land on each token about as often as q says (and
    never on a token q calls filtered out)."""
    from scratchlm.generation.sampling import choose_next, sampling_probs

    options = dict(temperature=1.4, top_k=8, top_p=0.85, repetition_penalty=1.5)
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(1, 30, generator=g)
    previous = torch.tensor([[0, 1, 2, 3]])
    q = sampling_probs(logits, previous, **options)[0].numpy()
    draws = choose_next(logits.expand(40_000, -1), previous.expand(40_000, -1), generator=g, **options)
    counts = np.bincount(draws.numpy(), minlength=30) / 40_000
    assert counts[q == 0].sum() == 0
    bound = 4 * np.sqrt(q * (1 - q) / 40_000)  # four standard deviations of each count (fixed seed)
    assert (np.abs(counts - q) <= bound).all(), (counts, q)


def test_each_token_event_carries_the_draws_probability_beside_the_models(served, runs):
    """q of every token (and of its top five) against numpy_q of the model's plain forward pass
    over the sequence so far; a drawn token always had q > 0."""
    from scratchlm.checkpoint import load_model

    options = dict(temperature=1.3, top_k=4, repetition_penalty=1.3)
    events = events_of(served.port, {"run": "mixed", "prompt": "ROMEO:", "max_new_tokens": 20, "seed": 5, **options})
    model, tokenizer, _ = load_model(runs / "mixed")
    model = model.double()
    ids = tokenizer.encode("ROMEO:")
    tokens = [d for e, d in events if e == "token"]
    assert tokens and not any(d["forced"] for d in tokens)
    for data in tokens:
        with torch.no_grad():
            logits = model(torch.tensor([ids[-model.config.block_size:]]))[0][0, -1].numpy()
        q = numpy_q(logits[: tokenizer.vocab_size], ids, **options)
        assert data["q"] == pytest.approx(q[data["id"]], abs=1e-6) and data["q"] > 0
        assert [t["q"] for t in data["top"]] == pytest.approx([q[t["id"]] for t in data["top"]], abs=1e-6)
        ids.append(data["id"])


def test_with_default_settings_q_is_p(served):
    events = events_of(served.port, {"run": "mixed", "prompt": "ROMEO:", "max_new_tokens": 8, "seed": 1})
    tokens = [d for e, d in events if e == "token"]
    assert tokens and all(d["q"] == d["p"] and all(t["q"] == t["p"] for t in d["top"]) for d in tokens)


def test_a_continuation_takes_the_given_tokens_then_goes_on_from_them(served, runs):
    """The forced ids come back first, marked forced, with the text they make; what follows is
    what a greedy generation from the prompt and those tokens gives (the command line's, from
    the same text as its prompt: the char tokenizer encodes it to the same ids)."""
    from scratchlm.checkpoint import load_model

    _, tokenizer, _ = load_model(runs / "mixed")
    forced = tokenizer.encode("nobody ") + tokenizer.encode("霜")
    events = events_of(served.port, {"run": "mixed", "prompt": "ROMEO:", "max_new_tokens": 30, "greedy": True,
                                     "forced": forced})
    tokens = [d for e, d in events if e == "token"]
    assert [d["id"] for d in tokens[: len(forced)]] == forced
    assert [d["forced"] for d in tokens] == [True] * len(forced) + [False] * (len(tokens) - len(forced))
    assert "".join(d["text"] for d in tokens[: len(forced)]) == "nobody 霜"
    after = cli_generate(runs / "mixed", "ROMEO:nobody 霜", "--greedy", "--max-new-tokens", "30")
    done = events[-1][1]
    assert done["text"] == "nobody 霜" + after and done["tokens"] <= len(forced) + 30


def test_a_forced_token_that_the_filters_would_drop_has_q_0(served, runs):
    from scratchlm.checkpoint import load_model

    _, tokenizer, _ = load_model(runs / "mixed")
    events = events_of(served.port, {"run": "mixed", "prompt": "ROMEO:", "max_new_tokens": 3, "top_k": 1,
                                     "forced": tokenizer.encode("霜")})
    first = [d for e, d in events if e == "token"][0]
    top_id = first["top"][0]["id"]
    assert first["forced"] and (first["q"] == 0) == (first["id"] != top_id)


@pytest.mark.parametrize("extra, words", [
    ({"forced": [10**6]}, "forced: token ids are 0.."),
    ({"forced": [-1]}, "forced: token ids are 0.."),
    ({"forced": "abc"}, "forced: expected list"),
    ({"forced": [1.5]}, "forced: expected a list of token ids"),
    ({"forced": [True]}, "forced: expected a list of token ids"),
    ({"forced": [1] * 4001}, "forced: at most 4,000 ids"),
    ({"forced": [1], "beams": 2}, "beams must be 1"),
])
def test_a_bad_continuation_is_one_clear_line(served, extra, words):
    status, answer = request(served.port, "POST", "/api/generate", {"run": "mixed", "prompt": "R", **extra})
    assert status == 400 and words in answer["error"]


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("sampling", [dict(greedy=True), dict(temperature=1.0, seed=3)], ids=["greedy", "sampled"])
def test_forced_steps_then_the_tokens_a_longer_prompt_would_get(use_cache, sampling):
    """Engine.stream_tokens(forced=...) takes the forced ids, then goes on exactly as generating
    from the prompt and those ids would (no random number is drawn while forced: the same seed
    gives the same draws after them), across the context's edge (block_size 8)."""
    from scratchlm.generation.engine import Engine
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT
    from scratchlm.text.tokenizer import train_tokenizer

    tok = train_tokenizer("char", ["abcdefgh "])
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=2, n_head=2, n_embd=16))
    engine = Engine(model, tok, use_cache=use_cache)
    forced = tok.encode("hgfedc")
    steps = engine.stream_tokens("ab", max_new_tokens=len(forced) + 12, forced=forced, **sampling)
    ids = [s.id for s in steps if s.id is not None]
    longer = torch.tensor([tok.encode("ab") + forced])
    plain = Engine(model, tok, use_cache=use_cache).generate_ids(longer, max_new_tokens=12, **sampling)[0, 8:].tolist()
    assert ids[: len(forced)] == forced
    assert len(ids) > len(forced) and ids[len(forced):] == plain[: len(ids) - len(forced)]

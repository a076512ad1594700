"""Generation: the KV cache against the plain loop, every sampling filter against a brute-force
reference, beam search against an exhaustive search, and text in / text out."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchlm.model.config import GPTConfig
from scratchlm.errors import UserError
from scratchlm.generation.generate import IncrementalText, beam_search, generate, generate_ids, iter_tokens, stream
from scratchlm.model.gpt import GPT

from conftest import shared_file

TINY = dict(vocab_size=23, block_size=16, n_layer=2, n_head=2, n_embd=32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py


def _model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


def _lively_model(pos: str) -> GPT:
    """A random model whose greedy output wanders instead of repeating one token at once:
    embeddings of unit scale (not 0.02) make the next token depend on the context."""
    model = _model(seed=1, pos_embedding=pos)
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
        if pos == "learned":
            model.transformer.wpe.weight.normal_(0.0, 1.0)
    return model


@torch.no_grad()
def _plain_loop(model: GPT, idx: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """station 19 written out independently: crop to block_size, full forward, last position, argmax."""
    block = model.config.block_size
    logits_seen = []
    for _ in range(steps):
        logits, _ = model(idx[:, -block:])
        last = logits[:, -1, :]  # (B, V)
        logits_seen.append(last)
        idx = torch.cat([idx, last.argmax(dim=-1, keepdim=True)], dim=1)
    return idx, logits_seen


# --------------------------------------------------------------------------------------------
# KV cache == plain loop
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "none"])
def test_cached_greedy_equals_plain_loop_over_200_tokens_across_the_boundary(pos):
    model = _lively_model(pos)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, TINY["vocab_size"], (2, 5), generator=gen)  # batch of 2 different prompts
    expected, expected_logits = _plain_loop(model, idx, 200)  # crosses block_size=16 at step 12
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
    model = _lively_model(pos)
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
    model = _model(seed=3, pos_embedding="rope")
    idx = torch.randint(0, TINY["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    expected, expected_logits = _plain_loop(model, idx, 20)
    steps = list(iter_tokens(model, idx, max_new_tokens=20, greedy=True))
    assert torch.equal(torch.cat([idx, torch.stack([t for t, _ in steps], 1)], 1), expected)
    for (_, got), want in zip(steps, expected_logits):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_generation_restores_training_mode_and_needs_no_grad():
    model = _model(dropout=0.5)
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
    model = _model(seed=8)
    idx = torch.randint(0, TINY["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(2))
    greedy = _plain_loop(model, idx, 30)[0][0].tolist()
    for use_cache in (True, False):
        [(ids, _)] = beam_search(model, idx, beam_width=1, max_new_tokens=30, use_cache=use_cache)
        assert ids == greedy


@torch.no_grad()
def _score(model: GPT, prompt: list[int], continuation: list[int]) -> float:
    """log p(continuation | prompt) from one plain forward over the whole sequence."""
    ids = torch.tensor([prompt + continuation])
    logp = F.log_softmax(model(ids)[0][0].double(), dim=-1)  # (T, V)
    return sum(float(logp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(continuation))


def test_wide_beam_equals_exhaustive_search_and_reports_the_models_own_scores():
    V, steps, prompt = 3, 4, [0, 2]
    model = _model(seed=9, vocab_size=V, block_size=8, n_embd=16)
    everything = {c: _score(model, prompt, list(c)) for c in itertools.product(range(V), repeat=steps)}
    best = max(everything, key=everything.get)
    width = V**steps  # as wide as the number of possible continuations: nothing is pruned
    results = beam_search(model, torch.tensor(prompt), width, steps, n_best=width)
    ids, logprob = results[0]
    assert ids == prompt + list(best)
    assert logprob == pytest.approx(everything[best], abs=1e-4)
    assert {tuple(r[0][len(prompt) :]) for r in results} == set(everything)
    for seq, lp in results:
        assert lp == pytest.approx(everything[tuple(seq[len(prompt) :])], abs=1e-4)
    # a narrow beam still reports true scores for what it returns
    for seq, lp in beam_search(model, torch.tensor(prompt), 2, steps, n_best=2):
        assert lp == pytest.approx(_score(model, prompt, seq[len(prompt) :]), abs=1e-4)


def test_wide_beam_with_eos_equals_exhaustive_search_with_length_penalty():
    V, steps, prompt, eos = 3, 3, [1], 2
    model = _model(seed=10, vocab_size=V, block_size=8, n_embd=16)
    # every possible output: stop at the first eos, or run all steps
    candidates = set()
    for c in itertools.product(range(V), repeat=steps):
        c = list(c)
        candidates.add(tuple(c[: c.index(eos) + 1]) if eos in c else tuple(c))
    for alpha in (0.0, 1.0, 2.0):
        ranked = sorted(candidates, key=lambda c: _score(model, prompt, list(c)) / len(c) ** alpha, reverse=True)
        [(ids, lp)] = beam_search(model, torch.tensor(prompt), V**steps, steps, length_penalty=alpha, eos_id=eos)
        assert ids == prompt + list(ranked[0])
        assert lp == pytest.approx(_score(model, prompt, list(ranked[0])), abs=1e-4)
        # the whole ranking, finished (eos) beams among the live ones: every candidate, in order
        every = beam_search(model, torch.tensor(prompt), V**steps, steps, length_penalty=alpha, eos_id=eos,
                            n_best=len(candidates))
        assert [tuple(ids[len(prompt) :]) for ids, _ in every] == ranked  # eos-ended ones included


def test_beam_search_cache_is_exact_across_the_boundary():
    model = _model(seed=11, pos_embedding="learned")
    idx = torch.randint(0, TINY["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(4))
    a = beam_search(model, idx, 4, 20, n_best=4, use_cache=True)
    b = beam_search(model, idx, 4, 20, n_best=4, use_cache=False)
    assert [x for x, _ in a] == [x for x, _ in b]
    for (seq, lp_a), (_, lp_b) in zip(a, b):
        assert lp_a == pytest.approx(lp_b, abs=1e-4)


# --------------------------------------------------------------------------------------------
# Text in, text out
# --------------------------------------------------------------------------------------------


class ByteTokenizer:
    """A stand-in tokenizer: one id per UTF-8 byte, then BOS and end-of-text. Decoding a cut
    multi-byte character gives U+FFFD, as byte-level BPE does."""

    kind = "byte"
    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class LettersTokenizer:
    """One id per letter of a small alphabet, then BOS and end-of-text."""

    kind = "char"
    alphabet = "abcdefghij "
    vocab_size = len(alphabet) + 2
    bos_id = len(alphabet)

    def __init__(self, eos_id: int | None = None):
        self.eos_id = len(self.alphabet) + 1 if eos_id is None else eos_id

    def encode(self, text: str) -> list[int]:
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(self.alphabet[i] if i < len(self.alphabet) else "" for i in ids)


def _letters_model(seed=12, **kw) -> GPT:
    return _model(seed=seed, vocab_size=LettersTokenizer.vocab_size, **kw)


def test_generate_returns_the_greedy_continuation_as_text_and_ids():
    tok = LettersTokenizer(eos_id=10**6)  # an eos the model can never emit: runs to the end
    model = _letters_model()
    expected = _plain_loop(model, torch.tensor([tok.encode("abc")]), 40)[0][0, 3:].tolist()
    out = generate(model, tok, "abc", max_new_tokens=40, greedy=True)
    assert out.ids == expected and out.text == tok.decode(expected)
    assert out.finish_reasons == ["length"] and out.prompt_ids == [0, 1, 2] and not out.prompt_cropped


def test_generate_stops_at_end_of_text_and_at_stop_strings():
    model = _letters_model()
    full = _plain_loop(model, torch.tensor([[0, 1, 2]]), 60)[0][0, 3:].tolist()
    # declare a token the model emits mid-way as end-of-text: output must end just before it
    eos = full[len(full) // 2]
    cut = full.index(eos)
    out = generate(model, LettersTokenizer(eos_id=eos), "abc", max_new_tokens=60, greedy=True)
    assert out.ids == full[:cut] and out.finish_reasons == ["eos"]

    tok = LettersTokenizer(eos_id=10**6)
    text = tok.decode(full)
    stop = text[20:23]
    out = generate(model, tok, "abc", max_new_tokens=60, greedy=True, stop=["zzz", stop])
    assert out.text == text[: text.find(stop)] and out.finish_reasons == ["stop"]
    assert tok.decode(out.ids).endswith(stop)  # ids run up to the token that completed it
    assert "".join(stream(model, tok, "abc", max_new_tokens=60, greedy=True, stop=[stop])) == out.text


def test_empty_prompt_starts_from_bos_and_long_prompt_is_cropped_with_a_warning():
    tok = LettersTokenizer(eos_id=10**6)
    model = _letters_model()
    from_bos = _plain_loop(model, torch.tensor([[tok.bos_id]]), 10)[0][0, 1:].tolist()
    assert generate(model, tok, "", max_new_tokens=10, greedy=True).ids == from_bos

    long_prompt = "abcdefghij" * 3  # 30 tokens, block_size 16
    tail = _plain_loop(model, torch.tensor([tok.encode(long_prompt)[-16:]]), 10)[0][0, 16:].tolist()
    with pytest.warns(UserWarning, match="only its last 16 tokens"):
        out = generate(model, tok, long_prompt, max_new_tokens=10, greedy=True)
    assert out.prompt_cropped and out.ids == tail


def test_num_samples_are_independent_draws_reproducible_by_seed():
    tok = LettersTokenizer(eos_id=10**6)
    model = _letters_model()
    out = generate(model, tok, "ab", max_new_tokens=30, num_samples=3, seed=5, temperature=1.5)
    assert len(out.texts) == 3 and len(set(out.texts)) == 3
    assert generate(model, tok, "ab", max_new_tokens=30, num_samples=3, seed=5, temperature=1.5).texts == out.texts
    beams = generate(model, tok, "ab", max_new_tokens=8, beams=4, num_samples=2)
    assert len(beams.texts) == 2 and beams.logprobs[0] >= beams.logprobs[1]


def test_stream_pieces_join_to_the_generated_text():
    tok = ByteTokenizer()
    model = _model(seed=13, vocab_size=258)
    for seed in range(3):
        pieces = list(stream(model, tok, "hé", max_new_tokens=40, seed=seed))
        assert "".join(pieces) == generate(model, tok, "hé", max_new_tokens=40, seed=seed).text


def test_stream_tokens_gives_every_token_its_scores_and_the_texts_join_to_generate():
    """Each TokenStep's id is generate's next id (an end-of-text id included, with no text), its
    logits are the plain forward pass's at that position, and the texts, the final flush
    included, join to generate's text; with a stop string the last step says why it ended."""
    from scratchlm.generation.generate import stream_tokens

    tok = ByteTokenizer()
    model = _model(seed=13, vocab_size=258)
    for seed in range(3):
        steps = list(stream_tokens(model, tok, "hé", max_new_tokens=30, seed=seed, temperature=1.5))
        result = generate(model, tok, "hé", max_new_tokens=30, seed=seed, temperature=1.5)
        assert steps[-1].id is None and steps[-1].logits is None and all(s.id is not None for s in steps[:-1])
        chosen = [s.id for s in steps[:-1]]
        assert chosen[: len(result.ids)] == result.ids
        assert "".join(s.text for s in steps) == result.text
        ids = tok.encode("hé")
        for s in steps[:-1]:
            with torch.no_grad():
                plain = model(torch.tensor([ids[-model.config.block_size:]]))[0][0, -1, :258]
            torch.testing.assert_close(s.logits.float(), plain, rtol=1e-4, atol=1e-4)
            ids.append(s.id)
    stops = list(stream_tokens(model, tok, "hé", max_new_tokens=60, seed=0, stop=["e"]))
    text = "".join(s.text for s in stops)
    assert "e" not in text and stops[-1].reason in ("stop", "length")
    ended = [s.reason for s in stops[:-1] if s.reason is not None]
    assert ended in ([], ["stop"]) and (ended == ["stop"]) == (stops[-1].reason == "stop")


def test_stream_tokens_says_the_prompt_before_the_first_step_and_warns_of_a_crop_once():
    """prompt_ids is the prompt as the tokenizer encodes it and cropped says whether it outgrew
    the context; both known before any step, the crop warned of once (the playground's start
    event reads them rather than encoding the prompt a second time)."""
    import warnings

    from scratchlm.generation.generate import stream_tokens

    tok = ByteTokenizer()
    model = _model(seed=13, vocab_size=258)
    steps = stream_tokens(model, tok, "hé", max_new_tokens=3, seed=0)
    assert steps.prompt_ids == tok.encode("hé") and steps.cropped is False
    steps.close()
    long = "ab" * model.config.block_size
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = stream_tokens(model, tok, long, max_new_tokens=3, seed=0)
        texts = "".join(s.text for s in steps)
    assert steps.prompt_ids == tok.encode(long) and steps.cropped is True
    assert len([w for w in caught if "context" in str(w.message)]) == 1
    assert texts == generate(model, tok, long[-model.config.block_size:], max_new_tokens=3, seed=0).text


def test_incremental_text_never_prints_half_a_character():
    tok = ByteTokenizer()
    text = "héllo wörld 你好 🎉 done"
    ids = tok.encode(text)
    printer = IncrementalText()
    pieces = [printer.piece(tok.decode(ids[:n])) for n in range(1, len(ids) + 1)]
    pieces.append(printer.piece(tok.decode(ids), final=True))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # a tail that could begin a stop string waits until it is clear
    printer = IncrementalText(stops=["wörld!"])
    early = printer.piece("héllo wö")
    assert early == "héllo " and printer.piece("héllo wörm") == "wörm"


@torch.enable_grad()
def test_stream_prints_multibyte_text_whole_from_a_model_that_learned_it():
    """End to end: a tiny model memorises one UTF-8 string byte by byte; streaming its greedy
    output must show every character whole, then stop at end-of-text."""
    tok = ByteTokenizer()
    target = "añ你🎉ok"
    seq = torch.tensor([[tok.bos_id] + tok.encode(target) + [tok.eos_id]])  # (1, 14)
    model = _model(seed=14, vocab_size=258, block_size=16, n_embd=32)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        _, loss = model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = generate(model, tok, "", max_new_tokens=30, greedy=True)
    assert out.text == target and out.finish_reasons == ["eos"]  # the model did learn it
    pieces = list(stream(model, tok, "", max_new_tokens=30, greedy=True))
    assert "".join(pieces) == target
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) >= 4  # printed as it went, not all at the end


@pytest.mark.parametrize("kind", ["bpe", "gpt2"])
def test_real_tokenizers_stream_whole_characters(kind):
    tokenizer_module = pytest.importorskip("scratchlm.text.tokenizer")
    if kind == "bpe":  # trained on ASCII only, so every non-ASCII character is split into bytes
        tok = tokenizer_module.train_tokenizer("bpe", ["the quick brown fox jumps over the lazy dog"] * 20, 300)
    else:
        rank_file = shared_file("gpt2/gpt2.tiktoken")
        tok = tokenizer_module.get_tokenizer("gpt2", tokenizer_file=rank_file)
    text = "naïve café — 東京 🎉"
    ids = tok.encode(text)
    # some character really is split across tokens, so a naive printer would show U+FFFD
    assert any("\ufffd" in tok.decode(ids[:n]) for n in range(1, len(ids)))
    printer = IncrementalText()
    pieces = [printer.piece(tok.decode(ids[:n])) for n in range(1, len(ids) + 1)]
    pieces.append(printer.piece(tok.decode(ids), final=True))
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)


def test_unknown_characters_for_a_char_tokenizer_are_a_clear_error():
    tokenizer_module = pytest.importorskip("scratchlm.text.tokenizer")
    tok = tokenizer_module.CharTokenizer("abc ")
    model = _model(vocab_size=tok.vocab_size)
    with pytest.raises(UserError, match="'x'"):
        generate(model, tok, "abx", max_new_tokens=3)


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


@pytest.fixture
def char_checkpoint(tmp_path):
    checkpoint = pytest.importorskip("scratchlm.training.checkpoint")
    tokenizer_module = pytest.importorskip("scratchlm.text.tokenizer")
    tok = tokenizer_module.CharTokenizer("abcdefgh \n")
    model = _model(seed=23, vocab_size=tok.vocab_size)  # a seed whose greedy text varies
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
    out = checkpoint.save_model_checkpoint(model, tok, tmp_path / "ckpt")
    return out, model, tok


def _cli(argv, capsys):
    from scratchlm.cli.main import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_greedy_prints_prompt_and_the_plain_loops_continuation(char_checkpoint, capsys):
    path, model, tok = char_checkpoint
    ids = _plain_loop(model, torch.tensor([tok.encode("abc")]), 25)[0][0, 3:].tolist()
    if tok.eos_id in ids:
        ids = ids[: ids.index(tok.eos_id)]
    want = "abc" + tok.decode(ids) + "\n"
    base = ["generate", "--checkpoint", str(path), "--prompt", "abc", "--max-new-tokens", "25"]
    for extra in (["--greedy"], ["--greedy", "--no-cache"], ["--top-k", "1", "--seed", "3"], ["--temperature", "0"]):
        code, out, err = _cli(base + extra, capsys)
        assert (code, out, err) == (0, want, "")
    code, out, _ = _cli(["generate", "--checkpoint", str(path), "--prompt", "abc", "--greedy", "--max-new-tokens", "25", "--no-echo"], capsys)
    assert out == want[3:]


def test_cli_refuses_bad_input_with_one_error_line(char_checkpoint, capsys, tmp_path):
    path, _, _ = char_checkpoint
    base = ["generate", "--checkpoint", str(path)]
    for argv, needle in [
        (["--prompt", "a", "--max-new-tokens", "-1"], "--max-new-tokens"),
        (["--prompt", "a", "--max-new-tokens", "1000000"], "--max-new-tokens"),
        (["--prompt", "abxyz"], "'x', 'y', 'z'"),  # characters the char tokenizer does not know, named
        (["--prompt", "a", "--top-p", "0"], "top_p"),
        (["--prompt-file", str(tmp_path / "missing.txt")], "missing.txt"),
    ]:
        code, out, err = _cli(base + argv, capsys)
        assert code == 2 and out == "" and err.startswith("error: ") and needle in err and err.count("\n") == 1
    code, _, err = _cli(["generate", "--checkpoint", str(tmp_path / "nowhere"), "--prompt", "a"], capsys)
    assert code == 2 and "nowhere" in err


def test_cli_samples_beams_stop_and_long_prompt(char_checkpoint, capsys, tmp_path):
    path, model, tok = char_checkpoint
    base = ["generate", "--checkpoint", str(path), "--max-new-tokens", "20"]
    code, out, _ = _cli(base + ["--prompt", "ab", "--num-samples", "3", "--seed", "1"], capsys)
    assert code == 0 and out.count("--- sample ") == 3
    code, again, _ = _cli(base + ["--prompt", "ab", "--num-samples", "3", "--seed", "1"], capsys)
    assert again == out
    code, out, _ = _cli(base + ["--prompt", "ab", "--beams", "3", "--num-samples", "2"], capsys)
    assert code == 0 and out.count("logprob") == 2

    full = _plain_loop(model, torch.tensor([tok.encode("ab")]), 20)[0][0, 2:].tolist()
    text = tok.decode(full[: full.index(tok.eos_id)] if tok.eos_id in full else full)
    assert len(text) >= 8  # the fixture's model runs on long enough for a stop string inside
    stop = text[5:7].replace("\n", "\\n")  # typed on a command line, a newline is \n
    code, out, _ = _cli(base + ["--prompt", "ab", "--greedy", "--stop", stop], capsys)
    assert out == "ab" + text[: text.find(text[5:7])] + "\n"

    prompt_file = tmp_path / "long.txt"
    prompt_file.write_text("abcdefgh" * 4, encoding="utf-8")  # 32 tokens, block_size 16
    code, out, err = _cli(base + ["--prompt-file", str(prompt_file), "--greedy"], capsys)
    assert code == 0 and err.startswith("warning: ") and "16" in err and out.startswith("abcdefgh" * 4)


@pytest.mark.slow
def test_cli_reads_the_prompt_from_stdin(char_checkpoint):
    import subprocess
    import sys

    path, model, tok = char_checkpoint
    ids = _plain_loop(model, torch.tensor([tok.encode("hag\n")]), 10)[0][0, 4:].tolist()
    if tok.eos_id in ids:
        ids = ids[: ids.index(tok.eos_id)]
    run = subprocess.run(
        [sys.executable, "-m", "scratchlm", "generate", "--checkpoint", str(path), "--greedy", "--max-new-tokens", "10"],
        input="hag\n", capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "hag\n" + tok.decode(ids) + "\n"


def test_a_model_wider_than_its_tokenizer_only_chooses_ids_the_tokenizer_has():
    """A padded vocabulary (here 13 ids with text plus 11 without, favoured by the head's bias):
    every generation path chooses among the tokenizer's ids, with the tokens the model's own
    scores cut to those ids give, and never fails on an id it cannot decode."""

    class Strict(LettersTokenizer):
        def decode(self, ids) -> str:
            return "".join(self.alphabet[i] if i < len(self.alphabet) else "" if i < self.vocab_size else 1 / 0
                           for i in ids)

    tok = Strict(eos_id=-1)  # no end token: every sample runs its full length
    model = _model(seed=21, vocab_size=24)
    with torch.no_grad():
        model.lm_head.bias[tok.vocab_size :] = 5.0  # the ids past the tokenizer would win every step
    prompt = tok.encode("abc")
    block = model.config.block_size
    with torch.no_grad():  # by hand: the plain loop over the cut scores
        ids = list(prompt)
        for _ in range(10):
            logits, _ = model(torch.tensor([ids[-block:]]))
            ids.append(int(logits[0, -1, : tok.vocab_size].argmax()))
    want = ids[len(prompt) :]
    for use_cache in (True, False):
        assert generate(model, tok, "abc", max_new_tokens=10, greedy=True, use_cache=use_cache).ids == want
    sampled = generate(model, tok, "abc", max_new_tokens=30, temperature=2.0, num_samples=4, seed=0)
    assert all(max(row) < tok.vocab_size for row in sampled.all_ids)
    beams = generate(model, tok, "abc", max_new_tokens=6, beams=3, num_samples=3)
    assert all(max(row) < tok.vocab_size for row in beams.all_ids)
    assert "".join(stream(model, tok, "abc", max_new_tokens=10, greedy=True)) == tok.decode(want)


# --------------------------------------------------------------------------------------------
# Closing what mutation testing walked through (python scripts/mutate.py generate)
# --------------------------------------------------------------------------------------------


def test_bad_prompts_and_beam_settings_are_refused():
    model = _model()
    for bad in (torch.zeros(3, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long)):
        with pytest.raises(ValueError, match="idx"):
            next(iter_tokens(model, bad, max_new_tokens=2))
    for width, n_best in ((0, 1), (2, 0)):
        with pytest.raises(UserError, match="beam"):
            beam_search(model, torch.tensor([1]), width, 3, n_best=n_best)
    tok = LettersTokenizer()
    model = _letters_model()
    for options, name in ((dict(num_samples=0), "num_samples"), (dict(beams=0), "beams"), (dict(beams=True), "beams"),
                          (dict(num_samples=2.5), "num_samples")):
        with pytest.raises(UserError, match=name):
            generate(model, tok, "abc", max_new_tokens=2, **options)
    with pytest.raises(UserError, match="max_new_tokens"):
        stream(model, tok, "abc", max_new_tokens=-1)  # at the call, before the first piece is asked for


def test_generate_ids_stops_rows_at_eos_and_pads_them_with_it():
    """By hand: the plain greedy loop, with each row frozen at eos once it has produced it."""
    model = _model(seed=4)
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
    model = _letters_model(seed=13)
    out = generate(model, tok, "abc", max_new_tokens=5, beams=2, num_samples=2)
    best = beam_search(model, torch.tensor(tok.encode("abc")), 2, 5, n_best=2, eos_id=tok.eos_id, vocab=tok.vocab_size)
    want = [[i for i in ids[3:] if i != tok.eos_id] for ids, _ in best]  # text rows end before eos
    assert out.all_ids == want and out.logprobs == pytest.approx([lp for _, lp in best])


def test_a_stop_string_at_the_very_start_stops_at_once():
    tok = LettersTokenizer()
    model = _letters_model(seed=12)
    first = generate(model, tok, "abc", max_new_tokens=1, greedy=True).text
    out = generate(model, tok, "abc", max_new_tokens=10, greedy=True, stop=[first])
    assert out.text == "" and out.finish_reasons == ["stop"]


def test_a_prompt_exactly_as_long_as_the_context_is_not_cropped():
    import warnings

    tok = LettersTokenizer()
    model = _letters_model(seed=12)
    prompt = "abcdefghij abcde"[: model.config.block_size]
    assert len(tok.encode(prompt)) == model.config.block_size
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no crop warning
        out = generate(model, tok, prompt, max_new_tokens=2, greedy=True)
    assert not out.prompt_cropped
    with pytest.warns(UserWarning, match="last 16 tokens"):
        assert generate(model, tok, prompt + "a", max_new_tokens=2, greedy=True).prompt_cropped


# ------------------------------------------------------------------------------ mutation survivors (issue 21)


def test_generate_ids_seed_fixes_a_sampled_draw():
    """seed builds the draw's generator: the same seed twice gives the same ids, whatever the
    global RNG did in between, and another seed other ids."""
    model, idx = _model(seed=3), torch.tensor([[1, 2, 3]])
    first = generate_ids(model, idx, max_new_tokens=20, seed=11, temperature=1.5)
    torch.manual_seed(999)
    torch.rand(7)  # move the global stream: a draw that used it would now differ
    assert torch.equal(generate_ids(model, idx, max_new_tokens=20, seed=11, temperature=1.5), first)
    assert not torch.equal(generate_ids(model, idx, max_new_tokens=20, seed=12, temperature=1.5), first)


def test_beam_search_checks_max_new_tokens():
    from scratchlm.errors import ConfigError

    with pytest.raises(ConfigError, match="max_new_tokens"):
        beam_search(_model(), torch.tensor([1, 2]), 2, -1)


def test_when_every_beam_ends_at_eos_only_finished_beams_are_returned():
    """With one allowed id (vocab=1), the end-of-text token, every candidate finishes at the first
    step and no live beam is left: the result is that one finished beam (log p = 0), never the
    bare prompt as well."""
    best = beam_search(_model(seed=5), torch.tensor([1, 2, 3]), 2, 5, n_best=2, eos_id=0, vocab=1)
    assert best == [([1, 2, 3, 0], 0.0)]
    # and with the whole vocabulary, every beam returned still ends where it finished
    model = _model(seed=5)
    with torch.no_grad():
        model.lm_head.bias.zero_()
        model.lm_head.bias[7] = 50.0  # p(eos) ~ 1 at every position
    assert all(ids[-1] == 7 for ids, _ in beam_search(model, torch.tensor([1, 2, 3]), 3, 5, n_best=3, eos_id=7))


def test_the_crop_warning_points_at_the_callers_line():
    model, tok = _model(seed=2, vocab_size=258), ByteTokenizer()
    with pytest.warns(UserWarning, match="only its last 16 tokens are used") as caught:
        generate(model, tok, "x" * 40, max_new_tokens=1)
    assert caught[0].filename == __file__  # stacklevel: the warning names this file, not generate.py


@pytest.mark.parametrize("flags, words", [
    ([], None),
    (["--temperature", "0.7", "--top-k", "5", "--seed", "1"], None),  # sampling: all of them count
    (["--greedy", "--top-k", "5", "--seed", "1"], ["--top-k, --seed have no effect with greedy"]),
    (["--temperature", "0", "--min-p", "0.1"], ["--min-p has no effect with greedy"]),
    (["--greedy", "--temperature", "0.5"], ["--temperature has no effect with greedy"]),
    (["--greedy", "--repetition-penalty", "1.3"], None),  # the penalty does move greedy's argmax
    (["--beams", "3", "--top-p", "0.9", "--repetition-penalty", "1.2"],
     ["--top-p, --repetition-penalty have no effect with --beams"]),
    (["--beams", "3", "--length-penalty", "0.5"], None),
    (["--length-penalty", "0.5"], ["--length-penalty applies to beam search only"]),
    (["--stop", "", "--stop", "x"], ["an empty --stop matches nothing"]),
])
def test_generate_warns_of_flags_that_change_nothing(flags, words):
    """One warning line naming each flag the chosen decoding cannot use (not an error: the text
    is still what was asked for), and none where every flag counts."""
    from scratchlm.cli.main import build_parser, ignored_generate_flags

    args = build_parser().parse_args(["generate", "--checkpoint", "run", *flags])
    warning = ignored_generate_flags(args)
    if words is None:
        assert warning is None
    else:
        assert warning is not None and all(w in warning for w in words), warning


# ---------------------------------------------------------------- special tokens in generated text


def _bos_choosing_model(tok) -> GPT:
    """A random model whose greedy continuation of "ab" holds <|bos|> between characters (seed
    23, found by trying seeds; the test checks that it still does)."""
    torch.manual_seed(23)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16,
                          pos_embedding="learned", lm_head_bias=False)).eval()
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
        model.transformer.wpe.weight.normal_(0.0, 1.0)
    return model


def test_generated_text_leaves_special_tokens_out_as_the_exported_model_does(tmp_path, capsys):
    """A <|bos|> the model chooses stays in the ids but not in the text: generate, stream and the
    CLI print what transformers prints for the exported model, decode(skip_special_tokens=True)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scratchlm.training.checkpoint import save_model_checkpoint
    from scratchlm.hf.interop import export_hf
    from scratchlm.text.tokenizer import BOS, CharTokenizer

    tok = CharTokenizer("abcd ")
    model = _bos_choosing_model(tok)
    out = generate(model, tok, "ab", max_new_tokens=20, greedy=True)
    assert out.ids.count(tok.bos_id) >= 2 and out.finish_reasons == ["length"]  # the case in question
    export_hf(model, tmp_path / "hf", tok)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    prompt = hf_tok("ab", add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        new = hf.generate(prompt, max_new_tokens=20, do_sample=False)[0, prompt.shape[1]:].tolist()
    assert new == out.ids
    assert out.text == hf_tok.decode(new, skip_special_tokens=True) and BOS not in out.text
    assert "".join(stream(model, tok, "ab", max_new_tokens=20, greedy=True)) == out.text
    save_model_checkpoint(model, tok, tmp_path / "ckpt")
    capsys.readouterr()  # transformers' own progress lines
    code, printed, err = _cli(["generate", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "ab", "--greedy",
                               "--max-new-tokens", "20"], capsys)
    assert (code, printed, err) == (0, "ab" + hf_tok.decode(new, skip_special_tokens=True) + "\n", "")


def test_bpe_text_rows_leave_special_tokens_out_as_transformers_decode_does(tmp_path):
    from transformers import AutoTokenizer

    from scratchlm.hf.interop import export_hf
    from scratchlm.generation.text_rows import TextRow
    from scratchlm.text.tokenizer import train_tokenizer

    tok = train_tokenizer("bpe", ["héllo wörld, 猫 and more words " * 20], vocab_size=300)
    export_hf(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16)),
              tmp_path / "hf", tok)
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    cat = tok.encode("猫")
    ids = [tok.bos_id, *tok.encode("héllo"), tok.bos_id, *cat[:1], tok.bos_id, *cat[1:], *tok.encode(" wörld")]
    row = TextRow(tok, tok.eos_id, [])
    for i in ids:
        row.push(i)
    assert row.text == hf_tok.decode(ids, skip_special_tokens=True) == "héllo猫 wörld"

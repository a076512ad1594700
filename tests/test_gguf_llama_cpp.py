"""`scratchlm export-gguf` checked against llama.cpp itself (llama-cpp-python, built from source by
.ci/run): trained runs of each layout llama.cpp knows continue a prompt greedily exactly as
`scratchlm generate --greedy` does, token for token inside the context, from f32 and f16 files;
a q8_0 file predicts the same next token on at least 95% of held-out text; f32 logits equal the
model's own; and llama.cpp's tokenizer, read from the file, encodes and decodes as scratchlm's does.
"""

from __future__ import annotations

import os
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchlm.gguf.export import export_gguf
from scratchlm.training.checkpoint import load_model

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (.ci/run builds it from source)")

GPT2_RANKS = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpt2" / "gpt2.tiktoken"
QUIET = ["--eval_interval", "0", "--sample_tokens", "0", "--progress", "quiet", "--threads", "1"]
# name: the training flags (the README's default run first), and the layout llama.cpp must read
RUNS = {
    "default": (["--preset", "shakespeare-char", "--max_steps", "300"], "gptneox"),
    "llama": (["--preset", "shakespeare-char-fast", "--max_steps", "150", "--norm", "rmsnorm", "--activation", "swiglu",
               "--no-mlp_bias", "--no-proj_bias", "--no-lm_head_bias"], "llama"),
    "gpt2-bpe": (["--preset", "smoke", "--tokenizer", "bpe", "--vocab_size", "400", "--block_size", "64",
                  "--activation", "gelu_tanh", "--max_steps", "150", "--batch_size", "8", "--lr", "3e-3"], "gpt2"),
    # GPT-2's 50,257 tokens make each step slow and Shakespeare hard to learn in a few: two lines
    # of verse, repeated, give a continuation that says something in 60 steps
    "gpt2-tokenizer": (["--preset", "smoke", "--tokenizer", "gpt2", "--tokenizer_file", str(GPT2_RANKS), "--data",
                        "{verse}", "--block_size", "64", "--activation", "gelu_tanh", "--tie_weights", "--max_steps",
                        "60", "--batch_size", "4", "--lr", "3e-3"], "gpt2"),
}
VERSE = "Where is the king? He speaks to a queen of night and day.\nROMEO: my lord, thou art the sun, and Juliet the moon.\n"
VERSE_HELD_OUT = "ROMEO: the queen speaks to the moon, and the king of day is the sun.\nWhere is my lord? He speaks to Juliet."
TIE = {"f32": 5e-3, "f16": 1e-2}  # see the greedy test
PROMPTS = {"char": ["ROMEO:\n", "KING HENRY: What say"], "bpe": ["ROMEO:\n", "Where is the king"]}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {**os.environ, "SCRATCHLM_CACHE": str(tmp_path_factory.mktemp("cache")), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, env):
    """name -> run folder, each trained once per module, on first use."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name == "gpt2-tokenizer" and not GPT2_RANKS.is_file():
            pytest.skip(f"shared data missing: {GPT2_RANKS} (GPT-2's rank file, for a run with its tokenizer)")
        if name not in made:
            out = tmp_path_factory.mktemp(name) / "run"
            verse = out.parent / "verse.txt"
            verse.write_text(VERSE * 600, encoding="utf-8")
            cli(env, "train", *(flag.format(verse=verse) for flag in RUNS[name][0]), *QUIET, "--out_dir", out)
            made[name] = out
        return made[name]

    return get


def cli(env, *args) -> str:
    result = subprocess.run([sys.executable, "-m", "scratchlm", *map(str, args)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def llama(path: Path, context: int, **kwargs):
    return llama_cpp.Llama(str(path), n_ctx=context, n_threads=1, verbose=False, **kwargs)


def held_out(name: str, tok, length: int) -> list[int]:
    """`length` ids of text the run did not train on: the built-in corpus's last characters (its
    validation tail), or the verse's words in new lines."""
    from scratchlm.text.corpus import shakespeare_documents

    if name == "gpt2-tokenizer":
        return tok.encode(VERSE_HELD_OUT * 4)[:length]
    *_, (_, last) = shakespeare_documents()
    return tok.encode(last[-4 * length:])[-length:]


def llama_greedy(llm, ids: list[int], n: int) -> list[int]:
    """llama.cpp's own greedy sampler (temperature 0, no penalty) continuing `ids` by `n` tokens."""
    out: list[int] = []
    for token in llm.generate(ids, temp=0.0, repeat_penalty=1.0):
        out.append(token)
        if len(out) == n:
            return out
    return out


def near_ties(model, ids: list[int], new: list[int], vocab: int) -> list[float]:
    """For each new token, the model's own gap between its best and second-best logit there."""
    with torch.no_grad():
        out = model(torch.tensor([ids + new]))
        logits = (out[0] if isinstance(out, tuple) else out)[0, len(ids) - 1 : -1, :vocab].double()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_greedy_text_of_each_layout_equals_scratchlm_generate_in_f32_and_f16(name, trained, env, tmp_path):
    """Token for token, up to a near tie: llama.cpp keeps its K/V cache in f16 and reads GELU from
    an f16 table (and the default run's exact GELU becomes the tanh form), which moved logits by
    up to 2.3e-3 from an f32 file and 4.6e-3 from an f16 one on these runs; where the model's two
    best tokens are closer than TIE[dtype] (about twice that), llama.cpp may take the second, and
    the texts part there. Every prompt must run at least half its room before such a tie."""
    from scratchlm.generation.generate import generate

    run = trained(name)
    model, tok, _ = load_model(run)
    context = model.config.block_size
    wanted = []  # (prompt ids, scratchlm's new ids, the text `scratchlm generate --greedy` prints, gaps)
    for prompt in PROMPTS["char" if tok.kind == "char" else "bpe"]:
        ids = tok.encode(prompt)
        ours = generate(model, tok, prompt, greedy=True, max_new_tokens=context - len(ids))
        text = cli(env, "generate", "--checkpoint", run, "--prompt", prompt, "--greedy", "--max-new-tokens",
                   context - len(ids))
        assert text == prompt + ours.text + "\n"
        assert len(set(ours.ids)) >= 4, f"{name}: a degenerate continuation tests little: {text!r}"
        wanted.append((ids, ours.ids, text[:-1], near_ties(model, ids, ours.ids, tok.vocab_size)))
    for dtype in ("f32", "f16"):
        out = tmp_path / f"{dtype}.gguf"
        said = cli(env, "export-gguf", run, out, "--dtype", dtype)
        assert f"llama.cpp {RUNS[name][1]}, {dtype}" in said
        llm = llama(out, context)
        for ids, ours, text, gaps in wanted:
            theirs = llama_greedy(llm, ids, context - len(ids))
            if tok.eos_id in theirs:  # scratchlm stops at <|endoftext|>; llama.cpp's generate goes on
                theirs = theirs[: theirs.index(tok.eos_id)]
            tie = next((i for i, gap in enumerate(gaps) if gap < TIE[dtype]), len(ours))
            assert tie >= len(ours) // 2, f"{name} {dtype} {text!r}: a near tie at new token {tie}"
            assert theirs[:tie] == ours[:tie], f"{name} {dtype} {text!r}: first difference at new token " \
                f"{next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b)} (near tie: {tie})"
            if tie == len(ours):
                assert theirs == ours
                assert tok.decode(ids) + llm.detokenize(theirs).decode("utf-8") == text


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_f32_logits_equal_the_models_and_q8_0_predicts_the_same_next_token(name, trained, tmp_path):
    """Held-out text through llama.cpp (every position's logits, float32 K/V cache) beside the
    model's own forward pass: f32 within the rounding of llama.cpp's GELU table, 5e-3 (the Llama
    layout has no GELU: 2e-4), and bf16 and q8_0 choosing the same next token at >= 95% of positions."""
    model, tok, _ = load_model(trained(name))
    context = model.config.block_size
    ids = held_out(name, tok, context)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
        want = (logits[0] if isinstance(logits, tuple) else logits)[0, :, : tok.vocab_size].double().numpy()
    assert (want.max(1) - np.median(want, 1)).mean() > 3  # trained: peaked, far from a fresh model's flat logits
    for dtype in ("f32", "bf16", "q8_0"):
        export_gguf(model, tok, tmp_path / f"{dtype}.gguf", dtype)
        llm = llama(tmp_path / f"{dtype}.gguf", context, logits_all=True, type_k=0, type_v=0)  # 0: GGML_TYPE_F32
        llm.eval(ids)
        got = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
        if dtype == "f32":
            assert np.abs(got - want).max() <= (2e-4 if RUNS[name][1] == "llama" else 5e-3)
        else:
            agree = (got.argmax(1) == want.argmax(1)).mean()
            assert agree >= 0.95, f"{dtype} agrees on {agree:.1%} of next tokens"


# --------------------------------------------------------------------------------------------
# The tokenizer inside the file: llama.cpp's encoding and decoding beside scratchlm's
# --------------------------------------------------------------------------------------------


ALPHABET = string.printable + "床前明月光，疑是地上霜。举头望低思故乡"
TEXTS = {
    "ascii": "Where is the king?  He speaks:\n'tis night... and\tday, 42 -- don't!\n\n  ",
    "chinese": "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。",
    "special": "a <|endoftext|> b <|bos|>",
}
UNSEEN = {"apart": "café, Zürich; 李 x 白", "runs": "naïve ßüé 😀😀 end"}  # characters no char vocabulary here holds


def tiny_gguf(tokenizer, path: Path) -> Path:
    """A small random model around `tokenizer`, as GGUF (tokenization needs no training)."""
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=32,
                       pos_embedding="rope", activation="gelu_tanh", lm_head_bias=False)
    export_gguf(GPT(config).eval(), tokenizer, path)
    return path


def char_ids_llama_cpp_expects(tok, text: str) -> list[int]:
    """By hand: each known character its id; each run of unseen ones a single unknown id (the
    tokenizer's <unk>, else <|endoftext|>), as llama.cpp's unigram tokenizer merges them."""
    unk = tok.unk_id if tok.unk_id is not None else tok.eos_id
    ids = tok.piece_ids()
    out: list[int] = []
    for i, ch in enumerate(text):
        if ch in ids:
            out.append(ids[ch])
        elif i == 0 or text[i - 1] in ids:  # the first of a run
            out.append(unk)
    return out


def tokenizers_under_test(name: str):
    from scratchlm.text.tokenizer import BPETokenizer, CharTokenizer, GPT2Tokenizer

    corpus = [ALPHABET, *TEXTS.values()] * 20
    if name == "char":
        return CharTokenizer.train(corpus)
    if name == "char-unk":
        return CharTokenizer.train(corpus, unk=True)
    if name == "bpe":
        return BPETokenizer.train(corpus + list(UNSEEN.values()), vocab_size=400)
    if not GPT2_RANKS.is_file():
        pytest.skip(f"shared data missing: {GPT2_RANKS} (GPT-2's rank file)")
    return GPT2Tokenizer.from_rank_file(GPT2_RANKS)


@pytest.mark.parametrize("name", ["char", "char-unk", "bpe", "gpt2"])
def test_llama_cpp_tokenizes_and_detokenizes_as_scratchlm(name, tmp_path):
    tok = tokenizers_under_test(name)
    llm = llama(tiny_gguf(tok, tmp_path / "tok.gguf"), 64, vocab_only=True)
    for label, text in {**TEXTS, **UNSEEN}.items():
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        if tok.kind == "char" and label in UNSEEN:
            assert theirs == char_ids_llama_cpp_expects(tok, text), label
            if tok.unk_id is not None and label == "apart":  # one unseen character at a time: the same ids
                assert theirs == tok.encode(text)
            continue
        assert theirs == tok.encode(text), label
        assert llm.detokenize(theirs).decode("utf-8") == text, label

"""scratchlm.training.scoring and `scratchlm eval`: the loss of a text under a checkpoint, every token
predicted once, against a token-by-token loop written here and against transformers on the
exported model (the same ids, windows and targets)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.text.tokenizer import CharTokenizer
from scratchlm.training.scoring import score_ids, score_text, windows

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "the king speaks to the queen of the night, and the queen answers the king.\n" * 3


def _model(vocab: int, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    config = dict(vocab_size=vocab, block_size=16, n_layer=2, n_head=2, n_embd=32, pos_embedding="learned",
                  lm_head_bias=False, dropout=0.0)
    model = GPT(GPTConfig(**{**config, **overrides})).eval()
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)  # so the context matters
    return model


@pytest.mark.parametrize("n_ids, block, stride", [(2, 16, 16), (17, 16, 16), (18, 16, 16), (100, 16, 16),
                                                  (100, 16, 5), (100, 16, 1), (40, 8, 8), (9, 8, 3)])
def test_windows_score_every_target_once_with_the_promised_context(n_ids, block, stride):
    seen = []
    for start, length, first in windows(n_ids, block, stride):
        assert 1 <= length <= block and 0 <= first < length and start + length <= n_ids - 1
        for j in range(first, length):
            target = start + 1 + j
            seen.append(target)
            context = j + 1  # ids start .. target - 1
            assert context >= min(target, block - stride + 1) or start == 0, (target, context)
    assert seen == list(range(1, n_ids))


def test_score_equals_a_token_by_token_loop():
    """Each target's log-probability from a forward over exactly the context its window gives it
    (the window's start up to the target), one target at a time."""
    tok = CharTokenizer(sorted(set(TEXT)))
    model = _model(tok.vocab_size + 2)
    ids = [tok.bos_id] + tok.encode(TEXT)
    for stride in (16, 6):
        nll, count, _ = score_ids(model, ids, stride=stride, batch_size=3)
        want = 0.0
        with torch.no_grad():
            for start, length, first in windows(len(ids), 16, stride):
                for j in range(first, length):
                    logits, _ = model(torch.tensor([ids[start : start + j + 1]]))
                    want -= float(F.log_softmax(logits[0, -1].double(), -1)[ids[start + j + 1]])
        assert count == len(ids) - 1
        assert math.isclose(nll, want, rel_tol=1e-6), (stride, nll, want)
    short = score_ids(model, ids, stride=6)[0] / (len(ids) - 1)
    assert short < score_ids(model, ids, stride=16)[0] / (len(ids) - 1) + 1.0  # sane, not a proof


def test_score_text_starts_from_bos_and_counts_bytes():
    tok = CharTokenizer(sorted(set(TEXT + "é")))
    model = _model(tok.vocab_size)
    text = "é" + TEXT
    score = score_text(model, tok, text)
    nll, count, n = score_ids(model, [tok.bos_id] + tok.encode(text))
    assert score.tokens == count == len(text) and score.windows == n
    assert score.bytes == len(text.encode("utf-8")) == len(text) + 1
    assert math.isclose(score.loss, nll / count) and math.isclose(score.perplexity, math.exp(nll / count))
    assert math.isclose(score.bits_per_byte, nll / math.log(2) / score.bytes)
    with pytest.raises(UserError, match="stride"):
        score_text(model, tok, text, stride=17)
    with pytest.raises(UserError, match="empty"):
        score_text(model, tok, "")


@pytest.mark.parametrize("layout", [
    {},  # GPT-2
    {"pos_embedding": "rope", "activation": "gelu"},  # GPT-NeoX
    {"pos_embedding": "rope", "norm": "rmsnorm", "activation": "swiglu", "mlp_bias": False, "proj_bias": False},  # Llama
])
def test_eval_equals_transformers_on_the_exported_model(tmp_path, capsys, layout):
    """`scratchlm eval --json` against the model transformers loads offline from `export-hf`'s
    folder (GPT-2, GPT-NeoX or Llama), fed the same ids window by window, scoring the same targets."""
    transformers = pytest.importorskip("transformers")
    from scratchlm.checkpoint import save_model_checkpoint
    from scratchlm.cli.main import main
    from scratchlm.hf.interop import export_hf

    tok = CharTokenizer(sorted(set(TEXT)))
    model = _model(tok.vocab_size, seed=3, **layout)
    ckpt = save_model_checkpoint(model, tok, tmp_path / "ckpt")
    export_hf(model, tmp_path / "hf")  # weights only: the ids are fed to transformers directly
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    ids = [tok.bos_id] + tok.encode(TEXT)
    for stride in (16, 4):
        assert main(["eval", "--checkpoint", str(ckpt), "--data", str(tmp_path / "t.txt"), "--stride", str(stride),
                     "--device", "cpu", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        total = 0.0
        with torch.no_grad():
            for start, length, first in windows(len(ids), 16, stride):
                x = torch.tensor([ids[start : start + length]])
                logits = hf(input_ids=x).logits[0].double()
                y = torch.tensor(ids[start + 1 : start + length + 1])
                total += float(F.cross_entropy(logits[first:], y[first:], reduction="sum"))
        assert abs(got["loss"] - total / (len(ids) - 1)) < 1e-4, stride
        assert got["tokens"] == len(ids) - 1 and got["stride"] == stride


def test_eval_refuses_bad_input_with_one_line(tmp_path, capsys):
    from scratchlm.checkpoint import save_model_checkpoint
    from scratchlm.cli.main import main

    tok = CharTokenizer("abc ")
    ckpt = save_model_checkpoint(_model(tok.vocab_size), tok, tmp_path / "ckpt")
    (tmp_path / "bad.txt").write_bytes(b"ab\xffc")
    (tmp_path / "new.txt").write_text("abz", encoding="utf-8")
    (tmp_path / "ok.txt").write_text("abc ab", encoding="utf-8")
    for argv, words in [(["--data", str(tmp_path / "none.txt")], "no such file"),
                        (["--data", str(tmp_path / "bad.txt")], "not UTF-8"),
                        (["--data", str(tmp_path / "new.txt")], "'z'"),
                        (["--data", str(tmp_path / "ok.txt"), "--stride", "0"], "--stride"),
                        (["--data", "/dev/null"], "not a regular file")]:
        assert main(["eval", "--checkpoint", str(ckpt), "--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (argv, err)

"""`scratchlm chat` and its session (scratchlm.generation.chat): each reply is the greedy
continuation of the template's prompt for the whole history, computed here independently with the
model's own forward pass; the history grows, /reset empties it, a long one loses its oldest
exchanges, Ctrl-C ends a reply but not the conversation, and a run that was never fine-tuned on
conversations is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from scratchlm.checkpoint import save_model_checkpoint
from scratchlm.data.conversations import Message
from scratchlm.errors import UserError
from scratchlm.generation.chat import ChatSession
from scratchlm.generation.settings import GenerationSettings
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.text.chat import CHAT_TOKENS, END_TOKEN, ChatTemplate
from scratchlm.text.tokenizer import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "床前看月光，疑是地上霜。举头望山月，低头思故乡。\n写一首五言绝句，题为《秋夜》。续写："


def _model_and_tokenizer(block_size: int = 64, plain: bool = False):
    tok = CharTokenizer.train([TEXT])
    tok = tok if plain else tok.with_tokens(CHAT_TOKENS)
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=block_size, n_layer=1, n_head=2, n_embd=32,
                          dropout=0.0, pos_embedding="rope", lm_head_bias=False)).eval()
    return model, tok


def _greedy_reply(model, tok, messages: list[Message], most: int) -> str:
    """By hand: the template's prompt, then argmax of the model's last logits, token after token,
    until <|end|> or `most` tokens or a full context."""
    template = ChatTemplate(encode=tok.encode, special=tok.specials, bos_id=tok.bos_id)
    ids = template.prompt(messages)
    out = []
    with torch.no_grad():
        while len(out) < most and len(ids) < model.config.block_size:
            logits, _ = model(torch.tensor([ids]))
            nxt = int(logits[0, -1, : tok.vocab_size].argmax())
            if nxt == tok.specials[END_TOKEN]:
                break
            out.append(nxt)
            ids.append(nxt)
    return tok.decode([i for i in out if i not in tok.special_ids])  # as generate shows text: special tokens print nothing


def test_each_reply_continues_the_whole_history_and_reset_forgets_it():
    model, tok = _model_and_tokenizer()
    session = ChatSession.of(model, tok, GenerationSettings.of(greedy=True, max_new_tokens=8))
    first = "".join(session.reply("续写："))
    assert first == _greedy_reply(model, tok, [Message("user", "续写：")], 8)
    second = "".join(session.reply("秋夜"))
    want = _greedy_reply(model, tok, [Message("user", "续写："), Message("assistant", first), Message("user", "秋夜")], 8)
    assert second == want
    assert [m.role for m in session.history] == ["user", "assistant", "user", "assistant"]
    session.reset()
    assert "".join(session.reply("续写：")) == first and len(session.history) == 2


def test_a_history_too_long_for_the_context_drops_its_oldest_exchanges_and_keeps_the_system_message():
    model, tok = _model_and_tokenizer(block_size=48)
    session = ChatSession.of(model, tok, GenerationSettings.of(greedy=True, max_new_tokens=4), system="秋夜")
    for _ in range(4):
        "".join(session.reply("床前看月光，疑是地上霜。"))
    assert session.dropped >= 1
    before = list(session.history)
    got = "".join(session.reply("举头"))
    kept = before[2 * session.dropped:]  # the exchanges this reply's prompt still held
    assert got == _greedy_reply(model, tok, [Message("system", "秋夜"), *kept, Message("user", "举头")], 4)
    assert session.dropped >= 1
    with pytest.raises(UserError, match="context holds 48"):
        "".join(session.reply("床" * 60))


def test_ctrl_c_ends_a_reply_and_keeps_what_was_said(capsys, monkeypatch):
    from scratchlm.cli import chat as cli_chat

    model, tok = _model_and_tokenizer()
    session = ChatSession.of(model, tok, GenerationSettings.of(greedy=True, max_new_tokens=8))
    real = cli_chat.sys.stdout.write
    written = []

    def write(piece):  # the second piece printed: Ctrl-C arrives
        written.append(piece)
        if len(written) == 2:
            raise KeyboardInterrupt
        return real(piece)

    monkeypatch.setattr(cli_chat.sys.stdout, "write", write)
    cli_chat._say(session, "续写：")
    monkeypatch.undo()
    assert "(stopped)" in capsys.readouterr().err
    assert session.history[-1] == Message("assistant", "".join(written[:2]))  # both pieces were taken from the stream


def test_a_run_without_chat_tokens_is_refused():
    model, tok = _model_and_tokenizer(plain=True)
    with pytest.raises(UserError, match="not fine-tuned on conversations"):
        ChatSession.of(model, tok, GenerationSettings.of(greedy=True))


def _cli(*args, stdin: str = ""):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "scratchlm", "chat", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=240)


def test_the_command_answers_one_message_and_holds_a_conversation_from_stdin(tmp_path):
    model, tok = _model_and_tokenizer()
    run = save_model_checkpoint(model, tok, tmp_path / "chat")
    one = _cli("--checkpoint", str(run), "--message", "续写：", "--greedy", "--max-new-tokens", "8")
    assert one.returncode == 0, one.stderr
    assert one.stdout == _greedy_reply(model, tok, [Message("user", "续写：")], 8) + "\n"
    talk = _cli("--checkpoint", str(run), "--greedy", "--max-new-tokens", "8", stdin="续写：\n/reset\n续写：\n/quit\n")
    assert talk.returncode == 0, talk.stderr
    assert talk.stdout.count(one.stdout.strip()) == 2  # the same reply after /reset
    assert "(the conversation starts again)" in talk.stderr
    plain_model, plain_tok = _model_and_tokenizer(plain=True)
    plain = save_model_checkpoint(plain_model, plain_tok, tmp_path / "plain")
    refused = _cli("--checkpoint", str(plain), "--message", "续写：")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "not fine-tuned on conversations" in refused.stderr
    beams = _cli("--checkpoint", str(run), "--message", "x", "--beams", "2")
    assert beams.returncode == 2 and "--beams" in beams.stderr

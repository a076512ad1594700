"""The Chat tab's API (scratchlm/serve/chat_api.py) over real HTTP: a reply is the greedy
continuation of the template's prompt, computed here with the model's own forward pass and the
template written out by hand; the template view marks the tokens the loss learns as a hand count
does; bad conversations get one error line."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import NEEDS_BROWSER, SCREENS, WAIT_MS, Served, parse_sse, request
from scratchlm.checkpoint import save_model_checkpoint
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.text.chat import CHAT_TOKENS
from scratchlm.text.tokenizer import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "床前看月光，疑是地上霜。举头望山月，低头思故乡。\n写一首五言绝句，题为《秋夜》。续写："


def _model_and_tokenizer(plain: bool = False):
    tok = CharTokenizer.train([TEXT])
    tok = tok if plain else tok.with_tokens(CHAT_TOKENS)
    torch.manual_seed(5)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=48, n_layer=1, n_head=2, n_embd=32, dropout=0.0,
                          pos_embedding="rope", lm_head_bias=False)).eval()
    return model, tok


@pytest.fixture(scope="module")
def poet(tmp_path_factory):
    """(the served playground, the chat run's model and tokenizer): runs `poet` (with the chat
    tokens) and `plain` (without)."""
    from scratchlm.serve.library import RunLibrary

    runs = tmp_path_factory.mktemp("chat") / "runs"
    model, tok = _model_and_tokenizer()
    save_model_checkpoint(model, tok, runs / "poet" / "ckpt-00000001")  # a run folder with one checkpoint
    save_model_checkpoint(*_model_and_tokenizer(plain=True), runs / "plain" / "ckpt-00000001")
    with Served(RunLibrary(runs=runs)) as served:
        yield served, model, tok


def _by_hand(tok, turns: list[tuple[str, str]]) -> list[int]:
    """<|bos|>, each turn's role token, text and <|end|>, then <|assistant|>: the template's words."""
    s = tok.specials
    ids = [tok.bos_id]
    for role, text in turns:
        ids += [s[f"<|{role}|>"], *tok.encode(text), s["<|end|>"]]
    return ids + [s["<|assistant|>"]]


def _greedy(model, tok, ids: list[int], most: int) -> list[int]:
    out = []
    with torch.no_grad():
        while len(out) < most and len(ids) < model.config.block_size:
            nxt = int(model(torch.tensor([ids]))[0][0, -1, : tok.vocab_size].argmax())
            out.append(nxt)
            if nxt == tok.specials["<|end|>"]:
                break
            ids = [*ids, nxt]
    return out


def test_a_reply_is_the_greedy_continuation_of_the_templates_prompt(poet):
    served, model, tok = poet
    turns = [("system", "秋夜"), ("user", "写一首五言绝句"), ("assistant", "床前看月光"), ("user", "续写：")]
    body = {"run": "poet", "messages": [{"role": r, "content": c} for r, c in turns], "greedy": True,
            "max_new_tokens": 12}
    status, text = request(served.port, "POST", "/api/chat", body)
    assert status == 200, text
    events = parse_sse(text)
    start = events[0][1]
    prompt = _by_hand(tok, turns)
    assert events[0][0] == "start" and start["start_ids"] == prompt and start["dropped"] == 0
    wanted = _greedy(model, tok, prompt, min(12, model.config.block_size - len(prompt)))
    assert [d["id"] for name, d in events if name == "token"] == wanted
    done = events[-1][1]
    ended = wanted[-1] == tok.specials["<|end|>"]
    assert done["reason"] == ("eos" if ended else "length")
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt]))[0][0, -1].double(), -1)
    assert events[1][1]["p"] == pytest.approx(float(probs[wanted[0]]), abs=1e-6)  # as on the Generate tab


def test_a_long_conversation_loses_its_oldest_exchanges_first(poet):
    served, model, tok = poet
    turns = [("user", "写一首五言绝句，题为《秋夜》。"), ("assistant", "床前看月光，疑是地上霜。")] * 2 + [("user", "续写：")]
    body = {"run": "poet", "messages": [{"role": r, "content": c} for r, c in turns], "greedy": True,
            "max_new_tokens": 4}
    start = parse_sse(request(served.port, "POST", "/api/chat", body)[1])[0][1]
    assert len(_by_hand(tok, turns)) >= model.config.block_size  # too long whole
    fits = next(k for k in range(3) if len(_by_hand(tok, turns[2 * k:])) < model.config.block_size)
    assert fits > 0 and start["dropped"] == fits and start["start_ids"] == _by_hand(tok, turns[2 * fits:])


def test_the_template_view_marks_the_reply_and_its_end_as_learned(poet):
    served, _, tok = poet
    turns = [("user", "写月"), ("assistant", "月光")]
    messages = [{"role": r, "content": c} for r, c in turns]
    status, view = request(served.port, "POST", "/api/chat/template", {"run": "poet", "messages": messages})
    assert status == 200, view
    assert [t["id"] for t in view["tokens"]] == _by_hand(tok, turns)[:-1]  # a training row has no open turn
    parts = [{"role": r, "content": [{"type": "text", "text": c[:1]}, {"type": "text", "text": c[1:]}]}
             for r, c in turns]  # text parts, as a conversations file may hold them, are one text
    assert [t["id"] for t in request(served.port, "POST", "/api/chat/template",
                                     {"run": "poet", "messages": parts})[1]["tokens"]] == _by_hand(tok, turns)[:-1]
    assert [t["label"] for t in view["tokens"]] == ["<|bos|>", "<|user|>", "写", "月", "<|end|>", "<|assistant|>",
                                                   "月", "光", "<|end|>"]
    assert [t["loss"] for t in view["tokens"]] == [False] * 6 + [True] * 3
    assert [t["special"] for t in view["tokens"]] == [True, True, False, False, True, True, False, False, True]
    everything = request(served.port, "POST", "/api/chat/template",
                         {"run": "poet", "messages": messages, "train_on": "all"})[1]
    assert [t["loss"] for t in everything["tokens"]] == [False, False, True, True, True, False, True, True, True]


@pytest.mark.parametrize("body, words", [
    ({"run": "plain", "messages": [{"role": "user", "content": "x"}]}, "not fine-tuned on conversations"),
    ({"run": "poet", "messages": []}, "one or more"),
    ({"run": "poet", "messages": "写"}, "expected a list"),
    ({"run": "poet", "messages": [{"role": "poet", "content": "x"}]}, "the roles are system, user, assistant"),
    ({"run": "poet", "messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]},
     "message 2 is a system message; only the first may be"),
    ({"run": "poet", "messages": [{"role": "user", "content": 3}]}, '"content" must be text'),
    ({"run": "poet", "messages": [{"role": ["user"], "content": "x"}]}, 'with a string "role"'),
    ({"run": "poet", "messages": [{"role": "user", "content": "\ud800"}]}, "lone surrogate"),
    ({"run": "poet", "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "only text parts"),
    ({"run": "poet", "messages": [{"role": "user"}]}, '"content" must be text'),
    ({"run": "poet", "messages": [{"role": "user", "content": "x"}], "prompt": "y"}, "not a prompt"),
    ({"run": "poet", "messages": [{"role": "user", "content": "x", "name": "y"}]}, 'keys besides "role" and "content"'),
    ({"run": "poet", "messages": [{"role": "assistant", "content": "x"}]}, "the last message must be the user's"),
    ({"run": "poet", "messages": [{"role": "user", "content": "x"}], "beams": 2}, "beams must be 1"),
    ({"run": "poet", "messages": [{"role": "user", "content": "床" * 60}]}, "send a shorter one"),
    ({"run": "poet", "messages": [{"role": "user", "content": "z"}]}, "z"),  # a character the vocabulary lacks
])
def test_bad_conversations_get_one_error_line(poet, body, words):
    status, answer = request(poet[0].port, "POST", "/api/chat", body)
    assert status == 400 and words in answer["error"] and "\n" not in answer["error"]


def test_the_template_view_refuses_unknown_fields_and_train_on_values(poet):
    messages = [{"role": "user", "content": "写"}]
    status, answer = request(poet[0].port, "POST", "/api/chat/template", {"run": "poet", "messages": messages, "x": 1})
    assert status == 400 and "unknown field(s) x" in answer["error"]
    status, answer = request(poet[0].port, "POST", "/api/chat/template",
                             {"run": "poet", "messages": messages, "train_on": "users"})
    assert status == 400 and answer["error"].startswith("train_on: expected assistant or all")


@NEEDS_BROWSER
@pytest.mark.parametrize("screen", list(SCREENS))
def test_the_chat_tab_shows_the_greedy_reply_and_the_templates_learned_tokens(poet, browser, screen):
    """In Chromium, typed as a person types: the reply's tokens are the hand greedy continuation,
    each shaded by its probability; the template view underlines the reply and its end; axe-core
    finds nothing serious, and nothing is wider than a phone's screen."""
    served, model, tok = poet
    context = browser.new_context(**SCREENS[screen])
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{served.port}/#generate")
    page.wait_for_function("window.playground && window.playground.ready === true", timeout=WAIT_MS)
    page.select_option("#run", "poet")
    if not page.eval_on_selector("#settings", "d => d.open"):  # folded on a phone
        page.click("#settings summary")
    page.set_checked("#greedy", True)  # the Generate tab's settings apply to the chat
    page.fill("#max_new_tokens", "10")
    page.goto(f"http://127.0.0.1:{served.port}/#chat")  # the settings stay: the page does not reload
    page.wait_for_selector("#tab-chat:not([hidden])", timeout=WAIT_MS)
    page.locator("#chat-input").press_sequentially("续写：")
    page.locator("#chat-input").press("Enter")
    page.wait_for_selector("#chat-status[data-state=done]", timeout=WAIT_MS)  # the reply is over
    page.wait_for_selector("#chat-send:enabled", timeout=WAIT_MS)
    prompt = _by_hand(tok, [("user", "续写：")])
    wanted = _greedy(model, tok, prompt, 10)
    shown = page.eval_on_selector_all("#chat-log .assistant .tok", "spans => spans.map(s => Number(s.dataset.id))")
    assert shown == wanted
    reply = page.evaluate("window.playground.chat.messages")
    assert reply[0] == {"role": "user", "content": "续写："} and reply[1]["role"] == "assistant"
    page.set_checked("#chat-show-template", True)
    page.wait_for_selector("#chat-template .chip", timeout=WAIT_MS)
    chips = page.eval_on_selector_all("#chat-template .chip",
                                      "cs => cs.map(c => [c.textContent, c.classList.contains('loss')])")
    reply_ids = tok.encode(reply[1]["content"])
    assert [c[0] for c in chips[:5]] == ["<|bos|>", "<|user|>", "续", "写", "："]
    assert sum(learned for _, learned in chips) == len(reply_ids) + 1  # the reply's tokens and its <|end|>
    assert [learned for _, learned in chips[:-len(reply_ids) - 1]] == [False] * (len(chips) - len(reply_ids) - 1)
    axe = pytest.importorskip("axe_playwright_python.sync_playwright",
                              reason="the dev extra installs axe-playwright-python").Axe()
    violations = axe.run(page).response["violations"]
    assert [v["id"] for v in violations if v["impact"] in ("serious", "critical")] == []
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.click("#chat-reset")
    assert page.evaluate("window.playground.chat.messages") == []
    context.close()
    assert errors == []


def _sse(*events) -> str:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def _token(index: int, text: str) -> dict:
    return {"index": index, "id": 100 + index, "label": text, "text": text, "p": 0.5}


def _answer(body: str):
    """A route handler that answers with this event stream."""
    return lambda route: route.fulfill(content_type="text/event-stream", body=body)


def _wait_until(page, test, what: str) -> None:
    """Let the page's event loop (and Playwright's route handlers) run until test() holds."""
    for _ in range(WAIT_MS // 50):
        if test():
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"waited {WAIT_MS} ms for {what}")


@NEEDS_BROWSER
def test_the_chat_tab_withdraws_an_exchange_that_got_no_whole_reply_and_keeps_the_newest_template(poet, browser):
    """Answers the page cannot trust, played by Playwright in place of the server: Stop before any
    answer withdraws the message (back into the box, no error), as the server's own stop before a
    token does; a stream that ends without its done event, or with an error event, shows the
    error and withdraws the exchange; of two
    template answers the older one, arriving last, does not replace the newer."""
    served = poet[0]
    context = browser.new_context(**SCREENS["desktop"])
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{served.port}/#generate")
    page.wait_for_function("window.playground && window.playground.ready === true", timeout=WAIT_MS)
    page.select_option("#run", "poet")
    page.goto(f"http://127.0.0.1:{served.port}/#chat")
    page.wait_for_selector("#tab-chat:not([hidden])", timeout=WAIT_MS)
    start = ("start", {"prompt_ids": 4, "seed": None})

    def withdrawn(text: str) -> None:
        assert page.evaluate("window.playground.chat.messages") == []
        assert page.locator("#chat-log .msg").count() == 0
        assert page.input_value("#chat-input") == text
        assert page.is_enabled("#chat-send")

    held = []
    page.route("**/api/chat", lambda route: held.append(route))
    page.fill("#chat-input", "续写：")
    page.click("#chat-send")
    _wait_until(page, lambda: held, "the chat request")
    page.click("#chat-stop")
    page.wait_for_selector("#chat-status[data-state=stopped]", timeout=WAIT_MS)
    withdrawn("续写：")
    assert page.text_content("#chat-error").strip() == ""
    page.unroute("**/api/chat")

    for ending, words in ((), "ended before the reply was over"), ((("error", {"message": "the model broke"}),),
                                                                    "the model broke"):
        body = _sse(start, ("token", _token(0, "月")), *ending)
        page.route("**/api/chat", _answer(body))
        page.click("#chat-send")
        page.wait_for_selector("#chat-status[data-state=error]", timeout=WAIT_MS)
        assert words in page.text_content("#chat-error")
        withdrawn("续写：")
        page.unroute("**/api/chat")

    page.route("**/api/chat", _answer(_sse(start, ("done", {"reason": "stopped", "tokens": 0}))))
    page.click("#chat-send")  # the server shut down before a token: withdrawn, as the page's own Stop
    page.wait_for_selector("#chat-status[data-state=stopped]", timeout=WAIT_MS)
    assert "the server is shutting down" in page.text_content("#chat-status")
    withdrawn("续写：")
    page.unroute("**/api/chat")

    body = _sse(start, ("token", _token(0, "月")), ("done", {"reason": "eos", "tokens": 1}))
    page.route("**/api/chat", _answer(body))
    page.click("#chat-send")
    page.wait_for_selector("#chat-status[data-state=done]", timeout=WAIT_MS)
    assert page.evaluate("window.playground.chat.messages")[1] == {"role": "assistant", "content": "月"}
    asked = []
    page.route("**/api/chat/template", lambda route: asked.append(route))
    page.set_checked("#chat-show-template", True)
    _wait_until(page, lambda: len(asked) == 1, "the first template request")
    page.select_option("#chat-train-on", "all")
    _wait_until(page, lambda: len(asked) == 2, "the second template request")

    def view(label: str) -> str:
        return json.dumps({"tokens": [{"id": 1, "label": label, "special": False, "loss": True}], "learned": 1,
                           "block_size": 48})

    asked[1].fulfill(content_type="application/json", body=view("newer"))
    page.wait_for_selector("#chat-template .chip", timeout=WAIT_MS)
    asked[0].fulfill(content_type="application/json", body=view("older"))
    page.wait_for_function("window.playground.chat.templateAnswers === 2", timeout=WAIT_MS)
    assert page.eval_on_selector_all("#chat-template .chip", "cs => cs.map(c => c.textContent)") == ["newer"]
    context.close()
    assert errors == []

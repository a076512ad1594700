"""The Inside tab walks the selected run's own model on a text (issue 34): POST /api/walkthrough
and scratchlm.inside.walkthrough_run, which `scratchlm walkthrough --checkpoint` shares. The walk's
numbers are checked against the run's model run forward by plain torch (its fast attention path,
not the explicit one the walk traces), its tokens against the run's tokenizer; the page at a
desktop's and a phone's size, and axe-core on it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from helpers import NEEDS_BROWSER, SCREENS, open_playground, request

PROMPT = "ROMEO: the king"
LONG = "The king speaks to the queen of the night. " * 2  # 86 characters: more than 32 tokens


@pytest.fixture(scope="module")
def trained(runs):
    """The served run's model (float32, as saved) and tokenizer, loaded here on their own."""
    from scratchlm.checkpoint import load_model

    model, tokenizer, _ = load_model(runs / "mixed")
    return model.eval(), tokenizer


def _row(tokenizer, text: str) -> list[int]:
    return [tokenizer.bos_id, *tokenizer.encode(text)]


def _shown(tokenizer, ids) -> list[str]:
    """Each id's piece as the page draws it (a char tokenizer: one character an id)."""
    return [tokenizer.decode([i]).replace(" ", "\u2423") for i in ids]


def _plain_logits(model, ids: list[int]) -> torch.Tensor:
    """The model's logits at every position by its ordinary forward pass, in float64."""
    with torch.no_grad():
        logits, _ = copy.deepcopy(model).double()(torch.tensor([ids]))  # (1, T, V)
    return logits[0]


def _station(data, key: str) -> np.ndarray:
    return np.array(next(s["torch"] for s in data["steps"] if s["key"] == key), dtype=float)


# ------------------------------------------------------------------------------ the route


def test_a_run_walk_is_that_runs_forward_pass_on_the_text(served, trained):
    model, tok = trained
    got, data = request(served.port, "POST", "/api/walkthrough", {"run": "mixed", "text": PROMPT})
    assert got == 200, data
    row = _row(tok, PROMPT)
    assert data["run"] == "mixed" and data["ids"] == row[:-1] and data["targets"] == row[1:]
    assert data["labels"] == ["<|bos|>", *_shown(tok, row[1:-1])]
    assert data["target_labels"] == _shown(tok, row[1:])
    assert not data["cropped"] and data["row_tokens"] == len(row) - 1 and data["limit"] == 32
    logits = _plain_logits(model, row[:-1]).numpy()
    np.testing.assert_allclose(_station(data, "logits"), logits, atol=1e-9)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(_station(data, "probs"), probs, atol=1e-12)
    assert data["max_diff"] < 1e-12  # the NumPy twin, float64 on both sides
    assert [i for i, _, _ in data["next"]] == list(np.argsort(-probs[-1])[:5])
    assert data["config"]["n_layer"] == model.config.n_layer and data["omitted"] == {}


def test_a_long_text_is_cropped_to_the_first_32_inputs_and_says_so(served, trained):
    model, tok = trained
    row = _row(tok, LONG)
    got, data = request(served.port, "POST", "/api/walkthrough", {"run": "mixed", "text": LONG})
    assert got == 200, data
    assert data["cropped"] and data["row_tokens"] == len(row) - 1 > 32
    assert data["ids"] == row[:32] and data["targets"] == row[1:33]
    np.testing.assert_allclose(_station(data, "logits"), _plain_logits(model, row[:32]).numpy(), atol=1e-9)


@pytest.mark.parametrize("body, status, words", [
    ({"run": "mixed", "text": ""}, 400, "text: empty"),
    ({"run": "mixed", "text": "\u0416\u0416"}, 400, "vocabulary"),
    ({"run": "mixed", "text": "x" * 4001}, 400, "4,000 characters"),
    ({"run": "mixed", "text": 7}, 400, "text: expected str"),
    ({"run": "nope", "text": "ROMEO"}, 404, "no run named"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_walk_requests_get_one_error_line(served, body, status, words):
    got, answer = request(served.port, "POST", "/api/walkthrough", body)
    assert got == status and words in answer["error"], answer


def test_the_hand_walk_is_still_a_get(served):
    got, data = request(served.port, "GET", "/api/walkthrough")
    assert got == 200 and data["ids"] == [1, 3, 2] and "run" not in data


def test_the_walk_leaves_the_model_it_was_given_alone():
    """The playground keeps generating with the model it walked: the walk is on a float64 copy
    with dropout off; the command line's in-place walk changes the model it loaded."""
    from scratchlm.inside.walkthrough_run import walkable
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    model = GPT(GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    walked = walkable(model)
    assert walked is not model and walked.config.dropout == 0.0 and next(walked.parameters()).dtype == torch.float64
    assert model.config.dropout == 0.2 and next(model.parameters()).dtype == torch.float32
    assert all(m.p == 0.2 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert walkable(model, in_place=True) is model and model.config.dropout == 0.0


def test_arrays_too_big_to_send_come_as_their_shape(trained, monkeypatch):
    from scratchlm.inside import walkthrough_run

    model, tok = trained
    monkeypatch.setattr(walkthrough_run, "WALK_SHOWN_NUMBERS", 300)
    data = walkthrough_run.run_walk_json(model, tok, PROMPT, "mixed")
    wte = model.transformer.wte.weight
    assert data["omitted"]["transformer.wte.weight"] == list(wte.shape) and data["weights"]["transformer.wte.weight"] is None
    assert data["omitted"]["logits"] == [len(_row(tok, PROMPT)) - 1, model.config.vocab_size]
    logits = next(s for s in data["steps"] if s["key"] == "logits")
    assert logits["torch"] is None and logits["max_diff"] < 1e-12
    assert all(np.size(v) <= 300 for v in data["weights"].values() if v is not None)


# ------------------------------------------------------------------------------ the page


@pytest.fixture(params=list(SCREENS))
def screen(request, browser, served):
    context, page = open_playground(browser, served.port, request.param)
    yield page
    context.close()


def _walk(page, prompt: str) -> None:
    """Type the prompt in Generate, open Inside, walk the run on it."""
    page.fill("#prompt", prompt)
    page.click("#nav-inside")
    page.wait_for_selector("#walk-stations button.station")  # the hand model's walk comes first
    assert page.input_value("#walk-text") == prompt  # the prompt, carried over
    page.click("#walk-run")
    page.wait_for_function("window.playground.walkthrough && window.playground.walkthrough.run === 'mixed'")


@NEEDS_BROWSER
def test_the_inside_tab_walks_the_run_on_the_prompt(screen, trained):
    model, tok = trained
    _walk(screen, PROMPT)
    row = _row(tok, PROMPT)
    x, y = ["<|bos|>", *_shown(tok, row[1:-1])], _shown(tok, row[1:])
    summary = screen.inner_text("#walk-summary")
    assert "Run mixed" in summary and f"Input x: {' '.join(x)} (ids {', '.join(map(str, row[:-1]))})" in summary
    assert f": {' '.join(y)}." in summary and "only the first" not in summary
    screen.click("#walk-stations button.station[data-key='logits']")
    screen.wait_for_selector("#walk-matrix table.matrix")
    rows = screen.eval_on_selector_all("#walk-matrix table.matrix tr", "rs => rs.map(r => [r.querySelector('th')"
                                       "?.textContent, Array.from(r.querySelectorAll('td')).map(c => c.textContent)])")
    assert [name for name, _ in rows] == x  # one row per input token, labelled by it
    shown = np.array([[float(c.replace("\u2212", "-")) for c in cells] for _, cells in rows])
    np.testing.assert_allclose(shown, _plain_logits(model, row[:-1]).numpy(), atol=5e-5)
    screen.click("#walk-stations button.station[data-key='h0.weights']")
    heads = screen.eval_on_selector_all("#walk-matrix table.matrix", "ts => ts.map(t => Array.from("
                                        "t.querySelectorAll('tr')).slice(1).map(r => r.querySelector('th').textContent))")
    assert heads == [x] * model.config.n_head
    assert screen.errors == []


@NEEDS_BROWSER
def test_a_long_prompt_is_cropped_with_a_note_and_back_to_the_hand_model(screen, trained):
    _, tok = trained
    _walk(screen, LONG)
    note = screen.inner_text("#walk-summary .cropped")
    assert f"makes {len(_row(tok, LONG)) - 1} input tokens" in note and "only the first 32" in note
    assert screen.evaluate("window.playground.walkthrough.ids.length") == 32
    screen.click("#walk-hand")
    screen.wait_for_function("window.playground.walkthrough.run === undefined")
    assert "hand-sized model" in screen.inner_text("#walk-summary")
    assert screen.locator("#walk-summary .cropped").count() == 0


@NEEDS_BROWSER
def test_a_bad_text_says_why_on_the_page(screen):
    screen.click("#nav-inside")
    screen.wait_for_selector("#walk-stations button.station")
    screen.fill("#walk-text", "\u0416")
    screen.click("#walk-run")
    screen.wait_for_selector("#walk-error:not([hidden])")
    assert "vocabulary" in screen.inner_text("#walk-error")
    assert screen.evaluate("window.playground.walkthrough.run") is None


@NEEDS_BROWSER
def test_axe_finds_nothing_serious_on_a_run_walk(screen):
    axe_sync = pytest.importorskip("axe_playwright_python.sync_playwright",
                                   reason="the dev extra installs axe-playwright-python")
    _walk(screen, PROMPT)
    screen.click("#walk-stations button.station[data-key='h0.weights']")
    screen.wait_for_selector("#walk-matrix table.matrix")
    violations = axe_sync.Axe().run(screen).response["violations"]
    serious = [f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']}" for v in violations
               if v["impact"] in ("serious", "critical")]
    assert serious == []


def test_a_model_past_the_walks_size_is_refused_in_one_line(runs):
    from helpers import Served
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs), Limits(walk_params=1000)) as small:
        status, answer = request(small.port, "POST", "/api/walkthrough", {"run": "mixed", "text": "ROMEO:"})
    assert status == 400 and "up to 1,000 parameters" in answer["error"] and "\n" not in answer["error"]


def test_a_walk_sends_no_more_numbers_in_all_than_its_total(trained):
    """Past the total, the later arrays go as shapes alone; what is sent is whole and in order."""
    from scratchlm.inside.walkthrough_run import _within, walk_run

    model, tokenizer = trained[:2]
    run = walk_run(model, tokenizer, _row(tokenizer, "ROMEO:")[:6], "mixed")
    sizes = [s.torch.size for s in run.walk.steps]
    total = sum(sizes[:3])  # room for the first three stations exactly
    shown, omitted = _within(run.walk, most=10**9, total=total)
    kept = [s.key for s in shown.steps if s.torch.size]
    assert kept == [s.key for s in run.walk.steps[:3]]
    assert sum(s.torch.size for s in shown.steps) + sum(a.size for a in shown.weights.values()) <= total
    assert set(omitted) >= {s.key for s in run.walk.steps[3:]}

"""The Generate tab's token popup in Debian's Chromium, on a desktop (1280x800) and a phone
(390x844, touch), issue 34: the model's probability beside the draw's (after temperature and
top-k), tokens the filters dropped greyed, "take this token instead" continuing from the chosen
token, the keyboard in and out of the popup, and axe-core with the popup open.

Expected values come from the test's own arithmetic on what the server sent (q from the p's by
the definition of temperature and top-k) or from the earlier stream (the text before a choice)."""

from __future__ import annotations

import pytest

from helpers import NEEDS_BROWSER, SCREENS, WAIT_MS, open_playground, press, wait_generated

pytestmark = NEEDS_BROWSER


def opened(browser, served, screen: str):
    return open_playground(browser, served.port, screen, console=False)


@pytest.fixture(params=list(SCREENS))
def page(request, browser, served):
    context, page = opened(browser, served, request.param)
    yield page
    context.close()
    assert page.errors == []


@pytest.fixture
def desktop(browser, served):
    """A phone has no keys to press: the keyboard's path is a desktop's (the touch path is tapping)."""
    context, page = opened(browser, served, "desktop")
    yield page
    context.close()
    assert page.errors == []


def generate(page, prompt: str, **settings):
    page.fill("#prompt", prompt)
    if not page.eval_on_selector("#settings", "d => d.open"):
        page.click("#settings > summary")
    for name, value in settings.items():
        if isinstance(value, bool):
            page.set_checked(f"#{name}", value)
        else:
            page.fill(f"#{name}", str(value))
    page.click("#go")
    wait_generated(page)


def pin(page, index: int):
    """Open the popup of token `index` and pin it: a click on a desktop, a tap on a phone."""
    press(page, f"#output .tok[data-index='{index}']", page.screen == "phone",
          then=f"#alts[data-index='{index}'][data-pinned]:visible")


def tokens(page) -> list[dict]:
    return page.evaluate("playground.tokens.map(t => ({id: t.id, text: t.text, forced: t.forced}))")


def test_the_popup_shows_the_draws_probability_and_greys_what_top_k_dropped(page):
    temperature, k = 1.5, 2
    generate(page, "ROMEO:", max_new_tokens=12, temperature=temperature, top_k=k, seed=4)
    pin(page, 2)
    rows = page.eval_on_selector_all("#alts tr.alt", "rs => rs.map(r => ({p: +r.dataset.p, q: +r.dataset.q, "
                                     "filtered: r.classList.contains('filtered'), chosen: r.classList.contains('chosen'), "
                                     "shown: r.cells[2].textContent}))")
    top = rows[:5]
    assert len(top) == 5 and [r["p"] for r in top] == sorted((r["p"] for r in top), reverse=True)
    # by definition: the k likeliest keep p^(1/T), renormalised among themselves; the rest get 0
    kept = [r["p"] ** (1 / temperature) for r in top[:k]]
    for row, w in zip(top[:k], kept):
        assert row["q"] == pytest.approx(w / sum(kept), rel=1e-6) and not row["filtered"]
    for row in top[k:]:
        assert row["q"] == 0 and (row["filtered"] or row["chosen"]) and row["shown"].startswith("0")
    colour = page.eval_on_selector("#alts tr.filtered td", "td => getComputedStyle(td).textDecorationLine")
    assert colour == "line-through"


def test_take_this_token_instead_continues_from_the_chosen_token(page):
    generate(page, "ROMEO:\n", max_new_tokens=30, temperature=1.2, seed=9)
    before = tokens(page)
    index = min(8, len(before) - 2)
    assert index >= 2, "the stream ended too early to choose inside it"
    pin(page, index)
    button = page.locator("#alts button.take").first
    chosen = int(button.get_attribute("data-id"))
    assert chosen != before[index]["id"]
    text_before = page.eval_on_selector("#output", "o => [...o.querySelectorAll('.tok')].slice(0, %d)"
                                                   ".map(t => t.textContent).join('')" % index)
    press(page, "#alts button.take", page.screen == "phone", then=None)
    page.wait_for_function("playground.tokens.length > 0 && playground.tokens[0].forced === true", timeout=WAIT_MS)
    wait_generated(page)
    after = tokens(page)
    assert [t["id"] for t in after[:index]] == [t["id"] for t in before[:index]]  # the text up to it
    assert after[index]["id"] == chosen  # the chosen token next
    assert [t["forced"] for t in after[: index + 1]] == [True] * (index + 1)
    assert not any(t["forced"] for t in after[index + 1:])
    shown = page.eval_on_selector("#output", "o => [...o.querySelectorAll('.tok')].slice(0, %d)"
                                             ".map(t => t.textContent).join('')" % index)
    assert shown == text_before
    assert page.get_attribute(f"#output .tok[data-index='{index}']", "class").split().count("taken") == 1
    assert "continuing from token" in page.inner_text("#status")


def test_the_keyboard_goes_into_the_popup_takes_a_token_and_escape_comes_back(desktop):
    page = desktop
    generate(page, "ROMEO:\n", max_new_tokens=20, temperature=1.2, seed=2)
    page.focus("#output .tok[data-index='0']")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    page.wait_for_selector("#alts[data-index='1'][data-pinned]", state="visible")
    assert page.evaluate("document.activeElement.closest('#alts') !== null")
    page.keyboard.press("Escape")  # out of the popup, back to its token (whose focus shows it unpinned)
    page.wait_for_selector("#alts:not([data-pinned])")
    assert page.evaluate("document.activeElement.dataset.index") == "1"
    page.keyboard.press("Enter")
    focused = page.evaluate("document.activeElement.classList.contains('take') && +document.activeElement.dataset.id")
    assert focused is not False
    page.keyboard.press("Enter")
    page.wait_for_function("playground.tokens.length > 1 && playground.tokens[1].forced === true")
    wait_generated(page)
    assert page.evaluate("playground.tokens[1].id") == focused


def test_axe_finds_nothing_serious_with_the_popup_pinned(page):
    axe_sync = pytest.importorskip("axe_playwright_python.sync_playwright",
                                   reason="the dev extra installs axe-playwright-python")
    generate(page, "ROMEO:\n", max_new_tokens=12, temperature=1.3, top_k=3, seed=1)
    pin(page, 1)
    violations = axe_sync.Axe().run(page).response["violations"]
    assert [f"{v['id']} ({v['impact']})" for v in violations if v["impact"] in ("serious", "critical")] == []


def test_attention_at_this_step_shows_the_row_the_token_was_chosen_from(page):
    """The popup's "attention at this step" opens the Attention tab on the ids the model had seen
    before that token (the prompt's, then the tokens before it) and the last of them as the query."""
    generate(page, "ROMEO:\n", max_new_tokens=12, temperature=1.2, seed=6)
    index = min(5, page.evaluate("playground.tokens.length") - 1)
    expected = page.evaluate(f"playground.tokens.slice(0, {index}).map(t => t.id)")
    pin(page, index)
    press(page, "#alts button.attention-at", page.screen == "phone", then="#att-row:not([hidden])")
    assert page.evaluate("location.hash") == "#attention"
    sent = page.evaluate("playground.attention.ids")
    prompt_ids = sent[: len(sent) - index]
    assert sent[len(prompt_ids):] == expected and len(prompt_ids) == len("ROMEO:\n")  # a char tokenizer
    assert page.evaluate("playground.attentionRow.position") == len(sent) - 1
    assert f"as token {index + 1}" in page.inner_text("#att-row")
    assert page.evaluate("document.activeElement.id") == "att-row-title"

"""The playground on a desktop (1280x800) and on a phone (390x844, touch), in Debian's Chromium:
the stream where the eye is, rates from the server's clock, a picker that opens on a run that can
generate, the keyboard, a quiet live region, settings that do not apply, and plain words for
every end state (issue 34). What the page says is checked against what the server sent or what
the test arranged, never against the page's own arithmetic."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import CHROMIUM, CHROMIUM_ARGS, NEEDS_BROWSER, SCREENS, WAIT_MS, Served, press, wait_generated, wait_until

pytestmark = NEEDS_BROWSER
CROPPED = pytest.mark.filterwarnings("ignore:the prompt has:UserWarning")
"""The server warns (on its stderr) when a prompt is longer than the model's context; pytest
would turn that warning, raised in the server's thread, into an error."""


@pytest.fixture(scope="module")
def folder(runs, tmp_path_factory):
    """A trained run, and a newer one that has only started (metrics, no checkpoint)."""
    base = tmp_path_factory.mktemp("screens") / "runs"
    shutil.copytree(runs / "mixed", base / "trained")
    (base / "young").mkdir()
    (base / "young" / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n', encoding="utf-8")
    later = time.time() + 10  # newer than the copy, whatever the clock's grain
    os.utime(base / "young" / "metrics.jsonl", (later, later))
    return base


@pytest.fixture(scope="module")
def served_screens(folder):
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=folder), Limits()) as s:
        yield s


def _open(browser, served, screen: str):
    context = browser.new_context(**SCREENS[screen])
    page = context.new_page()
    page.failed, page.errors = [], []
    page.on("requestfailed", lambda r: page.failed.append(f"{r.url} {r.failure}"))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.goto(f"http://127.0.0.1:{served.port}/#generate")
    page.wait_for_function("window.playground && window.playground.ready === true")
    return context, page


@pytest.fixture(params=list(SCREENS))
def screen(request, browser, served_screens):
    context, page = _open(browser, served_screens, request.param)
    page.screen = request.param
    yield page
    context.close()


def _settings(page, **values):
    """Set the sampling settings (unfolding them first on a phone)."""
    if not page.eval_on_selector("#settings", "d => d.open"):
        page.click("#settings > summary")
    for name, value in values.items():
        if isinstance(value, bool):
            page.set_checked(f"#{name}", value)
        else:
            page.fill(f"#{name}", str(value))


def _generate(page, prompt: str, n: int, wait: bool = True, **settings):
    page.fill("#prompt", prompt)
    _settings(page, max_new_tokens=n, **settings)
    if page.screen == "phone":  # as a reader would: fold the settings again before generating
        page.click("#settings > summary")
    page.click("#go")
    if wait:
        wait_generated(page)


def test_the_picker_marks_a_run_without_a_checkpoint_and_opens_on_one_that_can_generate(screen):
    assert screen.input_value("#run") == "trained"
    labels = screen.eval_on_selector_all("#run option", "os => os.map(o => o.textContent)")
    assert labels[0].startswith("young") and "no checkpoint yet" in labels[0]
    assert labels[1].startswith("trained ·") and "(" not in labels[1]
    _generate(screen, "ROMEO:", 12, greedy=True)  # the default run generates at once
    assert screen.locator("#output .tok").count() == 12
    assert screen.errors == []


@CROPPED
def test_on_every_screen_the_stream_is_followed_where_the_eye_is(screen):
    if screen.screen == "phone":
        assert not screen.eval_on_selector("#settings", "d => d.open")  # folded: the prompt and output first
        assert not screen.is_visible(".hint.keys")  # no keys to press on a touch screen
    prompt = "ROMEO:\n" * 40  # a prompt taller than the screen: the text streams below the fold
    _generate(screen, prompt, 300, wait=False, temperature=1.0, seed=3)
    screen.wait_for_selector("#output .tok", state="attached", timeout=60_000)
    inside = """() => { const t = [...document.querySelectorAll('#output .tok')].pop().getBoundingClientRect();
                        return t.bottom > 0 && t.top < window.innerHeight; }"""
    screen.wait_for_function(inside, timeout=WAIT_MS)  # while it streams: before the done line is waited for
    wait_generated(screen)
    assert screen.evaluate(inside) and screen.evaluate("window.scrollY") > 0


@CROPPED
def test_scrolling_away_stops_the_following(browser, served_screens):
    context, page = _open(browser, served_screens, "desktop")
    page.screen = "desktop"
    try:
        _generate(page, "ROMEO:\n" * 40, 1000, wait=False, greedy=True)
        page.wait_for_function("document.querySelectorAll('#output .tok').length >= 20", timeout=60_000)
        page.mouse.move(600, 400)
        page.mouse.wheel(0, -5000)  # the reader goes back up to the prompt
        page.wait_for_function("window.scrollY === 0")
        wait_generated(page)
        assert page.evaluate("window.scrollY") == 0  # and stays there
    finally:
        context.close()


def test_rates_are_the_servers_and_a_short_stream_reads_like_a_long_one(browser, served_screens, monkeypatch):
    """The server's clock is replaced by one that moves 10 ms per token made: whatever the
    browser's batches do, 20 and 300 tokens both read 100 tokens/s."""
    import scratchlm.serve.streams as streams

    clock = {"now": 1000.0}
    made = streams.token_sse

    def one_token(*args, **kwargs):
        clock["now"] += 0.01
        return made(*args, **kwargs)

    monkeypatch.setattr(streams, "token_sse", one_token)
    monkeypatch.setattr(streams.time, "perf_counter", lambda: clock["now"])
    context, page = _open(browser, served_screens, "desktop")
    page.screen = "desktop"
    try:
        rates = []
        for n in (20, 300, 1):
            _generate(page, "ROMEO:", n, greedy=True)
            status = page.inner_text("#status")
            done = page.evaluate("window.playground.done")
            assert status.startswith(f"{n} tokens in ") and done["tokens"] == n
            rate = float(re.search(r"\(([\d.]+) tokens/s", status).group(1))
            assert rate == pytest.approx(n / done["seconds"], rel=1e-3)
            rates.append(rate)
        assert rates == [pytest.approx(100.0, rel=1e-3)] * 3
    finally:
        context.close()


def test_the_keyboard_reaches_every_token_through_one_tab_stop_and_escape_stops(browser, served_screens, monkeypatch):
    context, page = _open(browser, served_screens, "desktop")
    page.screen = "desktop"
    try:
        _generate(page, "ROMEO:", 40, greedy=True)
        assert page.eval_on_selector_all("#output .tok", "ts => ts.filter(t => t.tabIndex === 0).length") == 1
        page.focus("#output .tok[data-index='0']")
        page.wait_for_selector("#alts[data-index='0']", state="visible")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("#alts[data-index='2']", state="visible")
        assert page.evaluate("document.activeElement.dataset.index") == "2"
        # Generate by keyboard, then Escape: the stream stops and the focus stays on a button. The
        # model thread is held before the stream's first step (as in test_serve_browser's Stop
        # test), so the stream cannot end by itself first.
        model_thread = served_screens.app.state.model_thread
        gate, held = threading.Event(), []

        def add_and_hold(stream):
            def job():
                model_thread._take((None, (stream,), None))
                gate.wait()
            held.append(model_thread.call(job))

        monkeypatch.setattr(model_thread, "add", add_and_hold)
        page.focus("#go")
        page.keyboard.press("Enter")
        try:
            assert wait_until(lambda: bool(held) and held[0].running(), 30)
            assert page.evaluate("document.activeElement.id") == "stop"
            page.keyboard.press("Escape")
            page.wait_for_selector("#status[data-state=stopped]", timeout=30_000)
        finally:
            gate.set()
        assert page.evaluate("document.activeElement.id") == "go"
        assert re.match(r"stopped after 0 tokens", page.inner_text("#status"))
    finally:
        context.close()


def test_the_live_region_speaks_at_the_start_and_the_end_only(browser, served_screens):
    context, page = _open(browser, served_screens, "desktop")
    page.screen = "desktop"
    try:
        page.evaluate("""() => { window.spoken = [];
            for (const region of document.querySelectorAll('[aria-live]'))
              new MutationObserver(() => window.spoken.push(region.textContent))
                .observe(region, {childList: true, characterData: true, subtree: true}); }""")
        _generate(page, "ROMEO:", 300, temperature=1.0, seed=1)
        spoken = page.evaluate("window.spoken")
        n = page.locator("#output .tok").count()  # 300, or fewer where the model wrote its end-of-text
        assert len(spoken) <= 3 and spoken[-1] == f"done: {n} tokens", spoken
        assert page.eval_on_selector("#status", "s => s.getAttribute('aria-live')") is None
    finally:
        context.close()


@pytest.mark.parametrize("settings, dimmed, note", [
    (dict(greedy=True, temperature=0.7, seed=3), {"temperature", "top_k", "top_p", "min_p", "seed", "length_penalty"},
     "temperature, seed have no effect with greedy decoding (it takes the likeliest token)"),
    (dict(greedy=True, beams=2), {"temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty", "greedy"},
     "greedy has no effect with beams (beam search ranks by log-probability)"),
    (dict(greedy=False, beams=1, temperature=0.8), {"length_penalty"}, None),
    (dict(length_penalty=0.5), {"length_penalty"}, "length penalty applies to beam search only"),
    (dict(greedy=True, seed=3, length_penalty=0.5), {"temperature", "top_k", "top_p", "min_p", "seed", "length_penalty"},
     "seed has no effect with greedy decoding (it takes the likeliest token); length penalty applies to beam search only"),
    (dict(beams=3, length_penalty=0.5), {"temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty", "greedy"},
     None),
])
def test_settings_that_do_not_apply_are_dimmed_with_the_command_lines_words(screen, settings, dimmed, note):
    _settings(screen, **settings)
    shown = set(screen.eval_on_selector_all("#settings label.inert input", "is => is.map(i => i.id)"))
    assert shown == dimmed
    if note is None:
        assert not screen.is_visible("#settings-note")
    else:
        assert screen.inner_text("#settings-note") == note


def test_inputs_have_borders_a_control_needs(screen):
    """WCAG's 3:1 for the boundary of a control, computed from the colours the browser uses."""
    colours = screen.evaluate("""() => { const i = document.querySelector('#temperature');
        const s = getComputedStyle(i); return [s.borderTopColor, getComputedStyle(i.parentElement).backgroundColor,
        getComputedStyle(document.body).backgroundColor]; }""")

    def luminance(css: str) -> float:
        r, g, b = (int(x) / 255 for x in re.findall(r"\d+", css)[:3])
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    border = luminance(colours[0])
    for background in colours[2:]:
        light, dark = sorted([border, luminance(background)], reverse=True)
        assert (light + 0.05) / (dark + 0.05) >= 3, colours


@pytest.mark.parametrize("answer, words", [
    ("abort", "the server did not answer: is scratchlm serve still running?"),
    ("shutdown", "ended early: the server is shutting down"),
])
def test_end_states_in_plain_words(browser, served_screens, answer, words):
    context, page = _open(browser, served_screens, "desktop")
    page.screen = "desktop"
    try:
        if answer == "abort":
            page.route("**/api/generate", lambda route: route.abort("connectionrefused"))
        else:  # what the server sends its readers when it is stopped (tests/test_serve_cli.py: SIGINT)
            body = ('event: start\ndata: {"prompt_ids": 6, "cropped": false, "seed": 1}\n\n'
                    'event: done\ndata: {"reason": "stopped", "tokens": 0, "seconds": 0.5, '
                    '"first_token_seconds": null, "text": "", "logprob": null}\n\n')
            page.route("**/api/generate", lambda route: route.fulfill(
                status=200, headers={"Content-Type": "text/event-stream"}, body=body))
        page.fill("#prompt", "ROMEO:")
        page.click("#go")
        page.wait_for_function("['done', 'error'].includes(document.querySelector('#status').dataset.state)")
        shown = page.inner_text("#status") + " " + page.inner_text("#gen-error")
        assert words in shown and "Failed to fetch" not in shown.split("(")[0]
    finally:
        context.close()


@CROPPED
def test_the_cropped_note_stays_when_the_stream_ends(screen, folder):
    from scratchlm.checkpoint import load_model

    prompt = "ROMEO: " * 20
    assert len(prompt) > load_model(folder / "trained")[0].config.block_size  # a character tokenizer
    _generate(screen, prompt, 5, greedy=True)
    assert "cropped to the model's context window" in screen.inner_text("#status")


def test_axe_finds_nothing_serious_on_any_tab(screen):
    """axe-core (bundled with axe-playwright-python, evaluated into the page from here: the page
    itself loads nothing) on each tab with its content shown."""
    axe_sync = pytest.importorskip("axe_playwright_python.sync_playwright",
                                   reason="the dev extra installs axe-playwright-python")
    axe = axe_sync.Axe()
    _generate(screen, "ROMEO:", 30, greedy=True)
    if screen.screen == "desktop":
        screen.hover("#output .tok[data-index='3']")
        screen.wait_for_selector("#alts", state="visible")
    else:
        press(screen, "#output .tok[data-index='3']", touch=True, then="#alts[data-index='3'][data-pinned]:visible")
    found = {}
    for tab, ready in [("generate", "#alts"), ("attention", "#att-maps figure.attmap"),
                       ("inside", "#walk-stations button.station"), ("training", "#tab-training:not([hidden])")]:
        if tab != "generate":
            screen.goto(screen.url.split("#")[0] + "#" + tab)
            if tab == "attention":
                screen.fill("#att-text", "ROMEO: the king")
                screen.click("#att-go")
        screen.wait_for_selector(ready, timeout=60_000)
        violations = axe.run(screen).response["violations"]
        found[tab] = [f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']}" for v in violations
                      if v["impact"] in ("serious", "critical")]
    assert found == {tab: [] for tab in found}


def test_chinese_text_with_no_font_to_draw_it_brings_a_hint(browser, served_screens, tmp_path):
    """A browser whose fontconfig knows only the DejaVu fonts (no Han glyphs) shows the hint once
    Chinese is typed; one with a Chinese font (fontconfig says which) does not."""
    dejavu = Path("/usr/share/fonts/truetype/dejavu")
    if not dejavu.is_dir():
        pytest.skip("needs the DejaVu fonts (fonts-dejavu-core) for a browser with no Chinese font")
    conf = tmp_path / "fonts.conf"
    conf.write_text(f'<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig><dir>{dejavu}</dir>'
                    f"<cachedir>{tmp_path / 'cache'}</cachedir></fontconfig>\n", encoding="utf-8")
    bare = browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                       env={**os.environ, "FONTCONFIG_FILE": str(conf)})
    try:
        page = bare.new_page()
        page.goto(f"http://127.0.0.1:{served_screens.port}/#generate")
        page.wait_for_function("window.playground && window.playground.ready === true")
        assert not page.is_visible("#font-hint")
        page.locator("#prompt").press_sequentially("床前明月光")
        page.wait_for_selector("#font-hint", state="visible", timeout=WAIT_MS)
        assert "fonts-noto-cjk" in page.inner_text("#font-hint")
    finally:
        bare.close()
    has_han_font = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("fc-list") else ""
    if has_han_font:  # this machine's own fonts draw Chinese: no hint
        context, page = _open(browser, served_screens, "desktop")
        try:
            page.locator("#prompt").press_sequentially("床前明月光")
            page.wait_for_timeout(300)
            assert not page.is_visible("#font-hint")
        finally:
            context.close()

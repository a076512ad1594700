"""The playground in a real browser: Debian's Chromium, driven by Playwright.

The page is loaded from a `scratchlm serve` app on loopback and used as a person would: type a
prompt, press Generate, point at a token, open the attention tab, click a station. What it shows
is checked against what the server did not compute for it: `scratchlm generate --greedy`, the
model's plain forward pass, the NumPy reference's attention weights, fontconfig's list of which
fonts hold which characters. Screenshots go to the git-ignored .test-pictures/ for people.

Needs Chromium (`apt-get install chromium`; .ci/run installs it) and the playwright package (the
dev extra); without them these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import (CHROMIUM, CHROMIUM_ARGS, NEEDS_BROWSER, POEM, TINY_MODEL, Served, active_streams, cli_generate,
                     wait_generated, wait_until)

pytestmark = NEEDS_BROWSER
PICTURES = Path(__file__).resolve().parents[1] / ".test-pictures"


@pytest.fixture(scope="module")
def served(runs):
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs), Limits(max_new_tokens=100_000)) as s:  # room for the stop test
        yield s


@pytest.fixture
def page(browser, served):
    """A fresh page on the playground; every request it makes is recorded, and any console error
    or request off this server fails the test."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    base = f"http://127.0.0.1:{served.port}/"
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.base = base
    page.goto(base)
    page.wait_for_function("window.playground && window.playground.ready === true")
    page.select_option("#run", "mixed")
    yield page
    context.close()
    assert [u for u in requests if not u.startswith(base) and not u.startswith("data:")] == []
    assert errors == []


def _generate(page, prompt: str, max_new_tokens: int, **controls) -> dict:
    page.goto(page.base + "#generate")
    page.wait_for_function("window.playground.ready === true")
    page.fill("#prompt", "")
    page.locator("#prompt").press_sequentially(prompt)  # typed, key by key
    page.fill("#max_new_tokens", str(max_new_tokens))
    for name, value in controls.items():
        if isinstance(value, bool):
            page.set_checked(f"#{name}", value)
        else:
            page.fill(f"#{name}", str(value))
    page.click("#go")
    wait_generated(page)
    return page.eval_on_selector("#status", "s => ({...s.dataset})")


def _shown_text(page) -> str:
    return page.eval_on_selector_all("#output .tok", "spans => spans.map(s => s.textContent).join('')")


@pytest.mark.parametrize("prompt", ["ROMEO:", POEM[:3]])
def test_the_streamed_text_is_what_scratchlm_generate_prints(page, runs, prompt):
    status = _generate(page, prompt, 80, greedy=True)
    expected = cli_generate(runs / "mixed", prompt, "--greedy", "--max-new-tokens", "80")
    assert _shown_text(page) == expected
    assert page.inner_text("#output .prompt") == prompt
    assert int(status["tokens"]) == page.locator("#output .tok").count() == 80


def test_pointing_at_a_token_shows_the_models_own_probabilities(page, runs):
    """For several tokens of a sampled stream: the popup's alternatives and percentages are the
    softmax of the model's plain forward pass over the prompt and the tokens before it."""
    from scratchlm.checkpoint import load_model

    _generate(page, "The ", 30, temperature=1.3, seed=5)
    model, tokenizer, _ = load_model(runs / "mixed")
    model = model.double()
    ids = tokenizer.encode("The ") + [int(i) for i in page.eval_on_selector_all(
        "#output .tok", "spans => spans.map(s => s.dataset.id)")]
    for index in (0, 7, 19, 29):
        page.hover(f"#output .tok[data-index='{index}']")
        page.wait_for_selector(f"#alts[data-index='{index}']", state="visible")
        rows = page.eval_on_selector_all("#alts tr.alt", "trs => trs.map(tr => ({id: +tr.dataset.id, "
                                         "p: +tr.dataset.p, text: tr.textContent, chosen: tr.classList.contains('chosen')}))")
        if len(rows) == 6:  # the token taken, below the five when it is not among them
            assert rows[5]["chosen"] and rows[5]["id"] == ids[4 + index]
            rows = rows[:5]
        context = ids[: 4 + index][-model.config.block_size:]
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([context]))[0][0, -1, : tokenizer.vocab_size], -1)
        top = torch.argsort(probs, descending=True)[:5].tolist()
        assert [r["id"] for r in rows] == top
        for r in rows:
            assert r["p"] == pytest.approx(float(probs[r["id"]]), abs=1e-6)
            assert f"{100 * float(probs[r['id']]):.2f}%" in r["text"]  # what the reader sees, to 2 decimals
            assert r["chosen"] == (r["id"] == ids[4 + index])
        chosen_p = float(page.get_attribute(f"#output .tok[data-index='{index}']", "data-p"))
        assert chosen_p == pytest.approx(float(probs[ids[4 + index]]), abs=1e-6)


def test_stop_ends_the_stream_and_the_servers_generation(page, served, monkeypatch):
    """Stop pressed while the server's model thread is held with the stream started but not yet
    stepped (the stream's hand-over and a wait on a gate are one job): no token and no done event
    can be made meanwhile, so the stream cannot end by itself, however fast it would have reached
    its end-of-text token (it once did, before this test held the thread: a small model decodes
    a whole poem between two polls of the page) and however busy the machine. The gate opens
    only once the server has seen the reader go, so the stream's first step is the one that ends it."""
    import threading

    model_thread = served.app.state.model_thread
    gate, held = threading.Event(), []

    def add_and_hold(stream):  # on the model thread: make the stream active, then wait, before any step
        def job():
            model_thread._take((None, (stream,), None))
            gate.wait()
        held.append((stream, model_thread.call(job)))

    monkeypatch.setattr(model_thread, "add", add_and_hold)
    page.goto(page.base + "#generate")
    page.wait_for_function("window.playground.ready === true")
    page.fill("#prompt", "The ")
    page.fill("#max_new_tokens", "100000")
    page.fill("#seed", "0")
    page.click("#go")
    try:
        assert wait_until(lambda: bool(held) and held[0][1].running(), 30), "the stream never reached the model thread"
        stream = held[0][0]
        assert model_thread.active == [stream]
        page.click("#stop")
        page.wait_for_function("document.querySelector('#status').dataset.state === 'stopped'")
        assert wait_until(stream.cancel.is_set, 30), "the server never saw the reader go"
    finally:
        gate.set()
    assert page.get_attribute("#status", "data-state") == "stopped"
    assert wait_until(lambda: active_streams(served) == 0, 30)
    assert page.locator("#output .tok").count() == 0  # the only step it took was the one that ended it


def _attention(page, text: str) -> dict:
    page.goto(page.base + "#attention")
    page.wait_for_function("window.playground.ready === true")
    page.fill("#att-text", text)
    with page.expect_response(lambda r: r.url.endswith("/api/attention")) as answer:
        page.click("#att-go")
    data = answer.value.json()
    page.wait_for_function(f"document.querySelectorAll('#att-maps figure.attmap').length === "
                           f"{data['n_layer'] * data['n_head']}")
    return data


def test_the_attention_tab_draws_every_layer_and_head(page, runs):
    from scratchlm.checkpoint import load_model
    from scratchlm.reference.numpy_gpt import forward_trace, params_from_state_dict

    text = "The king 明月"
    data = _attention(page, text)
    model, tokenizer, _ = load_model(runs / "mixed")
    L, H, T = model.config.n_layer, model.config.n_head, len(tokenizer.encode(text))
    panels = page.eval_on_selector_all("#att-maps figure.attmap", "fs => fs.map(f => ({layer: +f.dataset.layer, "
                                       "head: +f.dataset.head, w: f.querySelector('canvas').width}))")
    assert sorted((p["layer"], p["head"]) for p in panels) == [(l, h) for l in range(L) for h in range(H)]
    assert all(p["w"] > 0 for p in panels)
    weights = np.array(data["weights"])  # what the page drew from
    assert weights.shape == (L, H, T, T)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    trace = forward_trace(np.array(tokenizer.encode(text)),
                          params_from_state_dict({k: v.double() for k, v in model.state_dict().items()}), model.config)
    for layer in range(L):
        np.testing.assert_allclose(weights[layer], trace[f"h{layer}.weights"], atol=1e-5)
    # a panel's pixels: the diagonal's first cell (weight 1) darker than a masked cell above it
    dark, blank = page.evaluate("""() => {
        const c = document.querySelector('#att-maps figure.attmap canvas');
        const ctx = c.getContext('2d');
        const px = (x, y) => Array.from(ctx.getImageData(x, y, 1, 1).data).slice(0, 3).reduce((a, b) => a + b);
        const cell = c.width / %d;
        return [px(cell / 2, cell / 2), px(c.width - cell / 2, cell / 2)];
    }""" % T)
    assert dark < blank


def _fonts_holding(ch: str) -> str:
    return subprocess.run(["fc-list", f":charset={ord(ch):x}", "family"], capture_output=True, text=True).stdout


def _has_cjk_font() -> bool:
    return shutil.which("fc-list") is not None and bool(
        subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.strip())


@pytest.mark.skipif(not _has_cjk_font(), reason="no font with Chinese glyphs is installed (apt-get install "
                    "fonts-wqy-microhei; .ci/run does) or no fc-list to ask")
def test_a_chinese_prompt_renders_without_tofu(page, runs):
    """The fonts Chromium really used for each label and token (DevTools' getPlatformFontsForNode),
    and fontconfig's word that one of them holds each Chinese character drawn there."""
    PICTURES.mkdir(exist_ok=True)
    _generate(page, POEM[:5], 12, greedy=True)
    checked = _check_fonts(page, ("#output .prompt", "#output .tok"))
    page.screenshot(path=str(PICTURES / "playground-generate-zh.png"))
    _attention(page, POEM[:8])
    page.click("#att-maps figure.attmap[data-layer='0'][data-head='0']")
    page.wait_for_selector("#att-focus .att-label")
    checked += _check_fonts(page, ("#att-tokens .att-label", "#att-focus .att-label"))
    page.screenshot(path=str(PICTURES / "playground-attention-zh.png"), full_page=True)
    assert checked >= 5 + 8 * 3  # the prompt's 5, and 8 labels in each of three places


def _check_fonts(page, selectors) -> int:
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    checked = 0
    for selector in selectors:
        nodes = cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": selector})["nodeIds"]
        assert nodes, selector
        for node in nodes:
            html = cdp.send("DOM.getOuterHTML", {"nodeId": node})["outerHTML"]
            fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
            for ch in {c for c in html if 0x2e80 <= ord(c) <= 0x9fff or 0xff00 <= ord(c) <= 0xffef}:
                holders = _fonts_holding(ch)
                assert any(f["familyName"] in holders and f["glyphCount"] > 0 for f in fonts), (selector, ch, fonts)
                checked += html.count(ch)
    cdp.detach()
    return checked


def test_the_inside_tab_shows_the_parameter_table_and_the_walkthrough(page, runs):
    from scratchlm.checkpoint import load_model

    page.goto(page.base + "#inside")
    page.wait_for_selector("#inside-params tr.param")
    model, _, _ = load_model(runs / "mixed")
    names = page.eval_on_selector_all("#inside-params tr.param", "rows => rows.map(r => r.cells[0].textContent)")
    assert names == [n for n, _ in model.named_parameters()]
    total = page.inner_text("#inside-total")
    assert total.replace(",", "") == str(sum(p.numel() for p in model.parameters()))
    assert page.locator("#inside-trace tr.station").count() > 4
    page.wait_for_selector("#walk-stations button.station")
    page.click("#walk-stations button.station[data-key='h0.weights']")
    page.wait_for_selector("#walk-matrix table.matrix")
    cells = page.eval_on_selector_all("#walk-matrix table.matrix", "ts => ts.map(t => Array.from(t.querySelectorAll("
                                      "'tr')).map(r => Array.from(r.querySelectorAll('td')).map(c => c.textContent)).filter(r => r.length))")
    from scratchlm.inside.walkthrough import WALKTHROUGH_IDS, walkthrough

    expected = next(s.torch for s in walkthrough(WALKTHROUGH_IDS).steps if s.key == "h0.weights")  # (H, T, T)
    assert len(cells) == expected.shape[0]
    for head, table in enumerate(cells):
        shown = np.array([[float(c.replace("−", "-")) for c in row] for row in table])
        np.testing.assert_allclose(shown, expected[head], atol=5e-5)


def test_the_training_tab_follows_a_run_while_it_trains(page, runs):
    """A real `scratchlm train` in the runs folder: the curve grows and the page says it is
    training; when it ends, the page says so."""
    data = runs.parent / "text.txt"
    live = runs / "live"
    env = {**os.environ, "SCRATCHLM_CACHE": str(runs.parent / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "scratchlm", "train", "--data", str(data), "--tokenizer", "char",
                             "--max_steps", "400", "--batch_size", "2", "--log_interval", "1", "--eval_interval", "40",
                             "--eval_iters", "1", "--sample_interval", "40", "--sample_tokens", "20",
                             "--checkpoint_interval", "1000", "--threads", "1", "--progress", "quiet",
                             "--out_dir", str(live), "--data_cache", str(runs.parent / "data"),
                             *[a for k, v in TINY_MODEL.items() if k != "lm_head_bias" for a in (f"--{k}", str(v))]],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: (live / "metrics.jsonl").is_file(), 60), "the run never started"
        page.goto(page.base + "#training")
        page.reload()
        page.wait_for_function("window.playground.ready === true")
        page.select_option("#run", "live")
        page.wait_for_function("+document.querySelector('polyline.train-curve').dataset.points >= 5", timeout=60_000)
        assert page.get_attribute("#train-status", "data-training") == "true"
        first = int(page.get_attribute("polyline.train-curve", "data-points"))
        page.wait_for_function(f"+document.querySelector('polyline.train-curve').dataset.points > {first + 5}",
                               timeout=60_000)
        page.wait_for_function("+document.querySelector('polyline.val-curve').dataset.points >= 1", timeout=60_000)
        assert "tokens/s" in page.inner_text("#train-tps")
    finally:
        proc.wait(240)
    assert proc.returncode == 0, proc.stderr.read()
    page.wait_for_function("document.querySelector('#train-status').dataset.training === 'false'", timeout=30_000)
    records = [json.loads(line) for line in (live / "metrics.jsonl").read_text().splitlines()]
    train_points = len({r["step"] for r in records if r["event"] == "train"})
    page.wait_for_function(f"+document.querySelector('polyline.train-curve').dataset.points === {train_points}")
    sample = [r for r in records if r["event"] == "sample"][-1]["text"]
    assert sample.strip()[:10] in page.inner_text("#train-sample")


def test_an_empty_runs_folder_says_what_to_do_and_a_new_run_appears(browser, runs, tmp_path):
    """An empty folder: the page says how to make a run. A run copied in shows up in the picker
    without a reload (the page lists the runs again on focus and every few seconds), the hint
    goes, and it generates what the command line does."""
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    folder = tmp_path / "runs"
    folder.mkdir()
    with Served(RunLibrary(runs=folder), Limits()) as served:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{served.port}/")
        page.wait_for_function("window.playground && window.playground.ready === true")
        assert "no runs in the served folder yet" in page.inner_text("#page-error")
        assert page.locator("#run option").count() == 0
        shutil.copytree(runs / "mixed", folder / "fresh")
        page.evaluate("window.dispatchEvent(new Event('focus'))")
        page.wait_for_function("document.querySelector('#run').value === 'fresh'", timeout=15_000)
        assert page.is_hidden("#page-error")
        page.fill("#prompt", "ROMEO:")
        page.fill("#max_new_tokens", "20")
        page.set_checked("#greedy", True)
        page.click("#go")
        wait_generated(page)
        shown = page.eval_on_selector_all("#output .tok", "spans => spans.map(s => s.textContent).join('')")
        context.close()
    assert shown == cli_generate(folder / "fresh", "ROMEO:", "--greedy", "--max-new-tokens", "20")


FOREIGN_PAGE = """<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="form" method="POST" action="http://127.0.0.1:{port}/api/generate" enctype="text/plain" target="sink">
<input name='{{"run": "mixed", "prompt": "The ", "x": "' value='"}}'></form>
<script>
window.results = {{}};
const body = JSON.stringify({{run: "mixed", prompt: "The ", max_new_tokens: 5}});
fetch("http://127.0.0.1:{port}/api/generate", {{method: "POST", mode: "no-cors", body,
  headers: {{"Content-Type": "text/plain"}}}}).then(() => results.noCors = "sent", (e) => results.noCors = String(e));
fetch("http://127.0.0.1:{port}/api/runs").then((r) => r.text()).then((t) => results.read = t,
  (e) => results.read = "failed: " + e);
document.querySelector("iframe").addEventListener("load", () => results.form = "sent");
document.getElementById("form").submit();
</script></body></html>"""


def test_a_foreign_page_and_a_rebound_name_get_nothing(browser, served, monkeypatch):
    """In a browser: a page of another site posts a form (text/plain), a no-cors fetch and a
    reading fetch to the playground; a page whose name was rebound to 127.0.0.1 (Chromium's
    host resolver rules stand in for the DNS) reads /api/runs as its "own". The server refuses
    each (its guard is watched), and no stream starts. Chromium's own Private Network Access
    checks are turned off: the server must not rely on one browser's protection."""
    import scratchlm.serve.app as app_module
    from scratchlm.serve.guard import Guard

    refusals, made = [], []
    judge = Guard.refusal
    monkeypatch.setattr(Guard, "refusal", lambda self, scope: refusals.append(
        (scope["path"], judge(self, scope))) or refusals[-1][1])
    real = app_module.GenerationStream
    monkeypatch.setattr(app_module, "GenerationStream", lambda *a: made.append(1) or real(*a))
    port = served.port
    args = [*CHROMIUM_ARGS, "--host-resolver-rules=MAP attacker.test 127.0.0.1",
            "--disable-features=PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults,"
            "BlockInsecurePrivateNetworkRequests,LocalNetworkAccessChecks"]
    rebinding = browser.browser_type.launch(executable_path=CHROMIUM, args=args)  # a browser of its own: its flags
    try:
        page = rebinding.new_page()
        page.route("http://evil.test/", lambda route: route.fulfill(content_type="text/html",
                                                                     body=FOREIGN_PAGE.format(port=port)))
        page.goto("http://evil.test/")
        page.wait_for_function("['noCors', 'read', 'form'].every((k) => k in window.results)", timeout=30_000)
        results = page.evaluate("window.results")
        # rebinding: the attacker's page came from its own server; its scripts now reach ours by its name
        page.route(f"http://attacker.test:{port}/", lambda route: route.fulfill(content_type="text/html",
                                                                              body="<html><body>rebound</body></html>"))
        page.goto(f"http://attacker.test:{port}/")
        rebound = page.evaluate("fetch('/api/runs').then(async (r) => [r.status, await r.text()])")
        direct = page.goto(f"http://attacker.test:{port}/static/app.js")
    finally:
        rebinding.close()
    assert results["read"].startswith("failed") and "mixed" not in results["read"]
    assert rebound[0] == 403 and "mixed" not in rebound[1] and "this server answers to" in rebound[1]
    assert direct.status == 403
    assert made == []
    seen = {(path, None if why is None else why[0]) for path, why in refusals}
    assert {("/api/generate", 403), ("/api/runs", 403), ("/static/app.js", 403)} <= seen, refusals
    assert all(why is not None for _, why in refusals), refusals
    assert sum(path == "/api/generate" for path, _ in refusals) == 2  # the form and the no-cors fetch


def test_the_training_tab_reads_past_a_line_too_long_for_a_poll(browser, runs, tmp_path):
    """A 3 MB record between two train records: the page draws both points and says one line
    was skipped (it used to stop at that line for good)."""
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "long")
    lines = [{"event": "train", "step": 1, "loss": 4.0}, {"event": "sample", "step": 1, "text": "x" * 3_000_000},
             {"event": "train", "step": 2, "loss": 3.0}]
    (folder / "long" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    with Served(RunLibrary(runs=folder), Limits()) as served:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{served.port}/#training")
        page.wait_for_function("window.playground && window.playground.ready === true")
        page.wait_for_function("+document.querySelector('polyline.train-curve')?.dataset.points === 2", timeout=30_000)
        assert page.get_attribute("#train-status", "data-skipped") == "1"
        assert "1 line of the log skipped" in page.inner_text("#train-status")
        context.close()


def test_a_tang_run_opens_on_a_chinese_line_and_others_keep_their_own(browser, tmp_path, monkeypatch):
    """A run trained on --data tang puts 床前明月光 in the empty prompt box; choosing another run
    takes that suggestion back, and text the reader typed is never replaced."""
    from scratchlm.serve.library import RunLibrary
    from helpers import train_tiny_run

    checkout = tmp_path / "chinese-poetry" / "全唐诗"  # a checkout is read as it is (no hash to match)
    checkout.mkdir(parents=True)
    poems = [{"title": "靜夜思", "paragraphs": ["床前看月光，疑是地上霜。", "舉頭望山月，低頭思故鄉。"], "author": "李白"}]
    (checkout / "poet.tang.0.json").write_text(json.dumps(poems * 20, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setenv("SCRATCHLM_TANG_SOURCE", str(checkout.parent))
    runs = tmp_path / "runs"
    train_tiny_run(tmp_path, runs / "tang", data="tang-traditional", max_steps=2)
    train_tiny_run(tmp_path, runs / "plain", max_steps=2)
    with Served(RunLibrary(runs=runs)) as served:
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{served.port}/")
        page.wait_for_function("window.playground && window.playground.ready === true")
        page.select_option("#run", "tang")
        assert page.input_value("#prompt") == "床前明月光"
        page.select_option("#run", "plain")
        assert page.input_value("#prompt") == "" and page.get_attribute("#prompt", "placeholder") == "ROMEO:"
        page.fill("#prompt", "typed")
        page.select_option("#run", "tang")
        assert page.input_value("#prompt") == "typed"
        context.close()

"""The playground's Attention tab on a desktop (1280x800) and a phone (390x844, touch), in Debian's
Chromium (issue 34): the big map below the header and as wide as the screen, its cells by keyboard,
tap or pointer with positions named, a token's row in every head (openAttentionRow, called by the
Generate tab), axe-core on all of it; and POST /api/attention's "ids", its refusals included. Every
weight the page shows is checked against the NumPy reference's forward pass, not the server's."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from helpers import NEEDS_BROWSER, SCREENS, SERVE_MODEL, open_playground, press, Served, one_line_refusal, request, train_tiny_run, write_mixed_text

LONG = "ROMEO: my lord, the moon is bright. The king speaks"[:47]  # 47 tokens for a char tokenizer


@pytest.fixture(scope="module")
def folder(runs, tmp_path_factory):
    """`mixed` (context 32), and `long`: a briefly trained model with a context of 64 tokens."""
    base = tmp_path_factory.mktemp("attention-view")
    shutil.copytree(runs / "mixed", base / "runs" / "mixed")
    write_mixed_text(base / "text.txt")
    train_tiny_run(base, base / "runs" / "long", max_steps=2, checkpoint_interval=2,
                   model_overrides=dict(SERVE_MODEL, block_size=64))
    return base / "runs"


@pytest.fixture(scope="module")
def served_view(folder):
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=folder)) as s:
        yield s


def reference(run, ids) -> np.ndarray:
    """(L, H, T, T) attention weights from the NumPy reference's float64 forward pass."""
    from scratchlm.reference.numpy_gpt import forward_trace, params_from_state_dict
    from scratchlm.checkpoint import load_model

    model = load_model(run)[0]
    params = params_from_state_dict({k: v.double() for k, v in model.state_dict().items()})
    trace = forward_trace(np.array(ids), params, model.config)
    return np.stack([trace[f"h{layer}.weights"] for layer in range(model.config.n_layer)])


def encode(run, text: str) -> list[int]:
    from scratchlm.checkpoint import load_model

    return load_model(run)[1].encode(text)


# ------------------------------------------------------------------------------ the API: "ids"


def test_ids_are_an_alternative_to_text(served, runs):
    ids = encode(runs / "mixed", "月光 and the king")
    got, by_text = request(served.port, "POST", "/api/attention", {"run": "mixed", "text": "月光 and the king"})
    assert got == 200, by_text
    got, by_ids = request(served.port, "POST", "/api/attention", {"run": "mixed", "ids": ids})
    assert got == 200, by_ids
    assert by_ids["ids"] == ids and by_ids["labels"] == by_text["labels"] and by_ids["labels"][0] == "月"
    weights = np.array(by_ids["weights"])
    np.testing.assert_allclose(weights, reference(runs / "mixed", ids), atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    # ids the text cannot give: one token alone, and the highest id there is
    from scratchlm.checkpoint import load_model

    vocab = load_model(runs / "mixed")[0].config.vocab_size
    got, data = request(served.port, "POST", "/api/attention", {"run": "mixed", "ids": [vocab - 1, 0]})
    assert got == 200 and data["ids"] == [vocab - 1, 0]
    np.testing.assert_allclose(np.array(data["weights"]), reference(runs / "mixed", [vocab - 1, 0]), atol=1e-5)


@pytest.mark.parametrize("body, words", [
    ({"text": "the", "ids": [1, 2]}, "give either text (a string) or ids (a list of token ids), not both"),
    ({}, "give text (a string) or ids (a list of token ids)"),
    ({"ids": "1 2 3"}, "ids: expected list"),
    ({"ids": None}, "ids: expected list"),
    ({"ids": [1, "2"]}, "ids: expected a list of token ids (whole numbers)"),
    ({"ids": [1, True]}, "ids: expected a list of token ids (whole numbers)"),
    ({"ids": [1, 2.5]}, "ids: expected a list of token ids (whole numbers)"),
    ({"ids": [[1]]}, "ids: expected a list of token ids (whole numbers)"),
    ({"ids": []}, "ids: give 1 to 128 token ids, got 0"),
    ({"ids": [1] * 129}, "ids: give 1 to 128 token ids, got 129"),
    ({"ids": [1] * 33}, "ids: 33 tokens; the attention view takes at most 32 (the model's context is 32)"),
    ({"ids": [1, -1]}, "ids: token ids are 0..VMAX for this model, got -1"),
    ({"ids": [1, "VOCAB"]}, "ids: token ids are 0..VMAX for this model, got VOCAB"),
    ({"ids": [10**30]}, "ids: token ids are 0..VMAX for this model, got 100000000000000000000000"),
])
def test_bad_ids_get_one_error_line(served, runs, body, words):
    from scratchlm.checkpoint import load_model

    vocab = load_model(runs / "mixed")[0].config.vocab_size
    if body.get("ids") == [1, "VOCAB"]:
        body = {"ids": [1, vocab]}
    words = words.replace("VMAX", str(vocab - 1)).replace("VOCAB", str(vocab))
    status, answer = request(served.port, "POST", "/api/attention", {"run": "mixed", **body})
    one_line_refusal(status, answer, 400, words)


# ------------------------------------------------------------------------------ the page


@pytest.fixture(params=list(SCREENS))
def screen(request, browser, served_view):
    context, page = open_playground(browser, served_view.port, request.param)
    page.select_option("#run", "long")
    yield page
    context.close()
    assert page.errors == []


def _attention(page, text: str) -> dict:
    page.evaluate("location.hash = '#attention'")
    page.wait_for_selector("#tab-attention", state="visible")
    page.fill("#att-text", text)
    with page.expect_response(lambda r: r.url.endswith("/api/attention")) as answer:
        page.click("#att-go")
    data = answer.value.json()
    page.wait_for_function(f"document.querySelectorAll('#att-maps figure.attmap').length === "
                           f"{data['n_layer'] * data['n_head']}")
    return data


def _open_map(page, layer: int, head: int) -> None:
    """Open one head's big map as the screen's reader would: a tap, or Tab to it and Enter."""
    opener = f"#att-maps figure[data-layer='{layer}'][data-head='{head}'] .attmap-open"
    if page.screen == "phone":
        press(page, opener, True, then=None)
    else:
        page.focus("#att-text")
        for _ in range(50):  # Tab, as a keyboard would, until the map's button has the focus
            page.keyboard.press("Tab")
            if page.evaluate(f"document.activeElement === document.querySelector(\"{opener}\")"):
                break
        page.keyboard.press("Enter")
    page.wait_for_selector("#att-focus[open] .focus-map")


def _overlaps(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


@NEEDS_BROWSER
def test_the_big_map_stays_below_the_header_and_fits_the_screens_width(screen, folder):
    data = _attention(screen, LONG)
    assert len(data["ids"]) == 47
    _open_map(screen, 1, 0)
    width = screen.evaluate("window.innerWidth")
    for scroll in ("", "document.querySelector('#att-focus').scrollTop = 100000; window.scrollBy(0, 600)",
                   "window.scrollTo(0, 0)"):
        if scroll:
            screen.evaluate(f"() => {{ {scroll}; }}")
        header = screen.locator("header.top").bounding_box()
        for part in ("#att-focus-title", "#att-focus .close"):
            box = screen.locator(part).bounding_box()
            assert not _overlaps(box, header), (part, box, header, scroll)
            assert box["y"] >= 0 and box["x"] + box["width"] <= width, (part, box)
    sizes = screen.evaluate("""() => { const d = document.querySelector('#att-focus');
        const m = d.querySelector('.focus-map').getBoundingClientRect();
        return {scroll: d.scrollWidth, client: d.clientWidth, right: m.right, left: m.left,
                page: document.documentElement.scrollWidth}; }""")
    assert sizes["scroll"] <= sizes["client"] and sizes["page"] <= width, sizes  # no sideways scroll
    assert sizes["left"] >= 0 and sizes["right"] <= width, sizes
    # the sides: upright, horizontal text of at least 12 px (labels or, in narrow cells, positions)
    sides = screen.eval_on_selector_all("#att-focus .focus-keys > *, #att-focus .focus-queries > *", """ss =>
        ss.map(s => { const c = getComputedStyle(s);
                      return [c.writingMode, parseFloat(c.fontSize), c.transform, s.textContent]; })""")
    assert sides and all(mode == "horizontal-tb" and size >= 12 for mode, size, _, _ in sides), sides[:3]
    assert all("matrix(1, 0, 0, 1" in t or t == "none" for _, _, t, _ in sides)  # moved, never turned
    if screen.screen == "phone":  # 47 cells in 390 px: positions on the sides, tokens in the readout
        assert {text for _, _, _, text in sides} >= {"0", "10", "20", "30", "40"}
    screen.keyboard.press("Escape")
    screen.wait_for_selector("#att-focus", state="hidden")


@NEEDS_BROWSER
def test_cells_by_keyboard_name_their_positions_and_escape_gives_the_focus_back(screen, folder):
    data = _attention(screen, LONG[:20])
    T, labels = 20, data["labels"]
    want = reference(folder / "long", encode(folder / "long", LONG[:20]))
    _open_map(screen, 1, 1)
    assert screen.evaluate("document.activeElement.classList.contains('focus-map')")
    assert screen.get_attribute("#att-readout", "aria-live") == "polite"
    for key in ["Home"] + ["ArrowUp"] * 3 + ["ArrowRight"] * 2:
        screen.keyboard.press(key)
    i, j = T - 4, 2
    assert screen.inner_text("#att-readout") == \
        f"query {i} «{labels[i]}» → key {j} «{labels[j]}»: {want[1, 1, i, j]:.3f}"
    screen.keyboard.press("ArrowRight")  # past the diagonal: stays on what query i may see
    for _ in range(T):
        screen.keyboard.press("ArrowRight")
    assert screen.inner_text("#att-readout").startswith(f"query {i} «{labels[i]}» → key {i} «")
    cursor, canvas = (screen.locator(s).bounding_box() for s in ("#att-focus .focus-cursor", "#att-focus canvas"))
    cell = canvas["width"] / T
    assert cursor["x"] == pytest.approx(canvas["x"] + i * cell, abs=1.5)
    assert cursor["y"] == pytest.approx(canvas["y"] + i * cell, abs=1.5)
    screen.keyboard.press("Escape")
    screen.wait_for_selector("#att-focus", state="hidden")
    opener = "#att-maps figure[data-layer='1'][data-head='1'] .attmap-open"
    assert screen.evaluate(f"document.activeElement === document.querySelector(\"{opener}\")")


@NEEDS_BROWSER
def test_a_cell_pointed_at_or_tapped_says_which_and_the_words_fit_the_screen(screen, folder):
    data = _attention(screen, LONG[:12])
    labels = data["labels"]
    want = reference(folder / "long", encode(folder / "long", LONG[:12]))
    _open_map(screen, 0, 1)
    hint = screen.inner_text("#att-readout")
    assert hint.startswith("Tap a cell" if screen.screen == "phone" else "Point at a cell"), hint
    box = screen.locator("#att-focus canvas").bounding_box()
    cell = box["width"] / 12
    x, y = box["x"] + 3.5 * cell, box["y"] + 9.5 * cell  # query 9, key 3
    if screen.screen == "phone":
        screen.touchscreen.tap(x, y)
        assert screen.is_visible("#tab-attention .say-touch") and not screen.is_visible("#tab-attention .say-pointer")
    else:
        screen.mouse.move(x, y)
        assert screen.is_visible("#tab-attention .say-pointer") and not screen.is_visible("#tab-attention .say-touch")
    assert screen.inner_text("#att-readout") == \
        f"query 9 «{labels[9]}» → key 3 «{labels[3]}»: {want[0, 1, 9, 3]:.3f}"
    screen.click("#att-focus .close")
    screen.wait_for_selector("#att-focus", state="hidden")


def _row_lists(page) -> list[dict]:
    return page.eval_on_selector_all("#att-row section.att-head", """ss => ss.map(s => ({
        layer: +s.dataset.layer, head: +s.dataset.head,
        top: [...s.querySelectorAll('ol.att-top li')].map(li => [+li.dataset.key, li.textContent]),
        all: [...s.querySelectorAll('ol.att-all li')].map(li => [+li.dataset.key, +li.dataset.weight]) }))""")


@NEEDS_BROWSER
def test_open_attention_row_shows_a_tokens_row_in_every_head(screen, folder):
    """As the Generate tab's token popup calls it: ids, a position and a caption."""
    ids = encode(folder / "long", LONG[:30])
    want = reference(folder / "long", ids)
    position = 17
    screen.evaluate("([ids, position]) => openAttentionRow({ids, position, "
                    "caption: 'the token the model wrote at 17'})", [ids, position])
    screen.wait_for_selector("#att-row section.att-head")
    assert screen.evaluate("location.hash") == "#attention" and screen.is_visible("#tab-attention")
    assert screen.is_hidden("#tab-generate")
    labels = screen.evaluate("playground.attention.labels")
    assert screen.inner_text("#att-row-title") == \
        f"Query {position} «{labels[position]}»: where it looks, in every head"
    assert screen.evaluate("document.activeElement.id") == "att-row-title"
    assert "the token the model wrote at 17" in screen.inner_text("#att-row")
    lists = _row_lists(screen)
    L, H = want.shape[:2]
    assert sorted((r["layer"], r["head"]) for r in lists) == [(l, h) for l in range(L) for h in range(H)]
    for r in lists:
        row = want[r["layer"], r["head"], position]
        largest = np.sort(row[:position + 1])[::-1][:5]  # the five largest weights, largest first
        np.testing.assert_allclose(row[[k for k, _ in r["top"]]], largest, atol=1e-6)
        for key, text in r["top"]:
            assert text == f"{key} «{labels[key]}»{row[key]:.3f}"
        assert [k for k, _ in r["all"]] == list(range(position + 1))
        np.testing.assert_allclose([w for _, w in r["all"]], row[:position + 1], atol=1e-5)
        assert sum(w for _, w in r["all"]) == pytest.approx(1.0, abs=1e-5)
    marks = screen.eval_on_selector_all("#att-maps .attmap-open", """bs => bs.map(b => {
        const m = b.querySelector('.att-rowmark').getBoundingClientRect();
        const c = b.querySelector('canvas').getBoundingClientRect();
        return [(m.top - c.top) / c.height, m.height / c.height]; })""")
    for top, height in marks:  # the marked band is row 17 of 30
        assert top == pytest.approx(position / 30, abs=0.02) and height == pytest.approx(1 / 30, abs=0.02)
    # the row's chip is chosen; the arrows choose its neighbour, and every head's list follows
    assert screen.get_attribute(f"#att-tokens .att-label[data-index='{position}']", "aria-pressed") == "true"
    screen.focus(f"#att-tokens .att-label[data-index='{position}']")
    screen.keyboard.press("ArrowLeft")
    assert screen.inner_text("#att-row-title").startswith(f"Query {position - 1} «")
    assert [k for k, _ in _row_lists(screen)[0]["all"]] == list(range(position))
    # the big map opens on that row
    _open_map(screen, 0, 0)
    assert screen.evaluate("focusView.i") == position - 1


@NEEDS_BROWSER
def test_a_chip_tapped_or_clicked_chooses_the_row(screen, folder):
    data = _attention(screen, LONG[:8])
    want = reference(folder / "long", encode(folder / "long", LONG[:8]))
    chip = "#att-tokens .att-label[data-index='5']"
    press(screen, chip, screen.screen == "phone", then="#att-row section.att-head")
    for r in _row_lists(screen):
        np.testing.assert_allclose([w for _, w in r["all"]], want[r["layer"], r["head"], 5, :6], atol=1e-5)
    assert screen.eval_on_selector_all("#att-tokens .att-label", "cs => cs.filter(c => c.tabIndex === 0).length") == 1
    assert data["labels"][5] in screen.inner_text("#att-row-title")


@NEEDS_BROWSER
def test_errors_of_open_attention_row_show_on_the_tab(screen):
    screen.evaluate("openAttentionRow({ids: [1, 2, 3], position: 3, caption: ''})")
    screen.wait_for_selector("#att-error", state="visible")
    assert screen.inner_text("#att-error") == "Error: no token at position 3 of 3"
    screen.evaluate("openAttentionRow({ids: Array(65).fill(1), position: 3, caption: ''})")
    screen.wait_for_function("document.querySelector('#att-error').textContent.includes('at most 64')")
    assert screen.errors == ["Failed to load resource: the server responded with a status of 400 (Bad Request)"]
    screen.errors.clear()  # the browser's own line for the refused request, expected here


@NEEDS_BROWSER
def test_axe_finds_nothing_serious_on_the_attention_tab(screen, folder):
    """axe-core on the tab with a row shown, and again with the big map open (both screens)."""
    axe_sync = pytest.importorskip("axe_playwright_python.sync_playwright",
                                   reason="the dev extra installs axe-playwright-python")
    axe = axe_sync.Axe()
    ids = encode(folder / "long", LONG)
    screen.evaluate("([ids]) => openAttentionRow({ids, position: 40, caption: 'a token of the text'})", [ids])
    screen.wait_for_selector("#att-row section.att-head")
    screen.click("#att-row details summary")
    found = {}
    for state in ("row", "big map"):
        if state == "big map":
            _open_map(screen, 1, 1)
            screen.keyboard.press("ArrowUp")
        violations = axe.run(screen).response["violations"]
        found[state] = [f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']}" for v in violations
                        if v["impact"] in ("serious", "critical")]
    assert found == {"row": [], "big map": []}

"""Steps that drive the playground's page and wait on its own states, never on the clock: shared
by scripts/playground_pictures.py and the browser tests (tests/helpers.py loads this file).

A loaded two-core machine runs the browser, the server and the model on the same cores, so the
page can be seconds behind. Two things went wrong there before (issue 49):

- `#status[data-state=done]` is set when the done event is read, while the page is still reading
  the answer to its end and has yet to give Generate back (`startGeneration`'s `finally`). A step
  taken at once races those last updates. `wait_generated` waits for both: the done line and
  Generate enabled again.
- A step that presses a token found the page's popup over it: the pointer Playwright left on
  Generate ends up over the text as the answer grows, the page shows that token's popup as for
  any hover, and the popup can lie over the token to press. Playwright's tap then retries its
  hit checks until its 30-second default runs out. `press` moves the pointer off the page first
  (an unpinned popup closes once the pointer has left it), puts the element in the middle of
  the screen, waits until its box holds still for two frames and nothing lies over its middle,
  taps (or clicks) there, and reports what lay at that point if the page then does not answer.
"""

from __future__ import annotations

WAIT_MS = 120_000
"""The bound on a wait for a page's state (a generation done, a popup pinned): loose enough for a
loaded machine, and only a bound; every wait ends as soon as the state is there."""

SETTLED_POINT = """async ([element, limit]) => {
  const end = performance.now() + limit;
  element.scrollIntoView({ block: "center", inline: "nearest" });
  let last = "";
  for (;;) {
    await new Promise((frame) => requestAnimationFrame(frame));
    const box = element.getClientRects()[0];
    if (!box) return { missing: true };
    const x = box.left + box.width / 2, y = box.top + box.height / 2;
    const hit = document.elementFromPoint(x, y);
    const now = [box.left, box.top, box.width, box.height].join(" ");
    if (now === last && hit && element.contains(hit)) return { x, y };
    if (performance.now() > end) return { covered: hit ? hit.outerHTML.slice(0, 160) : "nothing", x, y };
    last = now;
  }
}"""
"""The middle of the element's first line box (a span split over two lines has one box per line)
once it is in the middle of the screen, the box is the same two frames running and the element
itself is what lies at that point; after `limit` ms, what lies there instead."""

AT_POINT = """([x, y]) => {
  const e = document.elementFromPoint(x, y);
  return e ? e.outerHTML.slice(0, 160) : "nothing";
}"""


def wait_generated(page, timeout: int = WAIT_MS) -> None:
    """Wait until the generation the page started is over: the done line shown and Generate back."""
    page.wait_for_selector("#status[data-state=done]", timeout=timeout)
    page.wait_for_selector("#go:enabled", timeout=timeout)


def press(page, selector: str, touch: bool, then: str | None, timeout: int = WAIT_MS) -> None:
    """Tap (`touch`: a phone) or click `selector`, then wait for the selector `then`, the state
    the page reaches when it has taken the press (None: the caller waits for it); a page that
    does not get there fails naming what lay under the point pressed."""
    page.mouse.move(0, 0)  # off the page's text: a popup the pointer opened closes once it has left
    element = page.wait_for_selector(selector, state="visible", timeout=timeout)
    point = page.evaluate(SETTLED_POINT, [element, timeout])
    if point.get("missing"):
        raise AssertionError(f"{selector}: no box on the page to press")
    if "covered" in point:
        raise AssertionError(f"{selector}: after {timeout} ms its middle ({point['x']:.0f}, {point['y']:.0f}) "
                             f"still lies under {point['covered']}")
    x, y = round(point["x"]), round(point["y"])
    if touch:
        page.touchscreen.tap(x, y)
    else:
        page.mouse.click(x, y)
    if then is None:
        return
    try:
        page.wait_for_selector(then, timeout=timeout)
    except Exception as exc:
        under = page.evaluate(AT_POINT, [x, y])
        raise AssertionError(f"pressed {selector} at ({x}, {y}), where the page has {under}; "
                             f"{then} did not follow ({type(exc).__name__})") from None

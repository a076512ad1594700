"""--data tang (scratchlm/text/tang.py) and the verse counts (scratchlm/text/verse.py), with no
network: a small tarball in the npm package's layout stands in for chinese-poetry 2.0.1, and a
stand-in `npm` on PATH packs it (or fails as npm fails offline)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import scratchlm.text.tang as tang
from scratchlm.data import DataConfig, prepare, read_split
from scratchlm.errors import UserError
from scratchlm.text.verse import count, count_all, rhyme_group

# (title, lines) in traditional characters, and the same by hand in simplified ones
POEMS = [
    ("靜夜思", ["床前看月光，疑是地上霜。", "舉頭望山月，低頭思故鄉。"]),
    ("登鸛雀樓", ["白日依山盡，黃河入海流。", "欲窮千里目，更上一層樓。"]),
    ("無題", []),  # no lines: left out
    ("春曉", ["春眠不覺曉，處處聞啼鳥。", "夜來風雨聲，花落知多少。"]),
    ("楓橋夜泊", ["月落烏啼霜滿天，江楓漁火對愁眠。", "姑蘇城外寒山寺，夜半鐘聲到客船。"]),
    ("關山月", ["明月出天山，蒼茫雲海間。"]),
    ("贈別（其二）", ["[多]情卻似總無情（一作：多情卻是），唯覺《樽》前笑不成。"]),  # an editor's note and marks
    ("殘篇", ["□燭有心還惜別，替人垂淚到天明。"]),  # a lost character: left out
    ("送別", ["山中相送罷，日暮掩柴扉。〖1〗", "春草明年綠，王孫歸不歸。", "（〖1〗此詩一作王維作，", "見《文苑英華》", "）。"]),
    ("□題", ["春眠不覺曉，處處聞啼鳥。"]),  # a lost character in the title: left out too
]
SIMPLIFIED = [
    "静夜思\n床前看月光，疑是地上霜。\n举头望山月，低头思故乡。\n",
    "登鹳雀楼\n白日依山尽，黄河入海流。\n欲穷千里目，更上一层楼。\n",
    "春晓\n春眠不觉晓，处处闻啼鸟。\n夜来风雨声，花落知多少。\n",
    "枫桥夜泊\n月落乌啼霜满天，江枫渔火对愁眠。\n姑苏城外寒山寺，夜半钟声到客船。\n",
    "关山月\n明月出天山，苍茫云海间。\n",
    "赠别\n多情却似总无情，唯觉樽前笑不成。\n",
    "送别\n山中相送罢，日暮掩柴扉。\n春草明年绿，王孙归不归。\n",  # a note over two lines, a footnote mark
]
TRADITIONAL = [f"{t}\n" + "\n".join(lines) + "\n" for t, lines in POEMS[:-5] if lines] + [
    "關山月\n明月出天山，蒼茫雲海間。\n", "贈別\n多情卻似總無情，唯覺樽前笑不成。\n",
    "送別\n山中相送罷，日暮掩柴扉。\n春草明年綠，王孫歸不歸。\n"]
FILES = {0: POEMS[:2], 2: POEMS[2:4], 10: POEMS[4:]}  # read in the order 0, 2, 10 (not 0, 10, 2)


def _poem(title: str, lines: list[str], i: int) -> dict:
    return {"author": "某", "paragraphs": lines, "title": title, "id": f"id-{i}"}


def _tarball(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("package/package.json", json.dumps({"name": "chinese-poetry", "version": "2.0.1"}).encode())
        for n in (10, 0, 2):  # stored out of order
            poems = [_poem(t, lines, i) for i, (t, lines) in enumerate(FILES[n])]
            add(f"package/dist/quantangshi/poet.tang.{n}.json", json.dumps(poems, ensure_ascii=False).encode())
        add("package/dist/songci/ci.song.0.json", json.dumps([_poem("不是唐詩", ["宋詞一句。"], 0)]).encode())
    return path


def _sri(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def _fake_npm(folder: Path, tarball: Path | None) -> Path:
    """A stand-in `npm` (a Python script): packs `tarball` into --pack-destination, growing its
    --cache as it goes, or (None) fails as npm does offline."""
    folder.mkdir(parents=True, exist_ok=True)
    npm = folder / "npm"
    if tarball is None:
        body = ('sys.stderr.write("npm error code ENOTFOUND\\nnpm error network request to '
                'https://registry.npmjs.org/chinese-poetry failed, reason: getaddrinfo ENOTFOUND registry.npmjs.org\\n")\n'
                "sys.exit(1)\n")
    else:
        body = ("args = sys.argv[1:]\n"
                "dest, cache = Path(args[args.index('--pack-destination') + 1]), Path(args[args.index('--cache') + 1])\n"
                "cache.mkdir(parents=True, exist_ok=True)\n"
                f"shutil.copyfile({str(tarball)!r}, cache / 'content')\n"
                f"shutil.copyfile({str(tarball)!r}, dest / 'chinese-poetry-2.0.1.tgz')\n")
    npm.write_text(f"#!{sys.executable}\nimport shutil, sys\nfrom pathlib import Path\n" + body)
    npm.chmod(0o755)
    return folder


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    """The stand-in tarball, with its hash as the pinned one, and an empty cache."""
    path = _tarball(tmp_path / "chinese-poetry-2.0.1.tgz")
    monkeypatch.setattr(tang, "INTEGRITY", _sri(path))
    monkeypatch.setenv("SCRATCHLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(tang.SOURCE_ENV, raising=False)
    return path


def _documents(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]


def _cache_files(tmp_path: Path) -> list[str]:
    root = tmp_path / "cache"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def test_the_tarball_named_in_the_environment_gives_every_poem_simplified_or_not(package, monkeypatch):
    monkeypatch.setenv(tang.SOURCE_ENV, str(package))
    assert _documents(tang.tang_corpus("tang")) == SIMPLIFIED
    assert _documents(tang.tang_corpus("tang-traditional")) == TRADITIONAL


def test_npm_packs_the_package_once_into_the_cache(package, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_npm(tmp_path / "bin", package)))
    corpus = tang.tang_corpus("tang")
    assert _documents(corpus) == SIMPLIFIED
    cached = tmp_path / "cache" / "corpora" / "chinese-poetry-2.0.1.tgz"
    assert cached.read_bytes() == package.read_bytes()
    files = _cache_files(tmp_path)
    assert files[:2] == ["corpora", "corpora/chinese-poetry-2.0.1.tgz"] and len(files) == 3
    assert files[2].startswith("corpora/tang-simplified-2.0.1-") and files[2].endswith(".jsonl")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no npm now: the cached tarball is enough
    assert _documents(tang.tang_corpus("tang-traditional")) == TRADITIONAL


def test_a_checkout_of_the_repository_is_read_as_it_is(package, tmp_path, monkeypatch):
    checkout = tmp_path / "chinese-poetry" / "全唐诗"
    checkout.mkdir(parents=True)
    for n, poems in FILES.items():
        (checkout / f"poet.tang.{n}.json").write_text(
            json.dumps([_poem(t, lines, i) for i, (t, lines) in enumerate(poems)], ensure_ascii=False), encoding="utf-8")
    monkeypatch.setenv(tang.SOURCE_ENV, str(checkout.parent))
    assert _documents(tang.tang_corpus("tang")) == SIMPLIFIED


def test_a_changed_checkout_builds_the_corpus_again(package, tmp_path, monkeypatch):
    """The cached corpus is keyed by its source: a checkout whose files change is read again."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    poem_file = checkout / "poet.tang.0.json"
    poem_file.write_text(json.dumps([_poem(*POEMS[0], 0)], ensure_ascii=False), encoding="utf-8")
    monkeypatch.setenv(tang.SOURCE_ENV, str(checkout))
    first = tang.tang_corpus("tang-traditional")
    assert _documents(first) == TRADITIONAL[:1]
    poem_file.write_text(json.dumps([_poem(*POEMS[0], 0), _poem(*POEMS[1], 1)], ensure_ascii=False), encoding="utf-8")
    os.utime(poem_file, ns=(1, 1))  # a different time as well as a different size
    again = tang.tang_corpus("tang-traditional")
    assert again != first and _documents(again) == TRADITIONAL[:2]


@pytest.mark.parametrize("route", ["environment", "npm"])
def test_one_changed_byte_fails_the_integrity_check_and_caches_nothing(package, tmp_path, monkeypatch, route):
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0x01
    changed = tmp_path / "changed" / package.name
    changed.parent.mkdir()
    changed.write_bytes(bytes(data))
    if route == "environment":
        monkeypatch.setenv(tang.SOURCE_ENV, str(changed))
    else:
        monkeypatch.setenv("PATH", str(_fake_npm(tmp_path / "bin", changed)))
    with pytest.raises(UserError, match="sha512 differs"):
        tang.tang_corpus("tang")
    assert [p for p in _cache_files(tmp_path) if p != "corpora"] == []


def _cli(tmp_path: Path, path_dirs: list[Path], *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache"),
           "PATH": os.pathsep.join(str(p) for p in [*path_dirs, Path(sys.executable).parent])}
    env.pop(tang.SOURCE_ENV, None)
    return subprocess.run([sys.executable, "-m", "scratchlm", *argv], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("npm", ["offline", "missing"])
def test_offline_or_without_npm_is_one_line_exit_2_and_nothing_half_written(tmp_path, npm):
    if npm == "missing" and any((Path(sys.executable).parent / name).exists() for name in ("npm", "npm.cmd")):
        pytest.skip("npm lies beside this Python, so it cannot be left off PATH")
    bins = [_fake_npm(tmp_path / "bin", None)] if npm == "offline" else []
    out = tmp_path / "prepared"
    done = _cli(tmp_path, bins, "prepare", "--data", "tang", "--out", str(out))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and tang.SOURCE_ENV in lines[0], done.stderr
    assert ("ENOTFOUND" in lines[0]) == (npm == "offline") and ("not installed" in lines[0]) == (npm == "missing")
    assert [p for p in _cache_files(tmp_path) if p != "corpora"] == []
    assert not out.exists() or not any(out.iterdir())


def test_without_opencc_the_simplified_corpus_says_so_and_the_traditional_one_works(package, monkeypatch):
    monkeypatch.setenv(tang.SOURCE_ENV, str(package))
    monkeypatch.setitem(sys.modules, "opencc", None)  # import opencc now fails
    with pytest.raises(UserError, match="pip install opencc"):
        tang.tang_corpus("tang")
    assert _documents(tang.tang_corpus("tang-traditional")) == TRADITIONAL


def test_the_tang_poems_preset_trains_on_it_and_continues_a_chinese_line(package, tmp_path, monkeypatch):
    """The preset as a user runs it (cut to a few steps and one small layer), then generate."""
    from helpers import cli_output

    monkeypatch.setenv(tang.SOURCE_ENV, str(package))
    run = tmp_path / "runs" / "tang"
    cli_output("train", "--preset", "tang-poems", "--out_dir", str(run), "--max_steps", "3", "--n_layer", "1",
               "--n_embd", "16", "--n_head", "2", "--block_size", "8", "--eval_interval", "0", "--sample_tokens", "0",
               "--progress", "quiet", "--threads", "1")
    text = cli_output("generate", "--checkpoint", str(run), "--prompt", "床前明月光", "--max-new-tokens", "12",
                      "--seed", "1")
    assert text.startswith("床前明月光") and set(text.strip()) <= set("".join(SIMPLIFIED))
    config = json.loads(next(run.glob("ckpt-*/config.json")).read_text())
    assert config["train"]["windows"] == "lines" and config["data"]["data"] == "tang"


def test_prepare_reads_the_built_corpus_as_documents(package, tmp_path, monkeypatch):
    monkeypatch.setenv(tang.SOURCE_ENV, str(package))
    out = prepare(DataConfig(data="tang", tokenizer="char", val_fraction=0.0), tmp_path / "out", progress=False)
    alphabet = sorted(set("".join(SIMPLIFIED)))
    bos = len(alphabet)
    expected = [t for doc in SIMPLIFIED for t in [bos, *[alphabet.index(c) for c in doc]]]
    assert np.asarray(read_split(out, "train")).tolist() == expected


# ----------------------------------------------------------------------------------------------
# verse counts, against poems counted by hand


def test_verse_counts_by_hand():
    text = ("静夜思\n床前看月光，疑是地上霜。\n举头望山月，低头思故乡。\n\n"  # a quatrain in form; 霜/乡 rhyme
            "春晓\n春眠不觉晓，处处闻啼鸟。\n夜来风雨，花落知多少。\n"  # 4 characters in a clause: not in form
            "题\n一二三四五，六七八九十。\n上下左右中，东西南北天。\n"  # in form; 十 (i) and 天 (an) do not rhyme
            "长\n白日依山尽，黄河入海流。\n欲穷千里目，更上一层楼。\n又上一层楼，再上一层楼。\n"  # 3 lines
            "又上一层楼，")  # the text stopped in this line: it is not counted
    c = count(text)
    assert (c.verse_lines, c.in_form, c.quatrains, c.rhymed) == (9, 8, 2, 1)
    assert rhyme_group("流") == rhyme_group("楼") == "ou" and rhyme_group("霜") == rhyme_group("乡") == "ang"
    whole = count_all(["春晓\n春眠不觉晓，处处闻啼鸟。\n夜来风雨声，花落知多少。"])  # a document: its last line counts
    assert (whole.verse_lines, whole.in_form, whole.quatrains, whole.rhymed) == (2, 2, 1, 1)

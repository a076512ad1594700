"""`scratchlm prepare` on a large corpus: wall time, peak memory, and tiktoken's batch encoder beside it.

    python benchmarks/bench_prepare_stream.py                  # about 1 GB of text (the issue's size)
    python benchmarks/bench_prepare_stream.py --size-mb 50     # a small run
    python benchmarks/bench_prepare_stream.py --workers 4 --repeat 3

Issue "Data at any size". A corpus of about --size-mb MB is generated, seeded, into a temporary
folder (no network): lines of the built-in Shakespeare plays shuffled into documents of varying
length, with lines of numbers, names, links and Chinese mixed in. It is written twice, as one
.txt file (one document) and as a .jsonl file (the same documents, one {"text": ...} a line).

For each file the real command runs in a fresh process,

    python -m scratchlm prepare --data FILE --tokenizer gpt2 --tokenizer-file gpt2.tiktoken --out OUT --workers W

(W: one per core unless --workers), and its wall clock (start-up, tokenizer, hashing, encoding,
splitting and writing: everything) and peak resident memory (ru_maxrss of that one process,
started by a small wrapper process; prepare's encoders are threads, so that is all of it) are
measured. The peer, in a fresh process of its own: tiktoken's `encode_ordinary_batch(batch,
num_threads=W)` with the same rank file, pattern and special token, over the same documents (the
.txt in pieces of about 1 MB cut at line ends where the ids do not change, the .jsonl's "text"
fields), in batches of about 32 MB; only the encoder calls are timed, not reading. MB/s is of the
documents' UTF-8 text for both (meta.json's input_bytes). Targets, for each file: prepare's peak
memory <= 1024 MB, and its MB/s >= 0.9x tiktoken's. Without ../shared/data/gpt2/gpt2.tiktoken
(or --tokenizer-file) the benchmark skips; nothing is downloaded. The same seed, plays and NumPy
give the same corpus, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RANK_FILE = ROOT.parent / "shared" / "data" / "gpt2" / "gpt2.tiktoken"
GOAL_PEAK_MB = 1024.0
GOAL_RATIO = 0.9
BLOCK_BYTES = 16 << 20  # the corpus is written this much at a time
PEER_PIECE_CHARS = 1 << 20  # the peer reads the .txt in pieces of about this many characters
PEER_BATCH_BYTES = 32 << 20  # ... and gives tiktoken batches of about this much text
KINDS = ("txt", "jsonl")

# --------------------------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------------------------

CHINESE = (
    "春眠不觉晓，处处闻啼鸟。", "夜来风雨声，花落知多少。", "床前明月光，疑是地上霜。", "举头望明月，低头思故乡。",
    "白日依山尽，黄河入海流。", "欲穷千里目，更上一层楼。", "今天天气很好，我们去公园散步吧。", "这本书我已经读了三遍。",
    "会议将在下午三点开始，请准时参加。", "他在北京工作了十年，后来回到了上海。", "学而时习之，不亦说乎？",
    "有朋自远方来，不亦乐乎？", "火车晚点了二十分钟。", "请把窗户关上，外面太冷了。", "她喜欢在周末画画和弹钢琴。",
    "这个城市的人口超过一千万。", "我们明天早上八点在车站见面。", "孩子们在操场上踢足球。", "图书馆每天开放到晚上十点。",
    "他的中文说得比以前流利多了。", "山不在高，有仙则名。", "水不在深，有龙则灵。", "数据越多，模型学得越好。",
    "人工智能正在改变我们的生活。", "这道菜有点辣，但是很好吃。", "路上小心，到家了给我打电话。",
)
NAMES = (
    "Amara Okafor", "Liu Wei", "Sofia Rossi", "Mateo García", "Aiko Tanaka", "Olusegun Adeyemi", "Ingrid Larsen",
    "Priya Raman", "Dmitri Volkov", "Fatima Zahra", "Kwame Mensah", "Chloé Martin", "Nguyen Van An", "Hannah Schmidt",
    "Rafael Souza", "Yusuf Demir", "Elena Popescu", "Kim Min-jun", "Aroha Ngata", "José Hernández", "Zeynep Kaya",
)
TEMPLATES = (
    "Invoice {a}: {b} units at ${c}.{d:02d} each, due {y}-{m:02d}-{day:02d}.",
    "{n1} wrote to {n2} on {y}-{m:02d}-{day:02d} about order #{a}.",
    "In {y}, the town counted {a:,} people and {b} horses.",
    "Call {n1} at +{b} {a} {c}, extension {d}.",
    "See https://example.org/{w}/{a}?page={d} for the full table ({c}% of {b}).",
    "{n1}: {a} points, {n2}: {b} points, after {d} rounds.",
    "def step_{d}(x): return x * {b} + {c}  # {n1}",
    "Temperature {d}.{m} C at {day:02d}:{m:02d}, wind {b} km/h, pressure {a} hPa.",
)
WEIGHTS = (0.86, 0.09, 0.05)  # shares of lines: Shakespeare, numbers and names, Chinese


def _shakespeare_lines() -> list[str]:
    from scratchlm.text.corpus import markdown_play_to_text, shakespeare_files

    lines: list[str] = []
    for path in shakespeare_files():
        lines += markdown_play_to_text(path.read_text(encoding="utf-8")).splitlines()
    return lines  # blank lines kept: they become the blank lines between speeches


def _variety_lines(rng: np.random.Generator, count: int) -> tuple[list[str], list[str]]:
    """(lines of numbers, names and links, Chinese lines), made from the templates and lists above."""
    words = [w.strip(".,;:!?'").lower() for w in "to be or not that is the question whether nobler mind".split()]
    r = rng.integers(0, 100_000, size=(count, 5))
    mixed = []
    for i in range(count):
        a, b, c, d, e = (int(x) for x in r[i])
        mixed.append(TEMPLATES[e % len(TEMPLATES)].format(
            a=a, b=b % 1000, c=c % 500, d=d % 100, y=1500 + a % 530, m=1 + b % 12, day=1 + c % 28,
            n1=NAMES[d % len(NAMES)], n2=NAMES[e % len(NAMES)], w=words[a % len(words)]))
    picks = rng.integers(0, len(CHINESE), size=(count // 4, 3))
    chinese = ["".join(CHINESE[j] for j in row[: 1 + row[0] % 3]) for row in picks]
    return mixed, chinese


class LinePool:
    """Every line the corpus is drawn from, in one array, and how to draw a block of them."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        groups = [_shakespeare_lines(), *_variety_lines(rng, 20_000)]
        self.lines = np.array([line for group in groups for line in group], dtype=object)
        self.sizes = np.array([len(g) for g in groups])
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.rng = rng

    def draw(self, count: int) -> np.ndarray:
        """`count` lines (an array of str objects), each group drawn with its share of WEIGHTS."""
        group = self.rng.choice(len(WEIGHTS), size=count, p=WEIGHTS)
        index = self.offsets[group] + (self.rng.random(count) * self.sizes[group]).astype(np.int64)
        return self.lines[index]


END = "\x00"  # marks the end of a document in a block (no line holds it; JSON writes it as \u0000)


def _block(pool: LinePool, lines: int) -> tuple[str, str, int]:
    """(text, JSONL, documents) of about `lines` lines cut into documents of 3 to 3,000 lines
    (log-uniform: mostly short, some long): the text holds them one after another, each followed
    by a blank line; the JSONL holds one {"text": document} a line. Made with a handful of
    whole-block string operations (no Python step per document), so a GB takes seconds."""
    lengths = np.exp(pool.rng.uniform(np.log(3), np.log(3000), size=lines // 3 + 1)).astype(np.int64)
    ends = np.cumsum(lengths)
    ends = np.append(ends[ends < lines], lines)
    marked = "\n".join(np.insert(pool.draw(lines), ends, END).tolist())  # doc1\n<END>\ndoc2\n<END>
    text = (marked + "\n").replace(END, "")
    body = json.dumps(marked[: -len("\n" + END)], ensure_ascii=False).replace("\\n\\u0000\\n", '"}\n{"text": "')
    return text, '{"text": ' + body + "}\n", len(ends)


def write_corpus(folder: Path, size_mb: float, seed: int = 0) -> dict[str, Any]:
    """corpus.txt (the documents one after another, one document) and corpus.jsonl (one
    {"text": document} a line) in `folder`, about size_mb MB each, the same for the same seed."""
    start = time.perf_counter()
    pool = LinePool(seed)
    mean_line = sum(len(s.encode("utf-8")) + 1 for s in pool.draw(100_000).tolist()) / 100_000
    txt, jsonl = folder / "corpus.txt", folder / "corpus.jsonl"
    want, written, documents = int(size_mb * 1e6), 0, 0
    with open(txt, "wb") as t, open(jsonl, "wb") as j:
        while written < want:
            text, lines_of_json, docs = _block(pool, max(3, int(min(BLOCK_BYTES, want - written) / mean_line)))
            written += t.write(text.encode("utf-8"))
            j.write(lines_of_json.encode("utf-8"))
            documents += docs
    return {"seed": seed, "documents": documents, "seconds": time.perf_counter() - start,
            "txt_mb": txt.stat().st_size / 1e6, "jsonl_mb": jsonl.stat().st_size / 1e6,
            "paths": {"txt": txt, "jsonl": jsonl}}


# --------------------------------------------------------------------------------------------
# Measuring one process
# --------------------------------------------------------------------------------------------


# A child's ru_maxrss starts from the RSS of the process that forked it (Linux keeps the high-water
# mark across exec), so the command is started by a small Python process of its own rather than by
# this one, which holds the corpus's lines: the wrapper times it and reports its peak.
WRAPPER = """import json, resource, subprocess, sys, time
start = time.perf_counter()
rc = subprocess.run(sys.argv[2:]).returncode
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
open(sys.argv[1], "w").write(json.dumps({"rc": rc, "wall_s": wall, "maxrss": peak}))
"""


def measure(cmd: list[str], log: Path) -> dict[str, Any]:
    """Run cmd in a fresh process (stdout and stderr to `log`): its wall clock, start-up
    included, and its peak RSS (the wrapper's RUSAGE_CHILDREN: that one process). Dirty pages
    are written out first, so a run does not pay for flushing what came before it."""
    report = log.with_suffix(".rusage.json")
    os.sync()  # the corpus just written (or the last run's output) is flushed first, not during this run
    with open(log, "wb") as out:
        subprocess.run([sys.executable, "-c", WRAPPER, str(report), *cmd], stdout=out, stderr=subprocess.STDOUT,
                       cwd=ROOT, check=True)
    r = json.loads(report.read_text())
    if r["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {r['rc']}):\n{log.read_text(errors='replace')[-4000:]}")
    scale = 1.0 if sys.platform == "darwin" else 1024.0  # ru_maxrss: bytes on macOS, KiB on Linux
    return {"wall_s": r["wall_s"], "peak_rss_mb": r["maxrss"] * scale / 1e6}


def _prepare_once(path: Path, rank_file: Path, workers: int, tmp: Path) -> dict[str, Any]:
    out = tmp / "out"
    cmd = [sys.executable, "-m", "scratchlm", "prepare", "--data", str(path), "--tokenizer", "gpt2",
           "--tokenizer-file", str(rank_file), "--out", str(out), "--workers", str(workers)]
    load = os.getloadavg()[0]
    run = measure(cmd, tmp / "prepare.log")
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    mb = meta["input_bytes"] / 1e6
    run.update(load=load, input_mb=mb, mb_per_s=mb / run["wall_s"], tokens=meta["train_tokens"] + meta["val_tokens"],
               documents=meta["documents"], workers=meta["workers"], inside_s=meta["seconds"])
    shutil.rmtree(out)  # a GB of input leaves half a GB of shards: gone before the next run
    return run


def _peer_once(kind: str, path: Path, rank_file: Path, workers: int, tmp: Path) -> dict[str, Any]:
    report = tmp / "peer.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", kind, str(path), "--tokenizer-file",
           str(rank_file), "--workers", str(workers), "--json", str(report)]
    load = os.getloadavg()[0]
    run = measure(cmd, tmp / "peer.log")
    peer = json.loads(report.read_text())
    mb = peer["text_bytes"] / 1e6
    run.update(load=load, input_mb=mb, encode_s=peer["encode_s"], mb_per_s=mb / peer["encode_s"],
               tokens=peer["tokens"], documents=peer["documents"])
    return run


# --------------------------------------------------------------------------------------------
# The peer (runs in its own process: --peer)
# --------------------------------------------------------------------------------------------


def _txt_pieces(path: Path) -> Iterator[str]:
    """The file in pieces of about PEER_PIECE_CHARS, each cut after a line end with a non-space
    character on both sides (where GPT-2's pre-tokenizer splits anyway: the ids are the same)."""
    rest = ""
    with open(path, encoding="utf-8", newline="") as f:
        while True:
            block = f.read(PEER_PIECE_CHARS)
            text = rest + block
            if not block:
                if text:
                    yield text
                return
            cut = text.rfind("\n", 0, len(text) - 1)
            while cut > 0 and (text[cut + 1].isspace() or text[cut - 1].isspace()):
                cut = text.rfind("\n", 0, cut)
            if cut <= 0:
                rest = text
                continue
            yield text[: cut + 1]
            rest = text[cut + 1:]


def _jsonl_texts(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)["text"]


def _batches(texts: Iterator[str]) -> Iterator[tuple[list[str], int]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        n = len(text.encode("utf-8"))
        batch.append(text)
        size += n
        if size >= PEER_BATCH_BYTES:
            yield batch, size
            batch, size = [], 0
    if batch:
        yield batch, size


def peer_encoding(rank_file: Path):
    """tiktoken's Encoding of GPT-2 from the offline rank file, as scratchlm's gpt2 tokenizer builds it."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    from scratchlm.text.tokenizer import EOS, GPT2_EOT_ID, GPT2_PATTERN

    ranks = load_tiktoken_bpe(str(rank_file))
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOS: GPT2_EOT_ID})


def peer(kind: str, path: Path, rank_file: Path, workers: int) -> dict[str, Any]:
    """Encode every document of the file with encode_ordinary_batch; only the encoder is timed."""
    enc = peer_encoding(rank_file)
    texts = _txt_pieces(path) if kind == "txt" else _jsonl_texts(path)
    seconds, text_bytes, tokens, documents = 0.0, 0, 0, 0
    for batch, size in _batches(texts):
        start = time.perf_counter()
        ids = enc.encode_ordinary_batch(batch, num_threads=workers)
        seconds += time.perf_counter() - start
        text_bytes += size
        tokens += sum(len(x) for x in ids)
        documents += len(batch) if kind == "jsonl" else 0
        del ids
    return {"encode_s": seconds, "text_bytes": text_bytes, "tokens": tokens, "documents": documents or 1}


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _summary(prepare: list[dict], tiktoken: list[dict]) -> dict[str, Any]:
    """Figures of one file over its runs: the median of the pairs' ratios (each pair measured
    back to back, as this shared machine's speed drifts by tens of percent over minutes), the
    largest peak for memory."""
    walls = [r["wall_s"] for r in prepare]
    ours = statistics.median(r["mb_per_s"] for r in prepare)
    theirs = statistics.median(r["mb_per_s"] for r in tiktoken)
    pair_ratios = [p["mb_per_s"] / t["mb_per_s"] for p, t in zip(prepare, tiktoken)]
    return {
        "input_mb": prepare[0]["input_mb"], "min_s": min(walls), "median_s": statistics.median(walls),
        "best_mb_per_s": max(r["mb_per_s"] for r in prepare), "median_mb_per_s": ours,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in prepare), "tokens": prepare[0]["tokens"],
        "documents": prepare[0]["documents"], "runs": prepare,
        "tiktoken": {"best_mb_per_s": max(r["mb_per_s"] for r in tiktoken), "median_mb_per_s": theirs,
                     "median_encode_s": statistics.median(r["encode_s"] for r in tiktoken),
                     "peak_rss_mb": max(r["peak_rss_mb"] for r in tiktoken), "tokens": tiktoken[0]["tokens"],
                     "runs": tiktoken},
        "ratio": statistics.median(pair_ratios), "pair_ratios": pair_ratios,
        # the same ids from both: prepare's count less one BOS per document is the peer's count
        "same_token_count": prepare[0]["tokens"] - prepare[0]["documents"] == tiktoken[0]["tokens"],
    }


def targets(files: dict[str, dict]) -> list[dict[str, Any]]:
    rows = []
    for kind, f in files.items():
        rows.append({"target": f"prepare-stream .{kind} peak memory, MB", "ratio": f["peak_rss_mb"],
                     "goal": GOAL_PEAK_MB, "met": f["peak_rss_mb"] <= GOAL_PEAK_MB, "lower_is_better": True})
        rows.append({"target": f"prepare-stream .{kind} MB/s / tiktoken encode_ordinary_batch MB/s", "ratio": f["ratio"],
                     "goal": GOAL_RATIO, "met": f["ratio"] >= GOAL_RATIO})
    return rows


def run(size_mb: float = 1000, repeats: int = 1, workers: int | None = None, tokenizer_file: str | None = None,
        seed: int = 0, echo: bool = False) -> dict[str, Any]:
    """All figures as a dict ({"skipped": why} without the rank file); `echo` prints as it goes."""
    rank_file = Path(tokenizer_file) if tokenizer_file else RANK_FILE
    if not rank_file.is_file():
        return {"skipped": f"no GPT-2 rank file at {rank_file} (the offline gpt2.tiktoken)", "targets": []}
    workers = workers or default_workers()
    say = print if echo else (lambda *a, **k: None)
    with tempfile.TemporaryDirectory(prefix="bench-prepare-stream-") as folder:
        tmp = Path(folder)
        corpus = write_corpus(tmp, size_mb, seed)
        say(f"corpus: {corpus['txt_mb']:.1f} MB .txt, {corpus['jsonl_mb']:.1f} MB .jsonl, {corpus['documents']:,} "
            f"documents, written in {corpus['seconds']:.1f} s")
        runs: dict[str, dict[str, list]] = {k: {"prepare": [], "tiktoken": []} for k in KINDS}
        for i in range(repeats):
            for kind in KINDS:
                path = corpus["paths"][kind]
                if i % 2 == 0:  # the order alternates, so a drift in the machine's speed favours neither
                    p = _prepare_once(path, rank_file, workers, tmp)
                    t = _peer_once(kind, path, rank_file, workers, tmp)
                else:
                    t = _peer_once(kind, path, rank_file, workers, tmp)
                    p = _prepare_once(path, rank_file, workers, tmp)
                runs[kind]["prepare"].append(p)
                runs[kind]["tiktoken"].append(t)
                say(f"[{i + 1}/{repeats}] .{kind}: prepare {p['wall_s']:.2f} s = {p['mb_per_s']:.1f} MB/s end to end, "
                    f"peak {p['peak_rss_mb']:.0f} MB (load {p['load']:.1f}); tiktoken {t['encode_s']:.2f} s = "
                    f"{t['mb_per_s']:.1f} MB/s encoding only, peak {t['peak_rss_mb']:.0f} MB")
    corpus.pop("paths")
    files = {kind: _summary(r["prepare"], r["tiktoken"]) for kind, r in runs.items()}
    return {
        "command": f"scratchlm prepare --data FILE --tokenizer gpt2 --tokenizer-file gpt2.tiktoken --workers {workers}",
        "size_mb": size_mb, "workers": workers, "repeats": repeats, "corpus": corpus, "files": files,
        "targets": targets(files),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=1000, help="corpus size in MB (default: 1000)")
    parser.add_argument("--workers", type=int, default=None, help="encoding threads of both (default: one per core)")
    parser.add_argument("--tokenizer-file", default=None, help=f"GPT-2 rank file (default: {RANK_FILE})")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (best and median reported)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus (default: 0)")
    parser.add_argument("--peer", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)  # the peer's process
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.peer:
        r = peer(args.peer[0], Path(args.peer[1]), Path(args.tokenizer_file or RANK_FILE), args.workers or default_workers())
        Path(args.json).write_text(json.dumps(r))
        return 0
    r = run(args.size_mb, args.repeat, args.workers, args.tokenizer_file, args.seed, echo=True)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str) + "\n")
    if "skipped" in r:
        print(f"skipped: {r['skipped']}")
        return 0
    for kind, f in r["files"].items():
        print(f".{kind} {f['input_mb']:.1f} MB: prepare median {f['median_s']:.2f} s, {f['median_mb_per_s']:.1f} MB/s, "
              f"peak {f['peak_rss_mb']:.0f} MB; tiktoken {f['tiktoken']['median_mb_per_s']:.1f} MB/s; "
              f"ratio {f['ratio']:.2f}" + ("" if f["same_token_count"] else " (token counts differ!)"))
    for t in r["targets"]:
        print(f"  {t['target']}: {t['ratio']:.2f} ({'<=' if t.get('lower_is_better') else '>='} {t['goal']}) "
              f"{'met' if t['met'] else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Re-run the commands whose output the docs quote, and compare what they print today with the
quotes: a change that moves a number fails here until the doc is re-run (`--write`).

What is checked, in README.md and every page under docs/ (English and Chinese):

- A ```bash block followed directly (nothing but blank lines between) by an output block (``` or
  ```text): the commands run, and the output block must be what they print.
- `<!-- check_docs: setup -->` on the line before a ```bash or ```python block: it runs too (its
  output is quoted nowhere, but later blocks read what it makes, or later numbers cite it).
- `<!-- check_docs: output of COMMAND -->` on the line before an output block: COMMAND runs
  and the block must be what it prints (for output quoted without its command beside it).
- `<!-- check_docs: numbers -->` on the line before a paragraph or a table: every decimal number
  in it (4.4022, 54,461, 2.57) must be one that a command of the page printed, at the precision
  written (2.57 stands for 2.5665 too).

The blocks of a page run in page order, in one scratch folder of their own (a later block reads
what an earlier one wrote), with `scratchlm` being this checkout's. An output block matches when
its lines come in order among the printed lines: a line ending in `...` stands for a printed
line that starts with what precedes it, and a line `...` alone (or a blank one) for any number
of printed lines.
A quoted line is looked for as printed first; failing that, the first printed line of its shape
(the same words, other numbers) is the one it should be. What differs from machine to machine
(torch - NumPy rounding differences, speeds, seconds) is compared by shape alone.

The numbers a training run prints after many steps depend on the machine's float arithmetic
(the order in which its matrix kernels add: AVX-512, AVX2 and Arm differ in the last bit, and
200 steps carry that into the third digit). `check_docs_machine.json` beside this script records
the arithmetic the docs were written with: a fingerprint of a short training done with torch
alone at one thread, the torch version and the CPU's vector features. On a machine with that
fingerprint every number must be the quoted one; on another, each printed number need only be
within 5% of the quoted one and lines without numbers (generated text) are not compared, and
the report says so. `--write` rewrites with this machine's numbers and records its fingerprint.

    python scripts/check_docs.py                    # every page; exit 1 listing each difference
    python scripts/check_docs.py docs/tour.md       # some pages
    python scripts/check_docs.py --write            # rewrite quoted lines and numbers with today's
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^\s*<!--\s*check_docs:\s*(setup|numbers|output of\s+(.+?))\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?(?![\w])")
DECIMAL = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w]|[.,]\d)|(?<![\w.,])-?\d+\.\d+(?![\w]|[.,]\d)")
VOLATILE = [re.compile(p) for p in (
    r"max \|torch - numpy\| = \S+", r"max diff \S+", r"[\d,.]+ tokens/s", r"MFU [\d.]+%", r"ETA \d+s",
    r"in [\d.]+ ?s\b", r"[\d.]+ ms\b",
)]
BLOCK_TIMEOUT_S = 600
MACHINE_FILE = Path(__file__).with_name("check_docs_machine.json")
TOLERANCE = 0.05
"""How far a number may be from the quoted one on a machine whose arithmetic is not the docs'."""


@dataclass
class Block:
    kind: str
    """bash, python, or out (a quoted output)."""
    start: int
    """Index of the opening fence's line."""
    end: int
    """Index of the closing fence's line."""
    text: list[str]
    run: bool = False
    command: str | None = None
    """For an output block quoted under a marker: the command that prints it."""
    indent: str = ""
    """The fence's indentation (a block inside a list item), taken off `text` and put back on a rewrite."""


@dataclass
class Page:
    path: Path
    lines: list[str]
    blocks: list[Block] = field(default_factory=list)
    numbers_at: list[int] = field(default_factory=list)
    """Line indexes of `numbers` markers."""


def read_page(path: Path) -> Page:
    page = Page(path, path.read_text(encoding="utf-8").splitlines())
    i, mark = 0, None
    while i < len(page.lines):
        line = page.lines[i]
        m, f = MARK.match(line), FENCE.match(line)
        if m:
            mark = m
            if m.group(1) == "numbers":
                page.numbers_at.append(i)
        elif f:
            j = i + 1
            while j < len(page.lines) and not re.match(r"^\s*```\s*$", page.lines[j]):
                j += 1
            lang = f.group(2)
            kind = "out" if lang in ("", "text") else lang
            indent = f.group(1)
            text = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in page.lines[i + 1 : j]]
            block = Block(kind, i, j, text, indent=indent)
            if mark is not None and mark.group(1) == "setup":
                block.run = True
            elif mark is not None and mark.group(2):
                block.command = mark.group(2).strip().strip("`")
            page.blocks.append(block)
            i, mark = j, None
        elif line.strip():
            mark = None
        i += 1
    for a, b in zip(page.blocks, page.blocks[1:]):
        if a.kind == "bash" and b.kind == "out" and not any(s.strip() for s in page.lines[a.end + 1 : b.start]):
            a.run = True
    return page


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def _shell(script: str, cwd: Path, env: dict[str, str], language: str = "bash") -> str:
    """What `script` prints on stdout; a failing command is an error naming it."""
    if language == "python":
        command = [sys.executable, "-c", script]
    else:
        lines = script.rstrip().splitlines()
        if lines and lines[-1].startswith("diff "):  # diff's status 1 says "they differ", which is the point
            script = "\n".join([*lines[:-1], lines[-1] + " || [ $? -eq 1 ]"])
        command = ["bash", "-c", "set -eo pipefail\nscratchlm() { \"$SCRATCHLM_PYTHON\" -m scratchlm \"$@\"; }\n"
                   + script]
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, encoding="utf-8",
                          timeout=BLOCK_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {script.strip().splitlines()[0]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def run_page(page: Page, cache: Path) -> dict[int, list[str]]:
    """{index of an output block: the lines its commands print}, plus under -1 everything the
    page's commands printed (what `numbers` markers are checked against). A page whose commands
    are those of a page already run (a Chinese twin) gets that page's output: nothing but the
    commands decides what they print."""
    runnable = [n for n, b in enumerate(page.blocks) if b.run or (b.kind == "out" and b.command)]
    key = tuple((page.blocks[n].kind, page.blocks[n].command or "\n".join(page.blocks[n].text)) for n in runnable)
    if key not in _RAN:
        _RAN[key] = _run_blocks([page.blocks[n] for n in runnable], cache)
    printed: dict[int, list[str]] = {-1: []}
    for n, out in zip(runnable, _RAN[key]):
        block = page.blocks[n]
        printed[-1] += out
        if block.command:
            printed[n] = out
        elif n + 1 < len(page.blocks) and page.blocks[n + 1].kind == "out" and page.blocks[n + 1].command is None:
            printed[n + 1] = out
    return printed


_RAN: dict[tuple, list[list[str]]] = {}
"""What each sequence of commands printed, in this process."""


def _run_blocks(blocks: list[Block], cache: Path) -> list[list[str]]:
    """What each block's commands print, run in order in one scratch folder of their own."""
    env = {**_env(), "SCRATCHLM_CACHE": str(cache)}
    env.pop("SCRATCHLM_TANG_SOURCE", None)
    outs = []
    with tempfile.TemporaryDirectory(prefix="check-docs-") as tmp:
        for block in blocks:
            if block.command:
                outs.append(_shell(block.command, Path(tmp), env).splitlines())
            else:
                outs.append(_shell("\n".join(block.text), Path(tmp), env, block.kind).splitlines())
    return outs


# --------------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------------


def _steady(line: str) -> str:
    """The line with what differs between machines reduced to its shape."""
    for pattern in VOLATILE:
        line = pattern.sub(lambda m: NUMBER.sub("#", m.group(0)), line)
    return line


def _same(quoted: str, printed: str, tolerance: float = 0.0) -> bool | None:
    """True: the quoted line is the printed one; False: the same line with other numbers; None:
    another line. A quoted line ending in `...` is compared with the printed line's start.
    With a tolerance, numbers that far apart (relative) count as the same."""
    q, p = _steady(quoted.rstrip()), _steady(printed.rstrip())
    excerpt = q.endswith("...")
    if excerpt:
        q = q[:-3].rstrip()
    q_parts, p_parts = _parts(q), _parts(p)  # text, number, text, ..., text
    if len(p_parts) < len(q_parts) or (not excerpt and len(p_parts) != len(q_parts)):
        return None
    texts_q, texts_p = q_parts[0::2], p_parts[0::2]
    if texts_q[:-1] != texts_p[: len(texts_q) - 1]:
        return None
    last_q, last_p = texts_q[-1], texts_p[len(texts_q) - 1]
    if not (last_p.startswith(last_q) if excerpt else last_p == last_q):
        return None
    return all(_near(q, p, tolerance) for q, p in zip(q_parts[1::2], p_parts[1 : len(q_parts) : 2]))


def _near(quoted: str, printed: str, tolerance: float) -> bool:
    if quoted == printed:
        return True
    if not tolerance:
        return False
    q, p = float(quoted.replace(",", "")), float(printed.replace(",", ""))
    return abs(q - p) <= tolerance * max(abs(q), abs(p))


def _parts(line: str) -> list[str]:
    return re.split(f"({NUMBER.pattern})", line)


@dataclass
class Difference:
    line: int
    """Line index in the page."""
    quoted: str
    printed: str | None
    """The printed line it should be, or None when nothing printed has its shape."""


def compare_block(block: Block, printed: list[str], tolerance: float = 0.0) -> tuple[list[Difference], int]:
    """The block's differences, and how many of its lines were not compared (with a tolerance,
    a quoted line without numbers that nothing printed matches: text a training run generated)."""
    differences, at, skipped = [], 0, 0
    for k, quoted in enumerate(block.text):
        if quoted.strip() in ("...", ""):  # a gap, or a blank line between quoted runs
            continue
        verdicts = [(j, _same(quoted, printed[j], tolerance)) for j in range(at, len(printed))]
        exact = next((j for j, v in verdicts if v), None)
        shaped = next((j for j, v in verdicts if v is False), None)  # the same line with other numbers
        if exact is not None:
            at = exact + 1
        elif shaped is not None:
            differences.append(Difference(block.start + 1 + k, quoted, block.indent + _rewrite(quoted, printed[shaped])))
            at = shaped + 1
        elif tolerance and not NUMBER.search(quoted):
            skipped += 1
        else:
            differences.append(Difference(block.start + 1 + k, quoted, None))
    return differences, skipped


def _rewrite(quoted: str, printed: str) -> str:
    """The quoted line with the printed line's numbers (an excerpt stays an excerpt)."""
    numbers = iter(NUMBER.findall(printed))
    return NUMBER.sub(lambda m: next(numbers, m.group(0)), quoted)


def _printed_values(lines: list[str]) -> list[str]:
    return [n for line in lines for n in NUMBER.findall(_strip_volatile(line))]


def _strip_volatile(line: str) -> str:
    for pattern in VOLATILE:
        line = pattern.sub("", line)
    return line


def _stands_for(written: str, value: str, tolerance: float = 0.0) -> bool:
    """Whether `written` (2.57, 54,461) is `value` (2.5665, 54461) at the precision written (or,
    with a tolerance, that close to it)."""
    w, v = written.replace(",", ""), value.replace(",", "")
    try:
        decimals = len(w.split(".")[1]) if "." in w else 0
        if round(float(v), decimals) == float(w) and ("." in w or "." not in v):
            return True
        return bool(tolerance) and _near(w, v, tolerance)
    except ValueError:
        return False


def check_numbers(page: Page, printed: list[str], tolerance: float = 0.0) -> list[Difference]:
    """Every decimal number in the paragraph or table after each `numbers` marker, among the printed ones."""
    values = _printed_values(printed)
    differences = []
    for at in page.numbers_at:
        i = at + 1
        while i < len(page.lines) and page.lines[i].strip():
            for written in DECIMAL.findall(re.sub(r"`[^`]*`", "", page.lines[i])):
                if not any(_stands_for(written, v, tolerance) for v in values):
                    differences.append(Difference(i, written, None))
            i += 1
    return differences


# --------------------------------------------------------------------------------------------
# The machine's arithmetic
# --------------------------------------------------------------------------------------------

PROBE = """
import hashlib, platform, torch
import torch.nn.functional as F
from scratchlm.machine.cpu import cpu_flags
torch.manual_seed(0)
torch.set_num_threads(1)
V, C, T, B = 65, 32, 32, 8  # the experiments' character models: width 32, 32 positions, batch 8
shapes = [(V, C), (3 * C, C), (C, C), (4 * C, C), (C, 4 * C), (V, C)]
w = [torch.nn.Parameter(torch.randn(s) * 0.2) for s in shapes]
opt = torch.optim.AdamW(w, lr=0.03, weight_decay=0.1)
idx = torch.randint(0, V, (B, T + 1))
mask = torch.ones(T, T, dtype=torch.bool).tril()
for _ in range(20):
    x = F.layer_norm(w[0][idx[:, :-1]], (C,))
    q, k, v = F.linear(x, w[1]).view(B, T, 3, 4, C // 4).permute(2, 0, 3, 1, 4)
    a = (q @ k.transpose(-1, -2) / (C // 4) ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
    x = x + F.linear((a @ v).transpose(1, 2).reshape(B, T, C), w[2])
    x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (C,)), w[3])), w[4])
    x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
    loss = F.cross_entropy(F.linear(x, w[5]).view(-1, V), idx[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
vector = sorted(cpu_flags() & {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                         "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve", "sve2", "bf16", "i8mm"})
digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in w))
digest.update(f"{torch.__version__} {platform.machine()} {vector}".encode())
print(digest.hexdigest()[:16])
print(f"{platform.machine()}, {' '.join(vector) or 'no vector flags read'}, torch {torch.__version__}")
"""


@dataclass
class Machine:
    fingerprint: str
    description: str


def this_machine(env: dict[str, str]) -> Machine:
    """The fingerprint of this machine's float arithmetic (PROBE, run as the docs' commands run)."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    fingerprint, description = out.splitlines()[:2]
    return Machine(fingerprint, description)


def docs_machine() -> Machine | None:
    """The machine the docs' numbers were written on, as `--write` recorded it."""
    try:
        data = json.loads(MACHINE_FILE.read_text(encoding="utf-8"))
        return Machine(data["fingerprint"], data["description"])
    except (OSError, ValueError, KeyError):
        return None


def record_machine(machine: Machine) -> None:
    data = {"fingerprint": machine.fingerprint, "description": machine.description,
            "about": "the float arithmetic the docs' quoted numbers were printed with (scripts/check_docs.py)"}
    MACHINE_FILE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _env() -> dict[str, str]:
    """The environment the docs' commands (and the probe) run in."""
    return {**os.environ, "SCRATCHLM_PYTHON": sys.executable, "PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(ROOT),
            "COLUMNS": "100", "NO_COLOR": "1"}


# --------------------------------------------------------------------------------------------
# The pages
# --------------------------------------------------------------------------------------------


def pages(paths: list[str]) -> list[Path]:
    if paths:
        return [Path(p).resolve() for p in paths]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def check_page(path: Path, cache: Path, write: bool, tolerance: float = 0.0) -> tuple[list[str], int]:
    """The page's differences, one line each (rewritten in place with write), and how many of
    its quoted lines were not compared."""
    page = read_page(path)
    if not any(b.run or b.command for b in page.blocks) and not page.numbers_at:
        return [], 0
    try:
        printed = run_page(page, cache)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return [f"{_name(path)}: a command failed: {exc}"], 0
    differences, skipped = [], 0
    for n, lines in printed.items():
        if n >= 0:
            found, unseen = compare_block(page.blocks[n], lines, tolerance)
            differences, skipped = differences + found, skipped + unseen
    numbers = check_numbers(page, printed[-1], tolerance)
    if write:
        for d in differences:
            if d.printed is not None:
                page.lines[d.line] = d.printed
        path.write_text("\n".join(page.lines) + "\n", encoding="utf-8")
    report = []
    for d in differences:
        if d.printed is None:
            report.append(f"{_name(path)}:{d.line + 1}: quoted, but nothing printed has this shape: {d.quoted.strip()}")
        elif not write:
            report.append(f"{_name(path)}:{d.line + 1}: quoted {d.quoted.strip()!r}, printed today {d.printed.strip()!r}")
    report += [f"{_name(path)}:{d.line + 1}: the number {d.quoted} is not one the page's commands printed"
               for d in numbers]
    return report, skipped


def _name(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", help="Markdown files (default: README.md and docs/)")
    parser.add_argument("--write", action="store_true", help="rewrite quoted lines with what is printed today")
    args = parser.parse_args(argv)
    here, recorded = this_machine(_env()), docs_machine()
    same = recorded is not None and recorded.fingerprint == here.fingerprint
    if args.write and args.pages and not same:
        print(f"check_docs: this machine ({here.description}) adds differently from the one the docs were written on; "
              "--write rewrites every page or none here: run it without page names", file=sys.stderr)
        return 2
    tolerance = 0.0 if same or args.write else TOLERANCE
    cache = Path(tempfile.mkdtemp(prefix="check-docs-cache-"))
    try:
        report, skipped = [], 0
        for path in pages(args.pages):
            found, unseen = check_page(path, cache, args.write, tolerance)
            report, skipped = report + found, skipped + unseen
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if args.write and not args.pages:
        record_machine(here)
    for line in report:
        print(line)
    if tolerance:
        written_on = f"{recorded.description} ({recorded.fingerprint})" if recorded else "a machine not recorded"
        print(f"check_docs: the docs' numbers were printed on {written_on}; this machine, {here.description} "
              f"({here.fingerprint}), adds differently: numbers compared within {TOLERANCE:.0%}, "
              f"{skipped} quoted line(s) without numbers not compared")
    if report:
        print(f"check_docs: {len(report)} difference(s); re-run the commands (python scripts/check_docs.py --write) "
              "and read what changed", file=sys.stderr)
        return 1
    print("check_docs: every quoted output and number matches what the commands print today")
    return 0


if __name__ == "__main__":
    sys.exit(main())

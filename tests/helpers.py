"""Helpers the test files share; tests/ is on sys.path under pytest, so a test file says
`from helpers import ...`. No test file imports another (tests/test_layout.py checks it).
Fixtures live in conftest.py.

Sections: tiny corpora and runs; files on disk; the NumPy reference's model variants; the
playground (`scratchlm serve`) in this process; the command line's bad-input cases; generation (a
tiny model, the plain loop of station 19 written out independently, two stand-in tokenizers, the
model on bfloat16-rounded weights).
"""

from __future__ import annotations

import hashlib
import http.client
import itertools
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from scratchlm.model.config import ACTIVATIONS, NORM_POSITIONS, NORMS, POS_EMBEDDINGS, GPTConfig
from scratchlm.model.gpt import GPT

from cli_forks import Forker


# ------------------------------------------------------------------------------ tiny corpora and runs

TINY_MODEL = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, dropout=0.0, pos_embedding="rope", lm_head_bias=False)
WORDS = "the a king queen speaks runs to of and in my thy lord love night day sword crown".split()


def write_text(path: Path, n_lines: int = 200, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "." for _ in range(n_lines)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_tiny_run(base: Path, out_dir: Path, **overrides) -> Path:
    """A 4-step run of a 1-layer model on a small char corpus (a checkpoint at steps 2 and 4)."""
    from scratchlm.training.train import TrainConfig, train

    data = base / "text.txt"
    if not data.exists():
        write_text(data)
    threads, cache = torch.get_num_threads(), os.environ.get("SCRATCHLM_CACHE")
    os.environ["SCRATCHLM_CACHE"] = str(base / "cache")  # the CPU peak probe's cache, not the user's home
    try:
        train(TrainConfig(**{
            **dict(data=str(data), tokenizer="char", batch_size=4, max_steps=4, lr=3e-3, warmup_steps=1,
                   eval_interval=0, eval_iters=1, log_interval=1, checkpoint_interval=2, sample_tokens=0,
                   progress="quiet", out_dir=str(out_dir), data_cache=str(base / "data"), threads=1,
                   model_overrides=TINY_MODEL),
            **overrides}))
    finally:
        torch.set_num_threads(threads)
        if cache is None:
            os.environ.pop("SCRATCHLM_CACHE", None)
        else:
            os.environ["SCRATCHLM_CACHE"] = cache
    return out_dir


def tree_hashes(folder: Path) -> dict[str, str]:
    """Every path under folder: a file's sha256, a folder's mark, a link's target."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        elif not p.is_file():  # a FIFO: reading it would wait for a writer
            out[rel] = "special"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ------------------------------------------------------------------------------ files on disk


def write_file(path: Path, text: str) -> Path:
    """path, holding text (UTF-8); its folders are made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def file_snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------ the NumPy reference's model variants
# (tests/test_reference.py and tests/test_backward.py run every combination GPTConfig allows)

V, T, B = 11, 6, 2  # the variant models' vocabulary, context and batch

BIASES = {
    "bias": dict(qkv_bias=True, proj_bias=True, mlp_bias=True, lm_head_bias=True),
    "nobias": dict(qkv_bias=False, proj_bias=False, mlp_bias=False, lm_head_bias=False),
}
VARIANTS = list(itertools.product(POS_EMBEDDINGS, NORMS, ACTIVATIONS, NORM_POSITIONS, (False, True), BIASES))


def variant_id(v) -> str:
    pos, norm, act, where, tie, bias = v
    return f"{pos}-{norm}-{act}-{where}-{'tied' if tie else 'untied'}-{bias}"


def variant_config(pos="learned", norm="layernorm", act="relu", where="pre", tie=False, bias="bias", **extra) -> GPTConfig:
    return GPTConfig(
        vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=8, pos_embedding=pos, norm=norm,
        activation=act, norm_position=where, tie_weights=tie, **BIASES[bias], **extra,
    )


def perturbed_model(cfg: GPTConfig, dtype: torch.dtype, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # a tied matrix is one parameter, perturbed once
            p.add_(0.3 * torch.randn_like(p))
    if dtype == torch.float64:
        model = model.double()
    return model


def ids_and_targets(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[0, -2:] = -100  # padding-style targets that the loss must leave out
    targets[1, 0] = -100
    return ids, targets


# ------------------------------------------------------------------------------ the playground in this process

JSON = {"Content-Type": "application/json"}
POEM = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
SERVE_MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.0, pos_embedding="rope", lm_head_bias=False)


def write_mixed_text(path: Path) -> Path:
    """English and Chinese lines, so the char tokenizer knows both scripts."""
    lines = []
    for i in range(120):
        lines.append(["The king speaks to the queen of the night.", POEM, "ROMEO: my lord, the moon is bright.",
                      "月光 and moonlight are the same light."][i % 4])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_serve_run(base: Path, out_dir: Path) -> Path:
    write_mixed_text(base / "text.txt")
    return train_tiny_run(base, out_dir, max_steps=40, checkpoint_interval=40, model_overrides=SERVE_MODEL)


CHROMIUM = os.environ.get("SCRATCHLM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
try:
    import playwright.sync_api as pw
except ImportError:  # pragma: no cover - the dev extra installs it
    pw = None
NEEDS_BROWSER = pytest.mark.skipif(
    CHROMIUM is None or pw is None,
    reason="browser tests need Chromium (apt-get install chromium) and playwright (pip install -e '.[dev]')")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
SCREENS = {"desktop": dict(viewport={"width": 1280, "height": 800}),
           "phone": dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)}
"""The two screens the playground is tested on (issue 34): a desktop, and a touch phone."""


def _page_steps():
    """scripts/page_steps.py, the page's own states waited on (shared with the pictures script)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("page_steps", Path(__file__).resolve().parent.parent / "scripts"
                                                  / "page_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_steps = _page_steps()
WAIT_MS, press, wait_generated = _steps.WAIT_MS, _steps.press, _steps.wait_generated


def open_playground(browser, port: int, screen: str, tab: str = "generate", console: bool = True):
    """(context, page): the playground on `port` at one of SCREENS, opened on `tab` and ready. The
    page's script errors (and, with `console`, its console errors) gather in page.errors;
    page.screen names the screen."""
    context = browser.new_context(**SCREENS[screen])
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    if console:
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.screen = screen
    page.goto(f"http://127.0.0.1:{port}/#{tab}")
    page.wait_for_function("window.playground && window.playground.ready === true")
    return context, page


def parse_sse(text: str) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a Server-Sent Events answer ("event: NAME\ndata: JSON\n\n")."""
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.split("\n"))
            events.append((fields["event"], json.loads(fields["data"])))
    return events


class Served:
    """A uvicorn server in a thread of this process, on a free port of `host` (loopback unless told)."""

    def __init__(self, library, limits=None, host: str = "127.0.0.1"):
        import uvicorn

        from scratchlm.serve.app import Limits, create_app, server_config
        from scratchlm.serve.cli import _bind
        from scratchlm.serve.guard import local_names

        self.app = create_app(library, limits or Limits(), names=tuple(local_names(host)))  # as the command does
        self.sock = _bind(host, 0)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(server_config(self.app, limits or Limits(), self.sock))  # the command's settings
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "Served":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def request(port: int, method: str, path: str, body=None, raw: bytes | None = None, timeout: float = 120):
    """(status, parsed JSON or text) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    return answer(conn)


def answer(conn: http.client.HTTPConnection) -> tuple[int, object]:
    """(status, parsed JSON or text) of the response on `conn`, which is then closed."""
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", "replace")
    conn.close()
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def cli_generate(run: Path, prompt: str, *flags: str) -> str:
    """What `scratchlm generate ... --no-echo` prints, run in this process (no second torch import)."""
    out = cli_output("generate", "--checkpoint", str(run), "--prompt", prompt, "--no-echo", *flags)
    assert out.endswith("\n")
    return out[:-1]


def cli_output(*argv: str) -> str:
    """What `scratchlm ARGV...` prints, run in this process (no second torch import); it must exit 0."""
    import contextlib
    import io

    from scratchlm.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def active_streams(served: "Served") -> int:
    """Streams the server's model thread is still stepping."""
    return len(served.app.state.model_thread.active)


def wait_until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def start_serve(*args: str, cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "scratchlm", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    line = proc.stdout.readline()
    return proc, line


def raw(port: int, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, object]:
    """(status, parsed JSON or text) of one request sent with exactly these headers (Host too)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
        conn.putheader(name, value)
    if body is not None:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    return answer(conn)


def one_line_refusal(status: int, answer: object, expected: int, words: str) -> None:
    assert status == expected, (status, answer)
    assert isinstance(answer, dict) and words in answer["error"] and "\n" not in answer["error"], answer
    assert len(answer["error"]) < 200


# ------------------------------------------------------------------------------ the command line's bad-input cases
# (tests/test_cli_bad_input.py: each case a real `python -m scratchlm` process forked from one that
# imported torch once, tests/cli_forks.py)


def gpt2_state(vocab: int = 50, positions: int = 16, c: int = 16, layers: int = 1) -> dict[str, torch.Tensor]:
    """Random weights under GPT-2's names and shapes (Conv1D matrices are (in, out))."""
    g = torch.Generator().manual_seed(0)
    shapes = {"transformer.wte.weight": (vocab, c), "transformer.wpe.weight": (positions, c),
              "transformer.ln_f.weight": (c,), "transformer.ln_f.bias": (c,), "lm_head.weight": (vocab, c)}
    for i in range(layers):
        h = f"transformer.h.{i}."
        shapes.update({h + "ln_1.weight": (c,), h + "ln_1.bias": (c,), h + "ln_2.weight": (c,), h + "ln_2.bias": (c,),
                       h + "attn.c_attn.weight": (c, 3 * c), h + "attn.c_attn.bias": (3 * c,),
                       h + "attn.c_proj.weight": (c, c), h + "attn.c_proj.bias": (c,),
                       h + "mlp.c_fc.weight": (c, 4 * c), h + "mlp.c_fc.bias": (4 * c,),
                       h + "mlp.c_proj.weight": (4 * c, c), h + "mlp.c_proj.bias": (c,)})
    return {name: 0.02 * torch.randn(shape, generator=g) for name, shape in shapes.items()}


def hf_dir(config: dict | str | None, weights: str = "safetensors", shape_bug: bool = False):
    """A small GPT-2 directory as save_pretrained writes it: config.json as given, random weights."""
    def setup(d: Path, run: Path) -> None:
        hf = d / "hf"
        hf.mkdir()
        base = dict(model_type="gpt2", vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                    tie_word_embeddings=False)
        if config is not None:
            text = config if isinstance(config, str) else json.dumps({**base, **config})
            (hf / "config.json").write_text(text)
        if weights == "none":
            return
        from safetensors.torch import save_file

        state = gpt2_state()
        if shape_bug:
            state["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(16, 32)  # GPT-2 needs (16, 64)
        save_file(state, str(hf / "model.safetensors"), metadata={"format": "pt"})
    return setup


@dataclass
class Case:
    name: str
    argv: list[str]
    """After `python -m scratchlm`; {d} is the case folder, {run} its copy of the tiny run."""
    words: list[str]
    """Each must appear in the error line (what is wrong, and where)."""
    setup: Callable[[Path, Path], None] = field(default=lambda d, run: None)
    debug: bool = False
    """Run with --debug: a traceback ending in the same error instead of one line."""


@dataclass
class Outcome:
    code: int
    stderr: str
    before: dict
    after: dict


def run_case(case: Case, d: Path, run: Path, cache: Path, forker: Forker) -> Outcome:
    d.mkdir()
    case.setup(d, run)
    before = tree_hashes(d)
    argv = [a.format(d=d) for a in case.argv]
    env = {**os.environ, "SCRATCHLM_CACHE": str(cache)}  # warnings shown: they would be more stderr lines
    err = d.with_name(d.name + ".stderr")  # beside the case's folder, not in it
    code = forker.run([*(["--debug"] if case.debug else []), *argv], d, env, err, d.with_name(d.name + ".stdout"))
    return Outcome(code, err.read_text(encoding="utf-8"), before, tree_hashes(d))  # strict, as text=True was


def run_all(cases: list[Case], run: Path, root: Path, cache: Path) -> dict[str, Outcome]:
    forkers = queue.Queue()
    for _ in range(2):
        forkers.put(Forker())

    def one(i: int, case: Case) -> Outcome:
        forker = forkers.get()
        try:
            return run_case(case, root / f"case{i:02d}", run, cache, forker)
        finally:
            forkers.put(forker)

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {c.name: pool.submit(one, i, c) for i, c in enumerate(cases)}
            results = {name: f.result() for name, f in futures.items()}
    finally:
        while not forkers.empty():
            forkers.get().close()
    clean = sum(case_problems(c, results[c.name]) == [] for c in cases)
    print(f"\nbad inputs tried: {len(cases)}; clean error with nothing changed: {clean}")
    return results


def case_problems(case: Case, out: Outcome) -> list[str]:
    problems = []
    lines = out.stderr.strip().splitlines()
    if out.code != (1 if case.debug else 2):  # --debug lets the exception end the process
        problems.append(f"exit status {out.code}, expected {1 if case.debug else 2}")
    if case.debug:
        if not lines or "Traceback" not in out.stderr or "UserError" not in lines[-1] and "ConfigError" not in lines[-1]:
            problems.append("--debug should show a traceback ending in the error")
        text = lines[-1] if lines else ""
    else:
        if len(lines) != 1 or not lines[0].startswith("error: "):
            problems.append("stderr is not exactly one `error: ...` line")
        text = lines[0] if lines else ""
    problems += [f"the error line lacks {w!r}" for w in case.words if w not in text]
    if out.after != out.before:
        changed = sorted(k for k in set(out.before) | set(out.after) if out.before.get(k) != out.after.get(k))
        problems.append(f"files changed or added: {changed[:5]}")
    return problems


# ------------------------------------------------------------------------------ generation

TINY = dict(vocab_size=23, block_size=16, n_layer=2, n_head=2, n_embd=32)


def tiny_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


def lively_model(pos: str) -> GPT:
    """A random model whose greedy output wanders instead of repeating one token at once:
    embeddings of unit scale (not 0.02) make the next token depend on the context."""
    model = tiny_model(seed=1, pos_embedding=pos)
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
        if pos == "learned":
            model.transformer.wpe.weight.normal_(0.0, 1.0)
    return model


@torch.no_grad()
def plain_loop(model: GPT, idx: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """station 19 written out independently: crop to block_size, full forward, last position, argmax."""
    block = model.config.block_size
    logits_seen = []
    for _ in range(steps):
        logits, _ = model(idx[:, -block:])
        last = logits[:, -1, :]  # (B, V)
        logits_seen.append(last)
        idx = torch.cat([idx, last.argmax(dim=-1, keepdim=True)], dim=1)
    return idx, logits_seen


class ByteTokenizer:
    """A stand-in tokenizer: one id per UTF-8 byte, then BOS and end-of-text. Decoding a cut
    multi-byte character gives U+FFFD, as byte-level BPE does."""

    kind = "byte"
    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class LettersTokenizer:
    """One id per letter of a small alphabet, then BOS and end-of-text."""

    kind = "char"
    alphabet = "abcdefghij "
    vocab_size = len(alphabet) + 2
    bos_id = len(alphabet)

    def __init__(self, eos_id: int | None = None):
        self.eos_id = len(self.alphabet) + 1 if eos_id is None else eos_id

    def encode(self, text: str) -> list[int]:
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(self.alphabet[i] if i < len(self.alphabet) else "" for i in ids)


def letters_model(seed=12, **kw) -> GPT:
    return tiny_model(seed=seed, vocab_size=LettersTokenizer.vocab_size, **kw)


def bf16_reference(model: GPT, round_output: bool = True, round_input: bool = True) -> GPT:
    """The model with every Linear weight and bias rounded to bfloat16 (kept in float32), and
    each Linear's input rounded too when `round_input`, as a bfloat16 matmul sees it (the kernels'
    portable loop keeps float32 inputs); its output rounded as well when `round_output` (a
    bfloat16 matmul returns bfloat16; the gemv kernel returns float32)."""
    ref = GPT(model.config).eval()
    ref.load_state_dict(model.state_dict())
    ref.set_attention_impl("sdpa")  # PyTorch's SDPA, as before the compiled training attention (the tests' tolerances are tight)
    if model.config.tie_weights:  # the copy's lm_head is rounded, the embedding table is not
        ref.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    for module in ref.modules():
        if isinstance(module, torch.nn.Linear):
            with torch.no_grad():
                module.weight.copy_(module.weight.bfloat16().float())
                if module.bias is not None:
                    module.bias.copy_(module.bias.bfloat16().float())
            if round_input:
                module.register_forward_pre_hook(lambda m, args: (args[0].bfloat16().float(),))
            if round_output:
                module.register_forward_hook(lambda m, args, out: out.bfloat16().float())
    return ref


# ------------------------------------------------------------------ llama.cpp in a child process

LLAMA_CPP_CHILD = Path(__file__).with_name("llama_cpp_child.py")


def llama_cpp_answers(path: Path, context: int, calls: list[dict], work: Path, **options) -> list:
    """The answers of llama.cpp, loading `path` with room for `context` tokens, to `calls` (see
    tests/llama_cpp_child.py), in a process of its own; a crash there fails the test with its signal."""
    request, answers = work / "request.json", work / "answers.json"
    request.write_text(json.dumps({"model": str(path), "n_ctx": context, "options": options, "calls": calls,
                                   "out": str(answers)}), encoding="utf-8")
    answers.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, str(LLAMA_CPP_CHILD), str(request)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode < 0:
        pytest.fail(f"llama.cpp died of {signal.Signals(-done.returncode).name} on {path.name}: "
                    f"{done.stderr[-1500:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(answers.read_text(encoding="utf-8"))


def llama_cpp_scores(path: Path, context: int, prompts: list[list[int]], work: Path) -> list[np.ndarray]:
    """Every position's logits of each prompt, each from an empty cache (float32 K/V cache)."""
    calls = [{"op": "scores", "ids": ids, "npy": str(work / f"scores-{i}.npy")} for i, ids in enumerate(prompts)]
    llama_cpp_answers(path, context, calls, work, logits_all=True, type_k=0, type_v=0)  # 0: GGML_TYPE_F32
    return [np.load(call["npy"]) for call in calls]


# ------------------------------------------------------------------ what autograd saves


def saved_bytes(model: GPT, B: int, T: int, *, autocast: bool = False):
    """Bytes autograd keeps for the backward pass, measured with saved_tensors_hooks.

    Every tensor an op saves passes through the pack hook; a tensor counts once by its storage
    (q, k and v are views of one buffer, and a view keeps the whole buffer alive). Parameters
    are not activations and are left out; so are the bf16 weight copies autocast makes, which
    are returned separately. Also returns the bytes saved inside block 0 alone.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.ndim == 2}
    weight_shapes |= {s[::-1] for s in weight_shapes}
    seen: dict[int, int] = {}
    casts: dict[int, int] = {}
    in_block0: set[int] = set()
    state = {"block0": False}

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in params or key in seen or key in casts:
            return t
        if autocast and t.dtype == torch.bfloat16 and tuple(t.shape) in weight_shapes:
            casts[key] = storage.nbytes()
            return t
        seen[key] = storage.nbytes()
        if state["block0"]:
            in_block0.add(key)
        return t

    block0 = model.transformer.h[0]
    h1 = block0.register_forward_pre_hook(lambda m, a: state.__setitem__("block0", True))
    h2 = block0.register_forward_hook(lambda m, a, o: state.__setitem__("block0", False))
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                _, loss = model(idx, idx.roll(-1, dims=1))  # own storage for targets, as in training
    finally:
        h1.remove()
        h2.remove()
    loss.backward()  # the graph was complete
    return sum(seen.values()), sum(seen[k] for k in in_block0), sum(casts.values())


def assert_same_weights(run_a: Path, run_b: Path) -> None:
    """The two runs' latest checkpoints hold the same tensors, bit for bit, under the same names."""
    from scratchlm.checkpoint import load_model

    a, _, _ = load_model(run_a)
    b, _, _ = load_model(run_b)
    assert list(a.state_dict()) == list(b.state_dict())
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name

"""`scratchlm serve` over real HTTP on loopback (the browser's side is tests/test_serve_browser.py).

A uvicorn server runs in this process (a thread), so the tests can count the server's threads;
the command itself runs as a subprocess where what it prints and binds is the point. Each
number is checked against something the server did not compute: `scratchlm generate`'s output,
the model's plain forward pass (no cache, no decoding copy), the NumPy reference's attention,
`scratchlm inspect --json`, a metrics file written by the test.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from test_bad_input import train_tiny_run

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("serve")
    folder = base / "runs"
    train_serve_run(base, folder / "mixed")
    return folder


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


@pytest.fixture(scope="module")
def served(runs):
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs)) as s:
        yield s


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


def parse_sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def generate_events(port: int, body: dict) -> list[tuple[str, dict]]:
    status, text = request(port, "POST", "/api/generate", body)
    assert status == 200, text
    return parse_sse(text)


def streamed_text(events: list[tuple[str, dict]]) -> str:
    tokens = "".join(d["text"] for e, d in events if e == "token")
    (done,) = [d for e, d in events if e == "done"]
    assert done["text"].startswith(tokens)  # a tail held back to the end (a stop-string prefix) is done's only
    return done["text"]


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


# ------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("prompt", ["ROMEO:", "床前明", ""])
def test_the_greedy_stream_equals_scratchlm_generate(served, runs, prompt):
    events = generate_events(served.port, {"run": "mixed", "prompt": prompt, "greedy": True, "max_new_tokens": 60})
    assert [e for e, _ in events][0] == "start" and events[-1][0] == "done"
    assert streamed_text(events) == cli_generate(runs / "mixed", prompt, "--greedy", "--max-new-tokens", "60")
    indices = [d["index"] for e, d in events if e == "token"]
    assert indices == list(range(len(indices))) and events[-1][1]["tokens"] == len(indices)


def test_sampled_streams_equal_the_command_line_with_the_same_seed(served, runs):
    options = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.1, "seed": 123}
    events = generate_events(served.port, {"run": "mixed", "prompt": "The ", "max_new_tokens": 50, **options})
    assert events[0] == ("start", {"prompt_ids": 4, "cropped": False, "seed": 123})
    expected = cli_generate(runs / "mixed", "The ", "--max-new-tokens", "50", "--temperature", "0.9", "--top-k", "20",
                            "--top-p", "0.95", "--repetition-penalty", "1.1", "--seed", "123")
    assert streamed_text(events) == expected


def test_each_tokens_probabilities_are_the_models_softmax(served, runs):
    """p and the top 5 of every token event against the model's plain forward pass over the
    prompt and the tokens so far (float64, no cache, no decoding copy), with a sampled stream so
    that the chosen token is often not the top one."""
    from scratchlm.training.checkpoint import load_model

    events = generate_events(served.port, {"run": "mixed", "prompt": "ROMEO:", "max_new_tokens": 25, "seed": 7,
                                           "temperature": 1.5})
    model, tokenizer, _ = load_model(runs / "mixed")
    model = model.double()
    ids = tokenizer.encode("ROMEO:")
    not_top = 0
    for event, data in events:
        if event != "token":
            continue
        window = torch.tensor([ids[-model.config.block_size:]])
        with torch.no_grad():
            logits = model(window)[0][0, -1]  # (V,)
        probs = torch.softmax(logits[: tokenizer.vocab_size], -1)
        assert data["p"] == pytest.approx(float(probs[data["id"]]), abs=1e-6)
        order = torch.argsort(probs, descending=True)[:5].tolist()
        assert [t["id"] for t in data["top"]] == order
        assert [t["p"] for t in data["top"]] == pytest.approx(probs[order].tolist(), abs=1e-6)
        not_top += data["id"] != order[0]
        ids.append(data["id"])
    assert not_top > 0  # the comparison covered tokens sampled below the top


class _Chars:
    """A tokenizer whose pieces are awkward for hand-written JSON: a quote, a backslash, a newline,
    a non-ASCII letter, a closing script tag; and plain letters after them."""

    pieces = ['"', "\\", "\n", "é", "a", "</script>", "b", "c", "d", "e"]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_a_token_events_json_text_parses_to_the_softmax_with_ties_by_lower_id():
    """token_sse writes its JSON by hand: json.loads must read it back, the probabilities must be
    NumPy's float64 softmax, and equal scores inside the top 5 list the lower id first."""
    from scratchlm.serve.labels import Labels
    from scratchlm.serve.streams import token_sse

    logits = torch.tensor([0.5, 2.0, 2.0, -1.0, 2.0, 0.0])  # ids 1, 2, 4 tie at the top
    text = token_sse(Labels(_Chars()), 3, 4, 'x"\\y\n', logits)
    assert text.startswith("event: token\ndata: ") and text.endswith("\n\n") and text.count("\n") == 3
    data = json.loads(text[len("event: token\ndata: "):])
    z = np.array([0.5, 2.0, 2.0, -1.0, 2.0, 0.0])
    probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert (data["index"], data["id"], data["text"]) == (3, 4, 'x"\\y\n')
    assert data["label"] == "a" and data["p"] == pytest.approx(probs[4], abs=1e-12)
    assert [t["id"] for t in data["top"]] == [1, 2, 4, 0, 5]
    assert [t["label"] for t in data["top"]] == ["\\", "\u21b5", "a", '"', "</script>"]  # ↵: a newline shown
    assert [t["p"] for t in data["top"]] == pytest.approx(probs[[1, 2, 4, 0, 5]].tolist(), abs=1e-12)


@pytest.mark.parametrize("scores, expected", [
    ([0.0] * 10, [0, 1, 2, 3, 4]),  # all equal: the five lowest ids, whatever topk picks
    ([1.0, 3, 3, 3, 3, 3, 3, 0, -1, -2], [1, 2, 3, 4, 5]),  # six tie for the first place
    ([3.0, 1, 2, 2, 2, 2, 2, 2, 0, 5], [9, 0, 2, 3, 4]),  # seven tie across the fifth place
])
def test_ties_across_the_fifth_place_go_to_the_lower_ids(scores, expected):
    from scratchlm.serve.labels import Labels
    from scratchlm.serve.streams import token_sse

    text = token_sse(Labels(_Chars()), 0, 0, "", torch.tensor(scores))
    assert [t["id"] for t in json.loads(text.split("data: ", 1)[1])["top"]] == expected


@pytest.mark.parametrize("bad", ["all -inf", "a nan", "a +inf"])
def test_a_token_event_of_scores_with_no_probabilities_is_still_json(bad):
    from scratchlm.serve.labels import Labels
    from scratchlm.serve.streams import token_sse

    scores = torch.full((10,), float("-inf")) if bad == "all -inf" else torch.arange(10.0)
    if bad != "all -inf":
        scores[3] = float(bad.split()[1])
    text = token_sse(Labels(_Chars()), 0, 0, "", scores)
    data = json.loads(text.split("data: ", 1)[1])  # the browser's JSON.parse takes no NaN
    assert data["p"] is None and len(data["top"]) == 5 and all(t["p"] is None for t in data["top"])


def test_a_prompt_the_tokenizer_cannot_encode_is_a_bad_request(served):
    """As on the attention tab: one JSON error line with status 400, before any stream starts."""
    got, answer = request(served.port, "POST", "/api/generate", {"run": "mixed", "prompt": "Ωmega", "max_new_tokens": 5})
    assert got == 400 and "'Ω'" in answer["error"]
    assert active_streams(served) == 0


def test_eight_streams_at_once_each_get_what_they_get_alone(served):
    bodies = [{"run": "mixed", "prompt": ["The ", "床", "ROMEO:", "月光"][i % 4], "max_new_tokens": 80, "seed": i,
               "temperature": 1.0, "top_k": 30} for i in range(8)]
    alone = [streamed_text(generate_events(served.port, b)) for b in bodies]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: streamed_text(generate_events(served.port, b)), bodies))
    assert together == alone
    assert len(set(alone)) == 8  # the seeds gave eight different texts: the comparison can tell them apart


def test_a_reader_that_goes_away_stops_its_generation(runs):
    """The client closes the connection after three tokens of a 100,000-token request: the model
    thread drops the stream, long before the tokens asked for."""
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs), Limits(max_new_tokens=100_000)) as s:
        for seed in range(20):  # a draw may reach the end-of-text token by itself: then the next seed
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            conn.request("POST", "/api/generate", body=json.dumps({"run": "mixed", "prompt": "The ", "seed": seed,
                                                                   "max_new_tokens": 100_000}), headers=JSON)
            resp = conn.getresponse()
            seen, line = 0, None
            while seen < 3 and line not in ("", "event: done\n"):  # a draw may reach end-of-text first
                line = resp.fp.readline().decode()
                seen += line.startswith("event: token")
            if active_streams(s) == 1:
                break
            conn.close()
        assert active_streams(s) == 1
        began = time.monotonic()
        resp.close()
        conn.close()
        assert wait_until(lambda: active_streams(s) == 0, 20), "the generation went on after the reader left"
        print(f"\nthe stream ended {time.monotonic() - began:.2f} s after the reader closed")


def test_a_reader_that_leaves_a_beam_search_stops_it(runs, monkeypatch):
    """Beam search answers in one event at its end; a reader that goes away before then stops it
    at its next step, and the model thread is free for others at once (not after 100,000 steps)."""
    import scratchlm.generation.generate as gen
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    answers = []  # what should_stop said, step by step, in the search the server ran
    search = gen.beam_search

    def watched(*args, should_stop, **kwargs):
        return search(*args, should_stop=lambda: answers.append(should_stop()) or answers[-1], **kwargs)

    monkeypatch.setattr(gen, "beam_search", watched)
    with Served(RunLibrary(runs=runs), Limits(max_new_tokens=100_000)) as s:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/api/generate", body=json.dumps({"run": "mixed", "prompt": "The ", "beams": 4,
                                                               "max_new_tokens": 100_000}), headers=JSON)
        assert wait_until(lambda: active_streams(s) == 1, 20)
        time.sleep(0.3)  # well into the search
        conn.close()
        assert wait_until(lambda: active_streams(s) == 0, 20), "the beam search went on after the reader left"
        assert request(s.port, "GET", "/api/model?run=mixed", timeout=20)[0] == 200
    assert len(answers) > 1 and answers[-1] is True and not any(answers[:-1])


def _interrupt_a_stream(runs: Path, options: dict, sigint_ignored: bool = False) -> tuple[list[str], int, str]:
    """Serve `runs`, open a long stream, send SIGINT after its third token: (the done events'
    reasons the reader got, the server's exit status, its stderr). `sigint_ignored`: the server
    starts with SIGINT ignored, as a background job of a script does (and as this test suite's
    own processes do when it runs in one)."""
    import signal

    disposition = signal.SIG_IGN if sigint_ignored else signal.SIG_DFL
    proc = subprocess.Popen([sys.executable, "-m", "scratchlm", "serve", "--runs", str(runs), "--port", "0",
                             "--max-new-tokens", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
    try:
        port = int(re.search(r"http://[\d.]+:(\d+)/", proc.stdout.readline()).group(1))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/api/generate", body=json.dumps({"run": "mixed", "prompt": "The ", **options,
                                                               "max_new_tokens": 100_000}), headers=JSON)
        resp = conn.getresponse()
        lines, seen = [], 0
        while seen < 3 and (not lines or lines[-1] not in (b"", b"event: done\n")):  # eos may come first
            lines.append(resp.fp.readline())
            seen += lines[-1].startswith(b"event: token")
        proc.send_signal(signal.SIGINT)
        rest = b"".join(lines + list(iter(resp.fp.readline, b""))).decode("utf-8", "replace")
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    reasons = [json.loads(line[6:])["reason"] for line in rest.splitlines() if line.startswith("data: ") and '"reason"' in line]
    return reasons, proc.returncode, err


def test_ctrl_c_ends_open_streams_with_their_done_event_and_no_traceback(runs):
    """SIGINT while a long stream is open: the reader gets the done event (reason stopped), the
    server exits as an interrupted program does (130, one line), within the graceful shutdown.
    Greedy text from this model runs on (no end-of-text token in 3,000 tokens, measured); should
    a stream still end before the signal lands, seeded draws are tried next."""
    for options in ({"greedy": True}, *({"seed": seed} for seed in range(4))):
        reasons, status, err = _interrupt_a_stream(runs, options)
        assert status == 130 and "Traceback" not in err and "Exception" not in err, err
        if reasons != ["eos"]:
            break
    assert reasons == ["stopped"]


def test_ctrl_c_exits_130_even_when_sigint_was_ignored_at_start(runs):
    """A server started with SIGINT ignored (a script's background job): uvicorn takes SIGINT over
    all the same and shuts down, and its re-raise of the signal then does nothing; the exit status
    is still an interrupted program's (it was 0)."""
    reasons, status, err = _interrupt_a_stream(runs, {"greedy": True}, sigint_ignored=True)
    assert status == 130 and err.splitlines()[-1] == "interrupted" and "Traceback" not in err, err


def test_beam_search_asks_should_stop_before_each_step():
    from scratchlm.generation.generate import Stopped, beam_search

    asked = []
    stop_at_third = lambda: asked.append(1) or len(asked) == 3  # noqa: E731
    with pytest.raises(Stopped):
        beam_search(_tiny_model(), torch.tensor([1, 2, 3]), 3, 50, should_stop=stop_at_third)
    assert len(asked) == 3
    assert len(beam_search(_tiny_model(), torch.tensor([1, 2, 3]), 3, 5, n_best=3, should_stop=lambda: False)) == 3


def _tiny_model():
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=8)).eval()


def test_beams_answer_with_the_command_lines_best_sequence(served, runs):
    events = generate_events(served.port, {"run": "mixed", "prompt": "The ", "max_new_tokens": 20, "beams": 3})
    assert [e for e, _ in events] == ["done"]
    header, text = cli_generate(runs / "mixed", "The ", "--max-new-tokens", "20", "--beams", "3").split("\n", 1)
    assert text == events[0][1]["text"]
    assert float(re.search(r"logprob (-?[\d.]+)", header).group(1)) == pytest.approx(events[0][1]["logprob"], abs=1e-4)


# ------------------------------------------------------------------------------ bad input and bounds


@pytest.mark.parametrize("body, status, words", [
    ({"run": "mixed", "prompt": "x" * 4001}, 400, "4,000 characters"),
    ({"run": "mixed", "max_new_tokens": 1001}, 400, "1 to 1000"),
    ({"run": "mixed", "max_new_tokens": 0}, 400, "1 to 1000"),
    ({"run": "mixed", "max_new_tokens": "9"}, 400, "expected int"),
    ({"run": "mixed", "temperature": -1}, 400, "temperature"),
    ({"run": "mixed", "top_p": 1.5}, 400, "top_p"),
    ({"run": "mixed", "greedy": "yes"}, 400, "greedy"),
    ({"run": "mixed", "beams": 99}, 400, "beams"),
    ({"run": "mixed", "seed": -1}, 400, "seed: must be a whole number from 0 to 2**63 - 1"),
    ({"run": "mixed", "seed": 2**63}, 400, "seed: must be a whole number from 0 to 2**63 - 1"),
    ({"run": "mixed", "stop": ["e"]}, 400, "unknown field stop"),
    ({"run": "mixed", "num_samples": 2, "best_of": 3}, 400, "unknown fields best_of, num_samples"),
    ({"run": "mixed", "beams": 2, "length_penalty": float("nan")}, 400, "length_penalty: must be a finite number"),
    ({"run": "mixed", "beams": 2, "length_penalty": float("inf")}, 400, "length_penalty: must be a finite number"),
    ({"run": "nope"}, 404, "no run named"),
    ({"run": None}, 404, "no run named in the request"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_generate_requests_get_one_error_line(served, body, status, words):
    got, answer = request(served.port, "POST", "/api/generate", body)
    assert got == status and words in answer["error"] and "\n" not in answer["error"]


def test_bodies_are_capped_and_must_be_json(served):
    got, answer = request(served.port, "POST", "/api/generate", raw=b'{"prompt": "' + b"a" * 70_000 + b'"}')
    assert got == 413 and "65,536 bytes" in answer["error"]
    got, answer = request(served.port, "POST", "/api/attention", raw=b"\xff\xfe not json")
    assert got == 400 and "not JSON" in answer["error"]
    # a chunked body (no Content-Length) is counted as it arrives
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request("POST", "/api/generate", body=iter([b"[" + b"1," * 20_000] * 3), encode_chunked=True,
                 headers=JSON)
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()


@pytest.mark.parametrize("since", ["%C2%B2", "%D9%A3", "-1", "1.5", "x"])  # ², Arabic-Indic 3: digits to str.isdigit
def test_a_training_offset_that_is_not_ascii_digits_is_a_bad_request(served, since):
    got, answer = request(served.port, "GET", f"/api/training?run=mixed&since={since}")
    assert got == 400 and answer["error"].startswith("since: a byte offset")


@pytest.mark.parametrize("name", ["..", "../mixed", "mixed/..", "/etc", "%2e%2e", "..%2Fmixed", "mixed%00", "outside",
                                  "linked", "./mixed", "mixed/", "~", ""])
def test_a_run_is_only_ever_a_listed_name(served, runs, name):
    """Path forms, encoded or not, and a symlink to a run outside the folder: none is served."""
    from urllib.parse import quote

    outside = runs.parent / "outside"
    if not outside.exists():
        import shutil

        shutil.copytree(runs / "mixed", outside)
        (runs / "linked").symlink_to(outside, target_is_directory=True)
    names = [r["name"] for r in request(served.port, "GET", "/api/runs")[1]["runs"]]
    assert names == ["mixed"]
    for path in (f"/api/model?run={quote(name)}", f"/api/model?run={name}", f"/api/inside?run={quote(name)}",
                 f"/api/training?run={quote(name)}&since=0"):
        got, answer = request(served.port, "GET", path)
        assert got == 404, (path, answer)
    got, answer = request(served.port, "POST", "/api/attention", {"run": name, "text": "The"})
    assert got == 404


def test_a_run_whose_files_lead_outside_is_refused(tmp_path, runs):
    """A listed run whose checkpoint or tokenizer is a symlink out of the runs folder."""
    import shutil

    from scratchlm.serve.library import RunLibrary, UnknownRun

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "sneaky")
    shutil.move(folder / "sneaky" / "tokenizer", tmp_path / "tokenizer")
    (folder / "sneaky" / "tokenizer").symlink_to(tmp_path / "tokenizer", target_is_directory=True)
    library = RunLibrary(runs=folder)
    assert [e.name for e in library.entries()] == ["sneaky"]
    with pytest.raises(UnknownRun, match="outside"):
        library.load("sneaky")


def test_a_run_with_no_checkpoint_yet_says_so_without_the_servers_paths(tmp_path):
    from scratchlm.errors import UserError
    from scratchlm.serve.library import RunLibrary

    (tmp_path / "runs" / "young").mkdir(parents=True)
    (tmp_path / "runs" / "young" / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    library = RunLibrary(runs=tmp_path / "runs")
    assert [e.name for e in library.entries()] == ["young"]
    with pytest.raises(UserError, match="run young: no checkpoint yet") as caught:
        library.load("young")
    assert str(tmp_path) not in str(caught.value)


def test_a_run_trained_again_under_the_same_checkpoint_name_is_loaded_afresh(tmp_path, runs):
    """The kept model is the files', not the path's: new weights written at the same checkpoint
    path (a run deleted and trained again) are what the next request gets."""
    import shutil

    from safetensors.torch import load_file, save_file

    from scratchlm.training.checkpoint import latest_checkpoint
    from scratchlm.serve.library import RunLibrary

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "again")
    library = RunLibrary(runs=folder)
    first = library.load("again")
    assert library.load("again") is first  # unchanged files: the kept model
    weights_file = latest_checkpoint(folder / "again") / "model.safetensors"
    weights = load_file(weights_file)
    weights = {name: t * 0.5 if t.is_floating_point() else t for name, t in weights.items()}
    save_file(weights, weights_file)
    later = weights_file.stat().st_mtime_ns + 2_000_000_000
    os.utime(weights_file, ns=(later, later))  # a later write, whatever the file system's clock grain
    second = library.load("again")
    assert second is not first
    state = second.model.state_dict()
    for name, t in weights.items():
        if name in state:
            assert torch.equal(state[name].cpu(), t), name


@pytest.mark.parametrize("path", ["/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py",
                                  "/static/%2e%2e%2f%2e%2e%2fcli.py", "/static//etc/passwd", "/../pyproject.toml"])
def test_static_files_never_leave_the_static_folder(served, path):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.putrequest("GET", path, skip_accept_encoding=True)  # sent as is, not normalised
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", "replace")
    assert resp.status == 404 and "import" not in body and "root:" not in body


def test_the_page_and_its_files_come_from_the_package(served):
    got, page = request(served.port, "GET", "/")
    assert got == 200 and "<html" in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing from the internet
    for asset in re.findall(r"""(?:src|href)=["'](/static/[^"']+)["']""", page):
        got, text = request(served.port, "GET", asset)
        text = text.replace("http://www.w3.org/2000/svg", "")  # SVG's namespace: a name, never fetched
        assert got == 200 and "http://" not in text and "https://" not in text, asset


# ------------------------------------------------------------------------------ the other pages' data


def test_attention_weights_equal_the_numpy_reference(served, runs):
    """Every layer and head, against the NumPy twin's forward pass in float64."""
    from scratchlm.training.checkpoint import load_model
    from scratchlm.reference.numpy_gpt import forward_trace, params_from_state_dict

    text = "月光 and the king"
    got, data = request(served.port, "POST", "/api/attention", {"run": "mixed", "text": text})
    assert got == 200, data
    model, tokenizer, _ = load_model(runs / "mixed")
    ids = tokenizer.encode(text)
    assert data["ids"] == ids and len(data["labels"]) == len(ids) and data["labels"][0] == "月"
    trace = forward_trace(np.array(ids), params_from_state_dict({k: v.double() for k, v in model.state_dict().items()}),
                          model.config)
    weights = np.array(data["weights"])  # (L, H, T, T)
    assert weights.shape == (2, 2, len(ids), len(ids))
    for layer in range(2):
        np.testing.assert_allclose(weights[layer], trace[f"h{layer}.weights"], atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, 1) == 0)


def test_attention_text_is_bounded(served):
    got, answer = request(served.port, "POST", "/api/attention", {"run": "mixed", "text": "a" * 33})
    assert got == 400 and "at most 32" in answer["error"]
    got, answer = request(served.port, "POST", "/api/attention", {"run": "mixed", "text": ""})
    assert got == 400 and "empty" in answer["error"]


def test_inside_is_what_scratchlm_inspect_reports(served, runs):
    got, data = request(served.port, "GET", "/api/inside?run=mixed")
    assert got == 200
    report = json.loads(cli_output("inspect", "--checkpoint", str(runs / "mixed"), "--json"))
    assert data["trace"] == report["trace"]["stations"] and data["total"] == report["parameters"]["total"]
    assert data["total"] == sum(int(np.prod(p["shape"])) for p in data["params"])
    assert [p["name"] for p in data["params"]][:2] == ["transformer.wte.weight", "transformer.h.0.ln_1.weight"]


def test_the_walkthrough_is_the_hand_models_forward_pass(served):
    got, data = request(served.port, "GET", "/api/walkthrough")
    assert got == 200 and data["labels"] == list("床前明月山") and data["max_diff"] < 1e-12
    probs = np.array(next(s["torch"] for s in data["steps"] if s["key"] == "probs"))
    logits = np.array(next(s["torch"] for s in data["steps"] if s["key"] == "logits"))
    np.testing.assert_allclose(probs, np.exp(logits) / np.exp(logits).sum(-1, keepdims=True), atol=1e-12)


def test_training_records_follow_a_growing_metrics_file(tmp_path, runs):
    """Records from an offset, a half-written last line left for the next poll, `training` true
    only while a process holds the run's lock, and a file that shrank read from the start."""
    import shutil

    from scratchlm.training.runlock import RunLock
    from scratchlm.serve.app import Limits, training_data

    run = tmp_path / "live"
    shutil.copytree(runs / "mixed", run)
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"event": "train", "step": 1, "loss": 4.0}\n{"event": "eval", "st', encoding="utf-8")
    first = training_data(run, metrics, 0, Limits())
    assert [r["step"] for r in first["records"]] == [1] and first["next"] == len(metrics.read_bytes().split(b"\n")[0]) + 1
    assert first["training"] is False
    with open(metrics, "a", encoding="utf-8") as f:
        f.write('ep": 2, "val_loss": 3.5}\n{"event": "sample", "step": 2, "text": "床前"}\n')
    with RunLock(run):
        second = training_data(run, metrics, first["next"], Limits())
    assert [r["event"] for r in second["records"]] == ["eval", "sample"] and second["records"][1]["text"] == "床前"
    assert second["training"] is True and second["next"] == metrics.stat().st_size
    metrics.write_text('{"event": "start", "step": 0}\n', encoding="utf-8")
    again = training_data(run, metrics, second["next"], Limits())
    assert again["reset"] and [r["event"] for r in again["records"]] == ["start"]


def test_a_checkpoint_served_alone_says_when_its_run_is_training(tmp_path, runs):
    """`serve --checkpoint RUN/ckpt_N`: the lock that says "training" is the run folder's."""
    import shutil

    from scratchlm.training.checkpoint import latest_checkpoint
    from scratchlm.training.runlock import RunLock
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary, describe

    run = tmp_path / "live"
    shutil.copytree(runs / "mixed", run)
    entry = RunLibrary(checkpoint=latest_checkpoint(run)).entries()[0]
    assert entry.path.parent == run and describe(entry)["training"] is False
    with RunLock(run):
        assert describe(entry)["training"] is True
        assert describe(RunLibrary(checkpoint=run).entries()[0])["training"] is True
        with Served(RunLibrary(checkpoint=latest_checkpoint(run)), Limits()) as served:
            status, answer = request(served.port, "GET", f"/api/training?run={entry.name}&since=0")
        assert status == 200 and answer["training"] is True and answer["records"]


# ------------------------------------------------------------------------------ load


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_a_bounded_load_leaks_no_threads_or_memory(served):
    """8 streams at once, then 100 short requests, three rounds: no error, the generation threads
    all end, and the memory after the last round is within a few MiB of after the first."""
    port = served.port
    shorts = [("GET", "/api/runs", None), ("GET", "/api/model?run=mixed", None),
              ("POST", "/api/attention", {"run": "mixed", "text": "The king"}),
              ("POST", "/api/generate", {"run": "mixed", "prompt": "a", "max_new_tokens": 3, "seed": 1})]
    rss, threads = [], []
    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(lambda i: streamed_text(generate_events(
                port, {"run": "mixed", "prompt": "The ", "max_new_tokens": 120, "seed": i})), range(8)))
        assert all(texts)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: request(port, *shorts[i % 4]), range(100)))
        assert all(status == 200 for status, _ in answers)
        assert wait_until(lambda: active_streams(served) == 0)
        rss.append(_rss_mib())
        threads.append(sorted(t.name for t in threading.enumerate()))
    print(f"\nmemory after each round: {', '.join(f'{r:.1f}' for r in rss)} MiB; threads after each round: "
          f"{[len(t) for t in threads]}")
    assert rss[-1] - rss[0] < 8, rss
    # no thread of the server's own is left over; the web server's pool (anyio, for file reads)
    # keeps idle workers for a few seconds, up to its limit of 40, and is not counted as a leak
    pooled = "AnyIO worker thread"
    assert [[n for n in names if n != pooled] for names in threads] == [[n for n in threads[0] if n != pooled]] * 3
    assert all(names.count(pooled) <= 40 for names in threads)


# ------------------------------------------------------------------------------ the command


def _start_serve(*args: str, cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "scratchlm", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    line = proc.stdout.readline()
    return proc, line


def _listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    found.append(local.rsplit(":", 1)[0])
    return found


def test_the_command_prints_its_address_and_binds_loopback(runs):
    proc, line = _start_serve("--runs", str(runs), "--port", "0")
    try:
        match = re.match(r"scratchlm playground: http://127\.0\.0\.1:(\d+)/ ", line)
        assert match, line
        port = int(match.group(1))
        assert request(port, "GET", "/api/runs")[1]["default"] == "mixed"
        # one torch thread fewer than a plain process takes, so the browser keeps a core
        plain = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                   capture_output=True, text=True, check=True).stdout)
        assert request(port, "GET", "/api/model?run=mixed")[1]["threads"] == max(1, plain - 1)
        assert f"{max(1, plain - 1)} torch thread" in line
        if sys.platform == "linux":
            assert _listening(port) == ["0100007F"]  # 127.0.0.1 only, as the kernel sees it
    finally:
        proc.terminate()
        proc.wait(10)


def test_another_host_gets_a_warning_line(runs):
    proc, line = _start_serve("--checkpoint", str(runs / "mixed"), "--host", "0.0.0.0", "--port", "0", "--threads", "3")
    try:
        port = int(re.search(r":(\d+)/", line).group(1))
        assert f"http://127.0.0.1:{port}/" in line  # an address to open here, not 0.0.0.0
        assert request(port, "GET", "/api/runs")[1]["default"] == "mixed"
        assert request(port, "GET", "/api/model?run=mixed")[1]["threads"] == 3
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.stderr.read().startswith("warning: listening on 0.0.0.0, reachable from other machines")


@pytest.mark.parametrize("args, words", [
    (["--port", "70000"], "--port must be between 0 and 65535"),
    (["--runs", "/nonexistent/runs"], "no such folder"),
    (["--checkpoint", "/nonexistent/run"], "no such checkpoint"),
    ([], "no ./runs folder here"),
    (["--host", "no.such.host.invalid"], "--host no.such.host.invalid"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--threads", "0"], "--threads must be between 1 and 4096"),
    (["--allow-host", "box.local:8000"], "--allow-host 'box.local:8000': not a host name or address"),
])
def test_the_command_refuses_bad_input_in_one_line(tmp_path, runs, args, words):
    if "--runs" not in args and "--checkpoint" not in args and args:
        args = ["--runs", str(runs), *args]
    proc = subprocess.run([sys.executable, "-m", "scratchlm", "serve", *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr


def test_a_port_in_use_is_one_error_line(runs):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        port = holder.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "scratchlm", "serve", "--runs", str(runs), "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr == (
            f"error: cannot listen on 127.0.0.1:{port} (in use); pick another with --port (0 picks a free one)\n")
    finally:
        holder.close()

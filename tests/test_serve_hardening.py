"""The playground against a hostile web page, another local user, and slow or half-open clients.

The threat model is in docs/hardening.md. Most cases go to the real command (`scratchlm serve`
in a subprocess, its stderr in a file): each must be a 4xx with one short reason (or, for a
client that holds a connection, the connection closed), no traceback on the server's stderr,
and the runs folder byte-identical. The deadlines are tested in-process with short limits, each
test bounded by its own loop (a broken guard makes it fail, never hang).
"""

from __future__ import annotations

import http.client
import json
import resource
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import JSON, Served, active_streams, one_line_refusal, raw, tree_hashes, wait_until


class Command:
    """`scratchlm serve --runs RUNS --port 0` with its stderr in a file, started with at most 256
    file descriptors (so a flood of connections would exhaust them were they not capped)."""

    def __init__(self, runs: Path, stderr: Path):
        self.runs, self.stderr_path, self.err = runs, stderr, open(stderr, "wb")
        limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # noqa: E731
        self.proc = subprocess.Popen([sys.executable, "-m", "scratchlm", "serve", "--runs", str(runs), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, preexec_fn=limit)
        line = self.proc.stdout.readline()
        assert line.startswith("scratchlm playground: http://127.0.0.1:"), (line, stderr.read_text())
        self.port = int(line.split(":")[3].split("/")[0])

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.proc.stdout.close()
        self.err.close()


@pytest.fixture(scope="module")
def command(runs, tmp_path_factory):
    c = Command(runs, tmp_path_factory.mktemp("serve-stderr") / "stderr.txt")
    yield c
    c.close()
    assert "Traceback" not in c.stderr() and "Too many open files" not in c.stderr(), c.stderr()


@pytest.fixture
def untouched(runs, command):
    """The runs folder must be byte-identical after the test, and the server's stderr clean."""
    before = tree_hashes(runs)
    yield
    assert tree_hashes(runs) == before
    err = command.stderr()
    assert "Traceback" not in err and "Exception" not in err and err.count("\n") <= 2, err


GENERATE = json.dumps({"run": "mixed", "prompt": "The ", "max_new_tokens": 5, "seed": 1}).encode()


# ------------------------------------------------------------------------------ who is answered


@pytest.mark.parametrize("host", ["attacker.test", "127.0.0.1.attacker.test", "localhost.attacker.test", "10.0.0.7",
                                  "attacker.test:80", "", "localhost:x", "box.local"])  # box.local: not without --allow-host
def test_a_foreign_host_is_refused_everywhere(command, untouched, host):
    """DNS rebinding: a foreign name resolved to 127.0.0.1. Its Host gets nothing: not the runs,
    the metrics, the page, nor a stream."""
    port = command.port
    name = f"{host}:{port}" if host and ":" not in host else host
    for method, path, body, extra in [("GET", "/api/runs", None, {}), ("GET", "/api/training?run=mixed&since=0", None, {}),
                                      ("GET", "/api/model?run=mixed", None, {}), ("GET", "/", None, {}),
                                      ("GET", "/static/app.js", None, {}), ("POST", "/api/generate", GENERATE, JSON)]:
        status, answer = raw(port, method, path, {"Host": name, **extra}, body)
        one_line_refusal(status, answer, 403, "this server answers to")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]", "localhost."])
def test_this_machines_loopback_names_are_answered_on_any_port(command, untouched, host):
    """Any port: a tunnel (ssh -L 9000:localhost:PORT) sends its own; a page could only send ours."""
    for port in (command.port, 9000):
        status, answer = raw(command.port, "GET", "/api/runs", {"Host": f"{host}:{port}"})
        assert status == 200 and [r["name"] for r in answer["runs"]] == ["mixed"]
    status, text = raw(command.port, "GET", "/", {"Host": host})
    assert status == 200 and "<html" in text.lower()


@pytest.mark.parametrize("headers", [{"Origin": "http://attacker.test"}, {"Origin": "null"},
                                     {"Origin": "http://localhost:{port}"},  # another origin than the Host's
                                     {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}])
def test_a_request_from_another_page_is_refused(command, untouched, headers):
    port = command.port
    headers = {k: v.format(port=port) for k, v in headers.items()}
    for method, path, body in [("GET", "/api/runs", None), ("GET", "/api/training?run=mixed&since=0", None),
                               ("GET", "/api/inside?run=mixed", None), ("POST", "/api/generate", GENERATE)]:
        status, answer = raw(port, method, path, {"Host": f"127.0.0.1:{port}", **JSON, **headers}, body)
        one_line_refusal(status, answer, 403, "refused")


def test_the_pages_own_origin_and_plain_scripts_are_answered(command, untouched):
    port = command.port
    for extra in ({}, {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}):
        status, text = raw(port, "POST", "/api/generate", {"Host": f"127.0.0.1:{port}", **JSON, **extra}, GENERATE)
        assert status == 200 and "event: done" in text
    # a link from another site to the page itself is fine: the page holds no data
    status, text = raw(port, "GET", "/", {"Host": f"127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site"})
    assert status == 200 and "<html" in text.lower()


@pytest.mark.parametrize("kind", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x", None, "application/jsonx"])
def test_a_post_that_is_not_json_is_refused_before_any_stream(command, untouched, kind):
    """What a form on any page can send: refused (415) before a model is touched."""
    headers = {"Host": f"127.0.0.1:{command.port}"} | ({} if kind is None else {"Content-Type": kind})
    for path, body in [("/api/generate", GENERATE), ("/api/attention", b'{"run": "mixed", "text": "The"}')]:
        status, answer = raw(command.port, "POST", path, headers, body)
        one_line_refusal(status, answer, 415, "application/json")


@pytest.mark.parametrize("method", ["DELETE", "PUT", "PATCH"])
def test_any_method_with_a_body_that_is_not_json_is_refused_as_a_post_is(command, untouched, method):
    """No route takes these methods; the guard refuses them before routing all the same (415, not
    Starlette's 405), so a route added later is never open to a body a foreign page could send."""
    headers = {"Host": f"127.0.0.1:{command.port}", "Content-Type": "text/plain"}
    for path in ("/api/generate", "/api/runs"):
        status, answer = raw(command.port, method, path, headers, GENERATE)
        one_line_refusal(status, answer, 415, "application/json")


@pytest.mark.parametrize("kind", ["Application/JSON", "APPLICATION/JSON; charset=UTF-8"])
def test_the_json_media_type_is_read_in_any_case(command, untouched, kind):
    """Media types are case-insensitive (RFC 9110, 8.3.1): these are JSON bodies, and answered."""
    status, text = raw(command.port, "POST", "/api/generate", {"Host": f"127.0.0.1:{command.port}", "Content-Type": kind},
                       GENERATE)
    assert status == 200 and "event: done" in text


def test_a_refused_post_starts_no_stream(runs, monkeypatch):
    """In-process, where the streams can be counted: a text/plain POST never makes one."""
    import scratchlm.serve.app as app_module
    from scratchlm.serve.library import RunLibrary

    made = []
    real = app_module.GenerationStream
    monkeypatch.setattr(app_module, "GenerationStream", lambda *a: made.append(1) or real(*a))
    with Served(RunLibrary(runs=runs)) as s:
        host = {"Host": f"127.0.0.1:{s.port}"}
        for _ in range(20):  # more than Limits.streams: none of them takes a place
            status, _ = raw(s.port, "POST", "/api/generate", {**host, "Content-Type": "text/plain"}, GENERATE)
            assert status == 415
        assert made == [] and active_streams(s) == 0
        status, text = raw(s.port, "POST", "/api/generate", {**host, **JSON}, GENERATE)
        assert status == 200 and made == [1]  # the spy sees a stream when there is one


def test_host_names_and_the_names_of_another_bind_address():
    from scratchlm.serve.guard import Guard, host_name, is_loopback, local_names

    assert [host_name(h) for h in ["LOCALHOST:80", "[::1]:8000", "[::1]", "127.0.0.1", "a.test.:1", "a:b", "[::1]x",
                                   ":80", "127.0.0.1:"]] == ["localhost", "::1", "::1", "127.0.0.1", "a.test", None,
                                                             None, None, None]
    assert local_names("127.0.0.1") == local_names("localhost") == local_names("::1") == frozenset()
    assert local_names("127.0.0.5") == local_names("::ffff:127.0.0.1") == local_names("LocalHost.") == frozenset()
    assert [is_loopback(h) for h in ["127.9.9.9", "::ffff:127.0.0.1", "0.0.0.0", "::", "box.local"]] == [
        True, True, False, False, False]
    names = local_names("0.0.0.0")
    assert socket.gethostname().lower() in names and "0.0.0.0" in names
    guard = Guard(None, names)

    def scope(host: str, server: str = "192.168.5.9") -> dict:
        return {"type": "http", "path": "/api/runs", "method": "GET", "headers": [(b"host", host.encode())],
                "server": (server, 8000)}

    # bound to every address: the address the client reached, loopback, and the machine's names
    for host in ["192.168.5.9:8000", "localhost:8000", f"{socket.gethostname()}:8000"]:
        assert guard.refusal(scope(host)) is None, host
    for host in ["attacker.test:8000", "192.168.5.10:8000"]:
        assert guard.refusal(scope(host))[0] == 403, host


# ------------------------------------------------------------------------------ bounded input


@pytest.mark.parametrize("body, words", ids=["5000 deep", "9 deep", "5000 digits", "401 digits", "4001 digits"], argvalues=[
    (b"[" * 5000 + b"]" * 5000, "nests arrays or objects more than 8 deep"),  # Python's reader: RecursionError
    (b'{"run": "mixed", "prompt": ' + b"[" * 9 + b"]" * 9 + b"}", "nests arrays or objects more than 8 deep"),
    (b'{"run": "mixed", "seed": ' + b"7" * 5000 + b"}", "more than 4,300 digits"),
    (b'{"run": "mixed", "temperature": 1' + b"0" * 400 + b"}", "temperature: a number too large (401 digits)"),
    (b'{"run": "mixed", "max_new_tokens": 1' + b"0" * 4000 + b"}", "max_new_tokens: a number too large (4001 digits)"),
])
def test_bodies_too_deep_or_numbers_too_long_are_bad_requests(command, untouched, body, words):
    status, answer = raw(command.port, "POST", "/api/generate", {"Host": f"127.0.0.1:{command.port}", **JSON}, body)
    one_line_refusal(status, answer, 400, words)


def test_a_5000_digit_offset_is_a_bad_request(command, untouched):
    status, answer = raw(command.port, "GET", "/api/training?run=mixed&since=" + "9" * 5000,
                         {"Host": f"127.0.0.1:{command.port}"})
    one_line_refusal(status, answer, 400, "since: a byte offset (up to 19 digits)")


# ------------------------------------------------------------------------------ slow and half-open clients


@pytest.fixture
def quick(runs):
    """An in-process server with short deadlines and room for 8 connections; every log record
    of the web server's is kept, so a test can say none was an error."""
    import logging

    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "asyncio")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with Served(RunLibrary(runs=runs), Limits(request_seconds=1, idle_seconds=1, connections=8)) as s:
            s.records = records
            yield s
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []


def closed_by_server(sock: socket.socket, drip: bytes, bound_s: float = 60) -> tuple[bool, bytes]:
    """Send `drip` a byte every 50 ms, then nothing, until the server closes the connection or
    `bound_s` passes: (whether it closed, what it sent). The server's deadline is a second; the
    bound only keeps a broken guard from hanging the test."""
    got, deadline = b"", time.monotonic() + bound_s
    for i in range(10**6):
        if time.monotonic() > deadline:
            return False, got
        if i < len(drip):
            try:
                sock.send(drip[i:i + 1])
            except OSError:  # reset: closed
                return True, got
        if select.select([sock], [], [], 0.05)[0]:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return True, got
            if not data:
                return True, got
            got += data
    return False, got


def test_a_connection_that_sends_nothing_is_closed(quick):
    with socket.create_connection(("127.0.0.1", quick.port)) as sock:
        assert closed_by_server(sock, b"") == (True, b"")


def test_a_request_head_sent_a_byte_at_a_time_is_cut_off(quick):
    """Slowloris: a header that never ends, a byte every 50 ms (h11's 16 KiB head limit would
    take 14 minutes to reach). Without the deadline it is held open for as long as it drips."""
    head = f"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:{quick.port}\r\nX-Pad: ".encode() + b"a" * 100_000
    with socket.create_connection(("127.0.0.1", quick.port)) as sock:
        assert closed_by_server(sock, head) == (True, b"")


def test_a_body_sent_a_byte_at_a_time_is_cut_off(quick):
    head = (f"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:{quick.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 60000\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", quick.port)) as sock:
        sock.sendall(head)
        closed, got = closed_by_server(sock, b'{"run": "mixed", "prompt": "' + b"a" * 59_000)
        assert closed and b"event:" not in got
    assert active_streams(quick) == 0


def test_an_idle_keep_alive_connection_and_a_slow_second_request_are_closed(quick):
    """After an answer: idle, closed by uvicorn's keep-alive timeout; a second request begun and
    then dripped (which cancels that timeout) closed by the guard's deadline."""
    request = f"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:{quick.port}\r\n\r\n".encode()
    for then in (b"", f"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:{quick.port}\r\nX-Pad: ".encode() + b"a" * 100_000):
        with socket.create_connection(("127.0.0.1", quick.port)) as sock:
            sock.sendall(request)
            closed, got = closed_by_server(sock, then)
            assert closed and got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1") == 1


def test_connections_past_the_cap_make_room_for_a_real_request(quick):
    """40 silent connections against room for 8: the oldest are closed as new ones come, the
    server never holds more than 8, and a real request still gets its answer."""
    socks = [socket.create_connection(("127.0.0.1", quick.port)) for _ in range(40)]
    try:
        status, answer = raw(quick.port, "GET", "/api/runs", {"Host": f"127.0.0.1:{quick.port}"})
        assert status == 200 and answer["default"] == "mixed"
        assert len(quick.server.server_state.connections) <= 8
        closed = sum(closed_by_server(s, b"", bound_s=0.1)[0] for s in socks[:30])
        assert closed >= 30 - 8
    finally:
        for s in socks:
            s.close()


def test_past_the_cap_the_connection_that_waited_longest_goes(runs):
    """Four silent connections at a cap of 4, opened one after another (long deadlines, so none
    closes by itself): a fifth makes the first close, the one that has waited longest, and no other."""
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs), Limits(request_seconds=600, idle_seconds=600, connections=4)) as s:
        socks = []
        try:
            for n in range(1, 6):
                socks.append(socket.create_connection(("127.0.0.1", s.port)))
                # each accepted before the next, so their waits are in the order they were opened
                assert wait_until(lambda: len(s.server.server_state.connections) >= min(n, 4))
                time.sleep(0.05)
            closed = select.select(socks, [], [], 30)[0]
            assert closed == [socks[0]] and socks[0].recv(1) == b""
            assert select.select(socks[1:], [], [], 0.5)[0] == []  # the others are still open, and silent
        finally:
            for sock in socks:
                sock.close()


@pytest.mark.slow
def test_a_flood_of_half_open_connections_leaves_the_server_reachable_and_quiet(command, untouched):
    """600 silent connections, more than the command's 256 file descriptors: without the cap the
    accept loop runs out of them, logs a traceback per try, and answers nobody. With it, a
    request is answered meanwhile, and stderr stays empty."""
    socks = []
    try:
        for _ in range(600):
            socks.append(socket.create_connection(("127.0.0.1", command.port), timeout=30))
        status, answer = raw(command.port, "GET", "/api/runs", {"Host": f"127.0.0.1:{command.port}"})
        assert status == 200 and answer["default"] == "mixed"
        open_fds = len(list(Path(f"/proc/{command.proc.pid}/fd").iterdir()))
        assert open_fds < 256
    finally:
        for s in socks:
            s.close()
    assert command.stderr() == ""


# ------------------------------------------------------------------------------ what the listing reads


def test_a_symlink_to_a_run_inside_the_folder_is_not_listed(tmp_path, runs):
    """One name per run: a link to a run in the same folder is neither listed nor served (it
    would show one run twice, and a link's target can change under the server)."""
    from scratchlm.serve.library import RunLibrary, UnknownRun

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "real")
    (folder / "alias").symlink_to(folder / "real", target_is_directory=True)
    (folder / "relative").symlink_to("real", target_is_directory=True)
    library = RunLibrary(runs=folder)
    assert [e.name for e in library.entries()] == ["real"]
    for name in ("alias", "relative"):
        with pytest.raises(UnknownRun, match="no run named"):
            library.entry(name)


@pytest.mark.parametrize("name", ["..", ".", "../outer", "real/..", "x/../real", "..\\real", "real\x00"])
def test_a_run_name_that_is_a_path_never_reaches_a_run(tmp_path, runs, name):
    """The runs folder sits inside a run here, so `..` names a real run: it is refused as a
    path, whatever lies there, before any lookup."""
    from scratchlm.serve.library import RunLibrary, UnknownRun

    outer = tmp_path / "outer"
    shutil.copytree(runs / "mixed", outer)
    shutil.copytree(runs / "mixed", outer / "runs" / "real")
    library = RunLibrary(runs=outer / "runs")
    assert [e.name for e in library.entries()] == ["real"]
    with pytest.raises(UnknownRun, match="is a path; a run is named by its folder's name alone"):
        library.entry(name)


def test_the_listing_never_reads_a_checkpoint_linked_from_outside(tmp_path, runs):
    """A run whose checkpoint folder is a symlink out of --runs: listed with an error, and
    nothing of the outside config (its step, its model) in the listing."""
    from scratchlm.checkpoint import latest_checkpoint
    from scratchlm.serve.library import RunLibrary, UnknownRun

    folder = tmp_path / "runs"
    shutil.copytree(runs / "mixed", folder / "sneaky")
    ckpt = latest_checkpoint(folder / "sneaky")
    outside = tmp_path / "elsewhere"
    shutil.move(ckpt, outside)
    config = json.loads((outside / "config.json").read_text())
    config["step"] = 987654
    (outside / "config.json").write_text(json.dumps(config))
    ckpt.symlink_to(outside, target_is_directory=True)
    library = RunLibrary(runs=folder)
    (entry,) = library.entries()
    shown = library.describe(entry)
    assert shown["step"] is None and shown["model"] is None and "outside the served folder" in shown["error"]
    assert "987654" not in json.dumps(shown) and str(tmp_path) not in json.dumps(shown)
    with pytest.raises(UnknownRun, match="outside"):
        library.load("sneaky")


def test_one_bad_run_never_hides_the_others(tmp_path, runs):
    from scratchlm.checkpoint import latest_checkpoint
    from scratchlm.serve.library import RunLibrary

    folder = tmp_path / "runs"
    for name in ("good", "torn", "binary"):
        shutil.copytree(runs / "mixed", folder / name)
    (latest_checkpoint(folder / "torn") / "config.json").write_text('{"model": {"n_layer": 2', encoding="utf-8")
    (folder / "binary" / "latest").write_bytes(b"\xff\xfe\x00")
    with Served(RunLibrary(runs=folder)) as s:
        host = {"Host": f"127.0.0.1:{s.port}"}
        status, answer = raw(s.port, "GET", "/api/runs", host)
        assert status == 200
        shown = {r["name"]: r for r in answer["runs"]}
        assert shown["good"]["step"] == 40 and "error" not in shown["good"]
        assert shown["torn"]["step"] is None and "not valid JSON" in shown["torn"]["error"]
        assert shown["binary"]["step"] is None and shown["binary"]["error"] == "a file of it that should be text is not"
        assert str(tmp_path) not in json.dumps(answer)
        assert raw(s.port, "GET", "/api/model?run=good", host)[0] == 200
        status, answer = raw(s.port, "GET", "/api/model?run=binary", host)
        one_line_refusal(status, answer, 400, "run binary: a file of it that should be text is not")


# ------------------------------------------------------------------------------ the training tab


def test_a_metrics_line_longer_than_a_poll_is_skipped_and_said(tmp_path):
    """A 3 MB line between two records: the polls go past it, say where it was, and read on;
    a line that is not JSON is named too. Without the skip every poll returns the same offset."""
    from scratchlm.serve.app import Limits, training_data

    metrics = tmp_path / "metrics.jsonl"
    lines = [b'{"event": "train", "step": 1}\n', b'{"event": "sample", "text": "' + b"x" * 3_000_000 + b'"}\n',
             b'{"event": "train", "step": 2}\n', b"{torn\n", b'{"event": "train", "step": 3}\n']
    metrics.write_bytes(b"".join(lines))
    records, skipped, since = [], [], 0
    for _ in range(10):  # 3 polls suffice: the limit per poll is 2 MiB
        answer = training_data(tmp_path, metrics, since, Limits())
        records += answer["records"]
        skipped += answer["skipped"]
        if answer["next"] == since == metrics.stat().st_size:
            break
        since = answer["next"]
    assert [r["step"] for r in records] == [1, 2, 3]
    starts = [sum(len(line) for line in lines[:i]) for i in range(len(lines))]
    assert skipped == [{"at": starts[1], "why": "a line longer than 2,097,152 bytes"},
                       {"at": starts[3], "why": "not a JSON line"}]


def test_a_poll_from_inside_a_line_starts_at_the_next(tmp_path):
    from scratchlm.serve.app import Limits, training_data

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(b'{"step": 1}\n{"step": 2}\n')
    answer = training_data(tmp_path, metrics, 5, Limits())
    assert [r["step"] for r in answer["records"]] == [2] and answer["next"] == 24 and answer["skipped"] == []


# ------------------------------------------------------------------------------ a stream stopped early


def test_a_stream_stopped_before_it_began_reports_no_time():
    """Stopped before its first step, a stream has run for no time: "seconds" is 0, not the
    clock's reading since the machine started."""
    import asyncio
    from types import SimpleNamespace

    from scratchlm.serve.streams import GenerateRequest, GenerationStream

    loop = asyncio.new_event_loop()
    try:
        stream = GenerationStream(SimpleNamespace(model=None, tokenizer=None, labels=None),
                                  GenerateRequest(prompt="x", max_new_tokens=5, seed=1), loop)
        stream.cancel.set()
        assert stream.advance() is False
    finally:
        loop.close()
    events = [e for e in stream.made if e is not None]
    assert len(events) == 1 and events[0].startswith("event: done\n")
    done = json.loads(events[0].split("data: ", 1)[1])
    assert done == {"reason": "stopped", "tokens": 0, "seconds": 0.0, "first_token_seconds": None, "text": "",
                    "logprob": None}


def test_connections_idle_after_their_answer_make_room_too(runs):
    """Four connections at the cap of 4, each answered and then idle (long timeouts here, so
    none closes by itself): a fifth client is answered, an idle one closed for it, not refused."""
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs), Limits(request_seconds=600, idle_seconds=600, connections=4)) as s:
        held = [http.client.HTTPConnection("127.0.0.1", s.port, timeout=60) for _ in range(4)]
        for conn in held:
            conn.request("GET", "/api/runs")
            assert conn.getresponse().read() and conn.sock is not None  # kept open for the next request
        status, answer = raw(s.port, "GET", "/api/runs", {"Host": f"127.0.0.1:{s.port}"})
        assert status == 200 and answer["default"] == "mixed"
        closed = select.select([conn.sock for conn in held], [], [], 60)[0]
        assert closed and all(sock.recv(1) == b"" for sock in closed)
        for conn in held:
            conn.close()


def test_a_listener_at_its_ceiling_is_not_asked_again_at_once():
    """At its ceiling the listener must make asyncio stop watching it for a while (an EMFILE:
    asyncio looks again a second later) and end asyncio's turn of tries (a BlockingIOError). A
    BlockingIOError alone left it watched while connections waited in the kernel's queue, and the
    loop called accept() again at once, over and over, spinning a core (31,834 calls in a quarter
    second here); an EMFILE alone made asyncio try `backlog` times a turn, each setting a timer.
    Counted, not timed: 3 clients, a ceiling of 1, a quarter of a second; then the server closes
    with asyncio's timer to watch again still set, which must fire without a word."""
    import asyncio

    from scratchlm.serve.guard import Listener, quiet_accept_errors

    calls, errors, loud = [], [], []

    class Counting(Listener):
        def accept(self):
            calls.append(1)
            return super().accept()

    async def main():
        loop = asyncio.get_running_loop()
        quiet_accept_errors(loop)
        quiet = loop.get_exception_handler()
        loop.set_exception_handler(lambda lp, ctx: (errors.append(ctx.get("message")), quiet(lp, ctx)))
        loop.default_exception_handler = loud.append  # what the quiet handler passes on would be logged
        sock = Counting(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        sock.ceiling = 1
        server = await asyncio.start_server(lambda r, w: None, sock=sock, backlog=100)
        clients = [socket.create_connection(sock.getsockname()) for _ in range(3)]
        await asyncio.sleep(0.25)
        tries = len(calls)
        server.close()  # the listener is closed; asyncio's timer to watch it again is still set
        await asyncio.sleep(1.2)
        for c in clients:
            c.close()
        return tries

    tries = asyncio.run(main())
    assert tries == 3, f"{tries} accept() calls: one accepted, one AtCeiling, one BlockingIOError"
    assert len(errors) == 2 and loud == []  # the AtCeiling and the late timer, both said nothing of

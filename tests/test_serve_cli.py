"""The `scratchlm serve` command as a process (scratchlm/serve/cli.py): the address it prints and
binds, the torch threads it takes, a warning for another host, bad flags and a port in use as one
line, and Ctrl-C with streams open."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import JSON, request, start_serve


# ------------------------------------------------------------------------------ the command


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
    proc, line = start_serve("--runs", str(runs), "--port", "0")
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
    proc, line = start_serve("--checkpoint", str(runs / "mixed"), "--host", "0.0.0.0", "--port", "0", "--threads", "3")
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


# ------------------------------------------------------------------------------ Ctrl-C


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

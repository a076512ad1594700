"""Real `python -m scratchlm` processes without paying torch's import in each one.

`python -m scratchlm ...` spends about 1.8 s of its life importing torch on a 2-core machine, which
is most of a bad-input case's cost. A `Forker` starts one plain Python process that imports torch
and scratchlm's modules once, runs no torch operation (so no thread pool exists yet), and then,
for each command it is sent, forks a child that changes into the command's folder, takes the
command's environment, and runs `scratchlm/__main__.py` as `python -m scratchlm` would: its own
exit status, its own stdin (/dev/null), stdout and stderr (files the caller names), the end of a
real interpreter (non-daemon threads joined, then atexit handlers).

What differs from a fresh interpreter: the modules are already imported, so
  - anything read at import time (OMP_* and TORCH_* variables, say) comes from the server's
    environment, which is the test process's: commands whose environment differs there in such
    a variable need a real subprocess;
  - what an import would print to stderr is printed once, by the server: so the server refuses
    to start when its imports print anything, rather than let a command's stderr look cleaner
    than a real one's;
  - a command's own import-order checks (flags read before torch loads) are not what these runs
    test; tests/test_startup.py covers those with fresh interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The forking server: reads one JSON command per line on stdin, answers one line with the exit
# status of the child that ran it.
_SERVER = r"""
import atexit, json, os, runpy, signal, sys, tempfile, threading, traceback
out = os.fdopen(os.dup(1), "w")
err = os.dup(2)
said = tempfile.TemporaryFile()
os.dup2(said.fileno(), 1)
os.dup2(said.fileno(), 2)
import torch  # noqa: F401
import safetensors.torch, tokenizers  # noqa: F401
import scratchlm.cli.main, scratchlm.checkpoint, scratchlm.generation.generate, scratchlm.hf.interop, scratchlm.training.train  # noqa: F401
sys.stdout.flush(); sys.stderr.flush()
os.dup2(err, 2)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
said.seek(0)
printed = said.read().decode("utf-8", "replace")
if printed:  # a real process would print this into each command's output: no run here can stand for one
    out.write(json.dumps({"import_output": printed}) + "\n")
    out.flush()
    sys.exit(1)
out.write(json.dumps("ready") + "\n")
out.flush()
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(job["timeout"])  # a hung command dies of SIGALRM: exit status -14
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                   (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                os.dup2(os.open(path, mode, 0o644), fd)
            sys.argv = ["scratchlm", *job["argv"]]
            try:
                runpy.run_module("scratchlm", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                if not isinstance(stop.code, (int, type(None))):
                    print(stop.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
            threading._shutdown()  # as the interpreter ends: non-daemon threads first, then atexit
            atexit._run_exitfuncs()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    out.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    out.flush()
"""


class Forker:
    """One forking server; `run` is safe to call from one thread at a time (use one per worker)."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.lock = threading.Lock()
        first = json.loads(self.proc.stdout.readline() or "null")
        if first != "ready":
            self.proc.wait(timeout=60)
            self.proc.stdin.close()
            self.proc.stdout.close()
            raise RuntimeError(f"the forking server did not start cleanly: {first!r}")

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], stderr: Path, stdout: Path,
            timeout: int = 240) -> int:
        """Run `python -m scratchlm *argv` in cwd with exactly env; return its exit status
        (negative: killed by that signal)."""
        job = dict(argv=argv, cwd=str(cwd), env=env, stderr=str(stderr), stdout=str(stdout), timeout=timeout)
        with self.lock:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the forking server died (exit status {self.proc.poll()})")
        return json.loads(answer)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()

"""The `scratchlm serve` command: start the playground on a local address and print it."""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket
import sys
from pathlib import Path

from scratchlm.errors import UserError

DEFAULT_RUNS = "runs"


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="a web playground: generate token by token, attention, inside, live training")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--runs", metavar="FOLDER",
                        help=f"offer every run in this folder in the model picker (default: ./{DEFAULT_RUNS})")
    source.add_argument("--checkpoint", metavar="DIR", help="offer this one run or checkpoint only")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only; anything else is reachable "
                        "from the network, with no login)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also answer requests addressed to NAME (an /etc/hosts alias, box.local); other names "
                        "are refused, so a foreign page cannot use the playground; repeat for more")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--max-new-tokens", type=int, default=1000, help="the most tokens one request may ask for (default: 1000)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for the model (default: one fewer than torch would take, at least 1: the "
                        "browser showing the page needs a core too)")
    p.set_defaults(run=_run_serve)


def _run_uvicorn(config, model_thread, sock: socket.socket) -> None:
    """uvicorn's server, except that Ctrl-C (or SIGTERM) first ends every open generation with
    its done event (reason "stopped"): the streams then close within the graceful shutdown rather
    than being cancelled mid-response (a traceback, and a reader left without its last event)."""
    import uvicorn

    interrupted = []

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            model_thread.stop_streams()
            interrupted.append(sig == signal.SIGINT)
            super().handle_exit(sig, frame)

    Server(config).run(sockets=[sock])
    # uvicorn raises the signal again once it has shut down, which ends in KeyboardInterrupt (exit
    # 130) unless SIGINT was ignored when the process started (a background job of a script):
    # uvicorn took it over all the same and stopped, so it was a Ctrl-C either way
    if any(interrupted):
        raise KeyboardInterrupt


def _bind(host: str, port: int) -> socket.socket:
    from scratchlm.serve.guard import Listener

    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = Listener(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UserError(f"--host {host}: not an address of this machine") from None
        why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise UserError(f"cannot listen on {host}:{port} ({why}); pick another with --port (0 picks a free one)") from None
    sock.listen(128)
    return sock


def _run_serve(args) -> int:
    # Everything that can be checked without torch is checked first, the address taken last
    # before the models: a typo costs a fraction of a second, and a port in use is found before
    # any loading.
    if args.threads is not None and not 1 <= args.threads <= 4096:
        raise UserError(f"--threads must be between 1 and 4096, got {args.threads}")
    if not 1 <= args.max_new_tokens <= 100_000:
        raise UserError(f"--max-new-tokens must be between 1 and 100000, got {args.max_new_tokens}")
    if args.checkpoint is None and args.runs is None and not Path(DEFAULT_RUNS).is_dir():
        raise UserError(f"no ./{DEFAULT_RUNS} folder here; train a run first (scratchlm train --out_dir "
                        f"{DEFAULT_RUNS}/baby), or give --runs FOLDER or --checkpoint DIR")
    if args.runs is not None and not Path(args.runs).is_dir():
        raise UserError(f"--runs {args.runs}: no such folder")
    if args.checkpoint is not None and not Path(args.checkpoint).exists():
        raise UserError(f"--checkpoint {args.checkpoint}: no such checkpoint or run directory")
    from scratchlm.serve.guard import allowed_name

    args.allow_host = [allowed_name(name) for name in args.allow_host]
    sock = _bind(args.host, args.port)
    try:
        return _serve(args, sock)
    finally:
        sock.close()


def _serve(args, sock: socket.socket) -> int:
    import torch

    from scratchlm.machine.devices import pick_device
    from scratchlm.serve.app import Limits, create_app, server_config
    from scratchlm.serve.guard import is_loopback, local_names
    from scratchlm.serve.library import RunLibrary

    # On a CPU, a model thread team as wide as the machine stalls whenever the browser takes a
    # core (each parallel step waits for its descheduled member); leaving the browser a core
    # measured better on 2 cores (figures: benchmarks/measurements.md).
    torch.set_num_threads(args.threads or max(1, torch.get_num_threads() - 1))
    device = str(pick_device(args.device, allow_mps=False))
    if args.checkpoint is not None:
        library = RunLibrary(checkpoint=args.checkpoint, device=device)
    else:
        library = RunLibrary(runs=args.runs or DEFAULT_RUNS, device=device)
    limits = Limits(max_new_tokens=args.max_new_tokens)
    app = create_app(library, limits, names=(*local_names(args.host), *args.allow_host))
    host, port = sock.getsockname()[:2]
    if not is_loopback(args.host):
        print(f"warning: listening on {args.host}, reachable from other machines; the playground has no login",
              file=sys.stderr, flush=True)
    if ipaddress.ip_address(host).is_unspecified:  # every address: the local one is the one to open here
        host = "::1" if ":" in host else "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    n = len(library.entries())
    threads = torch.get_num_threads()
    print(f"scratchlm playground: http://{shown}:{port}/  ({n} run{'' if n == 1 else 's'}, {threads} torch "
          f"thread{'' if threads == 1 else 's'}; Ctrl-C stops it)", flush=True)
    _run_uvicorn(server_config(app, limits, sock), app.state.model_thread, sock)
    return 0

"""Who the playground answers, and for how long it waits: the checks in front of app.py's routes.

The playground has no login: it is safe because only this machine can reach it (it listens on
loopback unless told otherwise) and because a web page from elsewhere, open in the same browser,
is refused. Such a page can make the browser send requests to 127.0.0.1, by three routes:

- DNS rebinding: its own name is made to resolve to 127.0.0.1, so its scripts read our answers
  as "same origin". The browser still sends that name as Host, so `Guard` answers only Host
  names of this server (loopback names, the address the client connected to; with --host, that
  name and the machine's; and each --allow-host NAME).
- A cross-site request (a form, fetch in no-cors mode): it carries the page's Origin, or a
  Sec-Fetch-Site other than same-origin, and (a form) a body type other than JSON. The API
  answers only its own page (no Origin: a script or curl) and reads only application/json
  bodies, which a foreign page cannot send without a preflight this server never grants.
- Many connections: `GuardedH11` closes a connection that has not sent its whole request within
  Limits.request_seconds, and past Limits.connections the one that has waited longest for its
  request makes room (a page, or a local user, holding sockets open cannot lock the others out);
  `Listener` stops accepting at twice that many, so the process never runs out of file
  descriptors.

Refusals are one JSON line ({"error": ...}) with a 4xx status, logged nowhere.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import re
import socket
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from scratchlm.errors import UserError

try:
    import resource
except ImportError:  # Windows: no descriptor limit to read
    resource = None

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
REFUSED = b'HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n' \
          b'connection: close\r\n\r\n%s'


def host_name(value: str) -> str | None:
    """The name in a Host header (or an Origin's authority) without its port, lowercase, brackets
    off an IPv6 address; None when it is not a host[:port]."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
    else:
        name, colon, port = value.partition(":")
        if colon and not (port.isascii() and port.isdigit()):
            return None
    name = name.rstrip(".")
    return plain_address(name) or None


def plain_address(name: str) -> str:
    """An IPv4 address written as IPv6 (::ffff:a.b.c.d, as a socket bound to :: reports an IPv4
    client's connection) as a.b.c.d; any other name or address as it is."""
    try:
        mapped = ipaddress.IPv6Address(name).ipv4_mapped
    except ValueError:
        return name
    return name if mapped is None else str(mapped)


NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def allowed_name(value: str) -> str:
    """A `--allow-host` value as the Host name it lets in (lowercase, no trailing dot, brackets
    off an IPv6 address); UserError for anything but one bare name or address (no port, no
    wildcard: each name let in is one a foreign page could use after rebinding it)."""
    name = value.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return plain_address(str(ipaddress.ip_address(name)))
    except ValueError:
        pass
    if len(name) > 253 or not NAME.fullmatch(name):
        raise UserError(f"--allow-host {value[:80]!r}: not a host name or address (one name, no port or wildcard; "
                        "e.g. box.local)")
    return name


def is_loopback(host: str) -> bool:
    """Is `host` (a name or address to listen on) reachable from this machine only?"""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(plain_address(host)).is_loopback
    except ValueError:
        return False


def local_names(bind_host: str) -> frozenset[str]:
    """The Host names a server bound to `bind_host` answers besides loopback's: none when bound to
    loopback; else the address or name given and this machine's names."""
    if is_loopback(bind_host):
        return frozenset()
    names = {bind_host, socket.gethostname(), socket.getfqdn()}
    return frozenset(n for n in (host_name(name) for name in names) if n)


class Guard:
    """ASGI middleware: the Host check on every request, and on the API the same-origin and
    JSON-body checks. `names`: Host names answered besides loopback's and the address the client
    connected to (which a rebinding page cannot make its Host: browsers send the page's name)."""

    def __init__(self, app, names: Iterable[str] = ()):
        self.app = app
        self.names = LOOPBACK_NAMES | {plain_address(n.lower()) for n in names}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal is None:
            return await self.app(scope, receive, send)
        status, message = refusal
        body = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope) -> tuple[int, str] | None:
        """(status, reason) of a request this server does not answer; None for one it does."""
        headers: dict[bytes, bytes] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key, value)  # the first of a repeated header; h11 refuses two Hosts
        host = headers.get(b"host", b"").decode("latin-1")
        name = host_name(host)
        connected_to = str((scope.get("server") or ("",))[0]).lower()
        served = self.names | {plain_address(connected_to)}  # ::ffff:a.b.c.d when bound to ::
        if name not in served:
            return 403, (f"this server answers to {', '.join(sorted(self.names))} only, not host "
                         f"{host[:60]!r} (a page served elsewhere cannot use it)")
        if not scope["path"].startswith("/api/"):
            return None  # the page and its files: the same for anyone who may connect
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1") != f"{scope.get('scheme', 'http')}://{host}":
            return 403, f"a request from another page ({origin.decode('latin-1')[:60]}) is refused"
        site = headers.get(b"sec-fetch-site")
        if site is not None and site not in (b"same-origin", b"none"):
            return 403, f"a {site.decode('latin-1')[:20]} request is refused; use the playground's own page"
        if scope["method"] not in ("GET", "HEAD"):
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json":
                return 415, f"the body must be Content-Type application/json, not {kind.decode('latin-1')[:40]!r}"
        return None


def connection_cap(wanted: int) -> int:
    """`wanted`, lowered to a quarter of the file descriptors this process may open: the listener
    stops accepting at twice this (Listener), and the rest are the model's and the files'."""
    if resource is None:
        return wanted
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return wanted if soft == resource.RLIM_INFINITY else max(4, min(wanted, soft // 4))


class AtCeiling(OSError):
    """Listener.accept's refusal at its ceiling: an EMFILE, which makes asyncio stop watching the
    socket and look again a second later. A BlockingIOError alone would leave it watched, and
    with connections waiting in the queue the loop would call accept() again at once, for ever,
    spinning a core. quiet_accept_errors says nothing of it."""


class Listener(socket.socket):
    """A listening socket that accepts nothing while `ceiling` of the connections it accepted
    are open: the others wait in the kernel's queue. asyncio accepts up to its backlog (2,048)
    connections in one turn of the loop, before any protocol can close one, so a cap that acts
    once a connection is made (GuardedH11) cannot alone keep a flood from exhausting the file
    descriptors; and once they are gone, asyncio logs a traceback per failed accept.

    At the ceiling the first try raises AtCeiling: asyncio stops watching the socket and sets one
    timer to watch it again in a second. It then goes on trying within the same turn (each EMFILE
    would set another timer), so the next try raises BlockingIOError, which ends the turn."""

    ceiling: int | None = None  # set by app.server_config; None: no limit

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.accepted: weakref.WeakSet = weakref.WeakSet()
        self.paused = False  # AtCeiling raised, and the turn that raised it not yet ended

    def accept(self):
        if self.ceiling is not None and sum(1 for s in self.accepted if s.fileno() >= 0) >= self.ceiling:
            self.paused = not self.paused
            if self.paused:
                raise AtCeiling(errno.EMFILE, "the listener's ceiling of open connections")  # asyncio looks again in 1 s
            raise BlockingIOError(errno.EAGAIN, "the listener's ceiling of open connections")  # ends asyncio's turn
        self.paused = False
        conn, address = super().accept()
        self.accepted.add(conn)
        return conn, address


def guarded_protocol(request_seconds: float, connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a whole-request deadline and a connection cap (see the module
    docstring). uvicorn's own keep-alive timer closes an idle connection, but is cancelled by the
    first byte of the next request, and no timer runs before a first request: a client sending
    a header a byte at a time, or nothing, would hold its connection for ever."""

    class GuardedH11(H11Protocol):
        waiting_since: float | None = None  # when it began waiting for a request; None while answering
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.watch()
            if len(self.connections) > connections:
                waiting = [c for c in self.connections if c is not self and getattr(c, "waiting_since", None) is not None]
                oldest = min(waiting, key=lambda c: c.waiting_since, default=self)
                if oldest is self:  # every other connection is being answered: this one waits its turn
                    body = json.dumps({"error": f"{connections} connections are open; try again"}).encode()
                    transport.write(REFUSED % (len(body), body))
                oldest.drop()

        def drop(self) -> None:
            self.connections.discard(self)
            self.unwatch()
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self.watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.watch()  # idle again: the first to make room when the cap is reached

        def connection_lost(self, exc) -> None:
            self.unwatch()
            super().connection_lost(exc)

        def watch(self) -> None:
            """Start the deadline when the connection begins waiting for a request (on opening,
            after an answer); stop it once the request is whole (its answer may stream for minutes)."""
            if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
                self.unwatch()
            elif self.deadline is None:
                self.waiting_since = self.loop.time()
                self.deadline = self.loop.call_later(request_seconds, self.too_slow)

        def unwatch(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            self.deadline = self.waiting_since = None

        def too_slow(self) -> None:
            self.deadline = None
            if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                self.drop()  # a request still in parts reaches the app as a disconnect

    return GuardedH11


def _watch_again_after_close(context: dict[str, Any]) -> bool:
    """Whether the error is asyncio's timer to watch the listener again (set after an AtCeiling)
    firing once the server has closed the listener, in its graceful shutdown: asyncio does not
    cancel that timer, and the closed socket's fileno of -1 is a ValueError. The handle is read
    through its private fields: asyncio gives no other way to tell whose timer it was."""
    handle = context.get("handle")
    callback, args = getattr(handle, "_callback", None), getattr(handle, "_args", None) or ()
    return (isinstance(context.get("exception"), ValueError) and getattr(callback, "__name__", "") == "_start_serving"
            and any(isinstance(a, Listener) and a.fileno() < 0 for a in args))


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio logs a traceback for each failed accept() when the process is out of file
    descriptors, up to the backlog's length per loop turn; say it in one line, once a minute."""
    said = [-60.0]

    def handler(loop, context: dict[str, Any]) -> None:
        if _watch_again_after_close(context):
            return None
        if context.get("message") != "socket.accept() out of system resource":
            return loop.default_exception_handler(context)
        if isinstance(context.get("exception"), AtCeiling):
            return None  # the server's own limit, not the machine's: nothing to say
        if loop.time() - said[0] >= 60:
            said[0] = loop.time()
            print(f"warning: out of file descriptors ({context.get('exception')}); new connections wait",
                  file=sys.stderr, flush=True)

    loop.set_exception_handler(handler)

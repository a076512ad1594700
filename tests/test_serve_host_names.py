"""Who the playground answers besides loopback names: the address an IPv4 client reached on a
server bound to :: (a dual-stack socket reports it as ::ffff:a.b.c.d), and names let in with
--allow-host. The rest of the Host rule is tested in test_serve_hardening.py."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from helpers import Served, one_line_refusal, raw, start_serve


def test_allow_host_takes_one_bare_name_or_address():
    from scratchlm.errors import UserError
    from scratchlm.serve.guard import Guard, allowed_name

    assert [allowed_name(v) for v in ["Box.Local.", "[::1]", "::ffff:10.0.0.1", "my_host", "a-b.c"]] == [
        "box.local", "::1", "10.0.0.1", "my_host", "a-b.c"]
    for bad in ["", "*", "*.local", "a b", "box.local:8000", "http://box.local", "-a", "a..b", "x/y", "a" * 254]:
        with pytest.raises(UserError, match="not a host name or address"):
            allowed_name(bad)
    guard = Guard(None, [allowed_name("box.local")])
    scope = lambda host: {"type": "http", "path": "/api/runs", "method": "GET",  # noqa: E731
                          "headers": [(b"host", host.encode())], "server": ("127.0.0.1", 8000)}
    assert guard.refusal(scope("BOX.local:8000")) is None and guard.refusal(scope("other.local:8000"))[0] == 403


def test_the_command_answers_an_allowed_name_and_no_other(runs):
    """`--allow-host box.local`: an /etc/hosts alias of this machine is answered, with the page's
    own Origin; any other name is still refused."""
    proc, line = start_serve("--runs", str(runs), "--port", "0", "--allow-host", "box.local")
    try:
        port = int(line.split(":")[3].split("/")[0])
        status, answer = raw(port, "GET", "/api/runs", {"Host": f"box.local:{port}",
                                                        "Origin": f"http://box.local:{port}"})
        assert status == 200 and [r["name"] for r in answer["runs"]] == ["mixed"], answer
        one_line_refusal(*raw(port, "GET", "/api/runs", {"Host": f"other.local:{port}"}), 403, "this server answers to")
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.stderr.read() == ""


def test_an_ipv4_client_of_a_dual_stack_server_may_use_the_address_it_connected_to():
    """Bound to ::, a socket reports an IPv4 client's connection as ::ffff:a.b.c.d; the Host the
    client sends is a.b.c.d, the address it typed, and must be answered (written the IPv6 way too)."""
    from scratchlm.serve.guard import Guard, host_name, local_names

    assert host_name("[::ffff:10.1.2.3]:8000") == "10.1.2.3" and host_name("[::ffff:a01:203]") == "10.1.2.3"
    guard = Guard(None, local_names("::"))
    scope = lambda host, server: {"type": "http", "path": "/api/runs", "method": "GET",  # noqa: E731
                                  "headers": [(b"host", host.encode())], "server": (server, 8000)}
    for host in ["10.1.2.3:8000", "10.1.2.3", "[::ffff:10.1.2.3]:8000"]:
        assert guard.refusal(scope(host, "::ffff:10.1.2.3")) is None, host
    for host in ["10.1.2.4:8000", "attacker.test:8000", "[::ffff:10.1.2.4]:8000"]:
        assert guard.refusal(scope(host, "::ffff:10.1.2.3"))[0] == 403, host
    assert guard.refusal(scope("[fe80::1]:8000", "fe80::1")) is None  # a plain IPv6 address as before


def test_a_server_bound_to_every_address_answers_an_ipv4_client_by_its_address(runs):
    """The same through a real socket bound to :: (dual stack), an IPv4 client at 127.0.0.2: an
    address of this machine that is not one of the loopback names the guard answers anyway."""
    from scratchlm.serve.library import RunLibrary

    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with Served(RunLibrary(runs=runs), host="::") as s:
        try:
            conn = http.client.HTTPConnection("127.0.0.2", s.port, timeout=60)
            conn.connect()
        except OSError as exc:
            pytest.skip(f"127.0.0.2 is not reachable here ({exc})")
        conn.request("GET", "/api/runs")  # Host: 127.0.0.2:PORT
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        conn.close()
    assert resp.status == 200 and [r["name"] for r in answer["runs"]] == ["mixed"], answer

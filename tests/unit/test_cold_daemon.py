"""A cold daemon serves before mitmproxy is loaded (issue 25), and fails closed if it cannot be.

The daemon (netguard.daemon.serve) runs in this process's main thread with mitmproxy's load held
(netguard.daemon.mitmload) until the test lets it go: while held, an allowed CONNECT is relayed by
the front door (the upstream sees it), and so is a plain HTTP/1.1 GET (netguard.daemon.plainhttp), and
`status` says "loading"; an HTTP/1.0 request, which only mitmproxy serves, waits in its socket and is
answered once the load is released. If the load fails, what mitmproxy would have served is closed
unanswered (the upstream sees nothing) and the daemon stops.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netguard.daemon import control, mitmload, serve
from netguard.daemon.control import ControlClient, DaemonSocket
from netguard.relay import relaypool

from ..support.daemonfake import Box, Web, eventually, http_get, raw


class Held:
    """What Box needs of a daemon (`path`, `client`), for one served from this process."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def client(self) -> ControlClient:
        return ControlClient.connect(self.path, timeout=10)


def run_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: Callable[[Held, threading.Event], None]) -> str:
    """Serve a daemon here while `body(daemon, release)` runs on a thread; the load waits for `release`."""
    release = threading.Event()
    real = mitmload.Mitm._load

    async def held(self: mitmload.Mitm) -> None:
        await asyncio.to_thread(release.wait, 30)
        await real(self)

    monkeypatch.setattr(mitmload.Mitm, "_load", held)
    monkeypatch.setattr(relaypool.Pool, "start", lambda self, n=0: None)  # no worker processes of this test's
    path = tmp_path / "d.sock"
    listener = DaemonSocket(str(path))
    assert listener.claim()
    d = serve.Daemon(listener, 0)
    failure: list[BaseException] = []

    def drive() -> None:
        try:
            body(Held(path), release)
        except BaseException as e:  # reported by the test below, after the daemon stopped
            failure.append(e)
        finally:
            release.set()
            d._stop("test over")

    async def main() -> None:
        thread = threading.Thread(target=drive)
        loop = asyncio.get_running_loop()
        loop.call_soon(thread.start)  # once run() is serving
        await d.run(None)
        await asyncio.to_thread(thread.join, 30)

    asyncio.run(main())
    if listener.sock is not None:
        listener.release()
    if failure:
        raise failure[0]
    return d.mitm.state()


def connect_get(port: int, web: Web) -> bytes:
    """A CONNECT to the web server through the explicit listener, then one GET inside the tunnel."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"CONNECT 127.0.0.1:{web.port} HTTP/1.1\r\nHost: 127.0.0.1:{web.port}\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def get_10(port: int, web: Web) -> tuple[int, str]:
    """An HTTP/1.0 GET through the explicit proxy: not the front door's (plainhead takes HTTP/1.1 only)."""
    return http_get(port, f"http://127.0.0.1:{web.port}/", version="HTTP/1.0")


def allow(web: Web) -> dict[str, Any]:
    return {"allow": [{"cidr": "127.0.0.0/8", "ports": [web.port]}]}


def test_a_connect_and_plain_http_are_served_while_mitmproxy_loads_and_the_rest_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, web: Web
) -> None:
    def body(d: Held, release: threading.Event) -> None:
        b = Box(d, "cold", allow(web))  # type: ignore[arg-type]  # Held has what Box uses of a Daemon
        assert raw(b.client, {"op": "status"})["mitmproxy"] == "loading"
        assert connect_get(b.regular, web).endswith(b"hello from web")  # the front door: no mitmproxy needed
        assert web.hits[0] == 1
        assert b.get(f"http://127.0.0.1:{web.port}/") == (200, "hello from web")  # plain HTTP/1.1: the front door's
        assert web.hits[0] == 2
        got: list[tuple[int, str]] = []
        t = threading.Thread(target=lambda: got.append(get_10(b.regular, web)))
        t.start()
        t.join(0.5)
        assert not got and web.hits[0] == 2  # HTTP/1.0 is mitmproxy's: it waits, queued in its socket
        assert raw(b.client, {"op": "status"})["mitmproxy"] == "loading"
        release.set()
        t.join(20)
        assert got == [(200, "hello from web")] and web.hits[0] == 3
        assert eventually(lambda: raw(b.client, {"op": "status"})["mitmproxy"] == "ready")
        kinds = [(r["kind"], r["action"]) for r in b.decisions()]
        assert kinds == [("connect", "allow"), ("http", "allow"), ("http", "allow")]
        b.client.close()

    assert run_held(tmp_path, monkeypatch, body) == "ready"


def test_a_daemon_that_cannot_load_mitmproxy_closes_what_needs_it_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, web: Web
) -> None:
    monkeypatch.setattr(mitmload, "MODULE", "netguard.daemon.no_such_module")

    def body(d: Held, release: threading.Event) -> None:
        b = Box(d, "broken", allow(web))  # type: ignore[arg-type]
        got: list[Any] = []

        def plain() -> None:
            try:
                got.append(get_10(b.regular, web))
            except (OSError, IndexError, ValueError) as e:  # closed unanswered: nothing to parse
                got.append(e)

        t = threading.Thread(target=plain)
        t.start()
        release.set()
        t.join(20)
        assert len(got) == 1 and not isinstance(got[0], tuple), got  # fail closed: no answer, no relay
        assert web.hits[0] == 0  # the upstream never saw it
        with pytest.raises((OSError, control.ControlError)):  # the daemon stopped: its socket is gone
            for _ in range(50):
                raw(b.client, {"op": "status"})
                threading.Event().wait(0.1)

    assert run_held(tmp_path, monkeypatch, body) == "failed"


def test_status_says_whether_mitmproxy_is_loaded(capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.run.housekeeping import _print_status
    from netguard.daemon.status import parse_status

    reply: dict[str, Any] = {"ok": True, "pid": 7, "uptime": 0.1, "bindings": [], "mitmproxy": "loading"}
    st = parse_status(reply)
    assert st.get("mitmproxy") == "loading"
    _print_status(st, Path("/run/x.sock"))
    assert "; mitmproxy: loading;" in capsys.readouterr().out
    _print_status(parse_status({**reply, "mitmproxy": "ready"}), Path("/run/x.sock"))
    assert "mitmproxy" not in capsys.readouterr().out  # the usual case says nothing
    assert "mitmproxy" not in parse_status({**reply, "mitmproxy": "\x1b[2J"})  # a daemon of other code: dropped

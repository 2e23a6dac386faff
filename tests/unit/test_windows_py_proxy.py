"""The proxy child of a Windows run (`python -P -m launcher.cli proxy ...`, as runner._proxy_argv builds it),
started for real in an interpreter made to look like CPython on Windows (tests/support/winpython.py):
no POSIX-only names, a default event loop without add_reader, SO_RCVLOWAT refused (issue 28, win-py P6).

It must get ready on its line, and a CONNECT through its front door must be decided (a 403 for a name the
policy does not allow, recorded in the audit log). Loopback only; nothing is resolved (the name is denied
by the rules first). The control test runs the same child on asyncio's default loop, which is what the
proxy used before: it must fail, so the check bites.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.run.windows import runner
from netguard.daemon import standalone
from tests.support import winpython

REPO = Path(__file__).resolve().parent.parent.parent
READY_TIMEOUT = 60.0  # mitmproxy's import on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _argv(tmp: Path, port: int, extra: str = "", allow: tuple[str, ...] = ("example.test",)) -> list[str]:
    """runner's own argv for the child, its `-m launcher.cli` run behind the Windows prelude."""
    api = SimpleNamespace(python=lambda: sys.executable)
    args = SimpleNamespace(
        policy=SimpleNamespace(policy=(), allow=allow, deny=(), allow_wide_cidr=False),
        learn=False,
        upstream_ca=None,
    )
    argv = list(runner._proxy_argv(api, args, "winpytask", str(tmp / "audit.jsonl")))  # type: ignore[arg-type]
    assert argv[1:4] == ["-P", "-m", "launcher.cli"]  # -P: never the workspace's modules (win-py P7)
    code = f"{winpython.PRELUDE}; {extra}from launcher import cli; sys.exit(cli.main(sys.argv[1:]))"
    return [sys.executable, "-P", "-c", code, str(REPO), *argv[4:], "--listen", f"127.0.0.1:{port}"]


def _start(
    tmp: Path, port: int, extra: str = "", allow: tuple[str, ...] = ("example.test",)
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _argv(tmp, port, extra, allow),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp,
    )


def _ready(child: subprocess.Popen[bytes]) -> dict[str, object] | None:
    """The ready line, read in a thread as realapi.await_proxy does (a pipe cannot be select()ed on Windows)."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(child.stdout.readline() if child.stdout else b""), daemon=True)
    reader.start()
    reader.join(READY_TIMEOUT)
    return json.loads(got[0]) if got and got[0] else None


def _stop(child: subprocess.Popen[bytes]) -> str:
    child.kill()  # TerminateProcess, as realapi.stop_proxy does on Windows
    _, err = child.communicate(timeout=30)
    return err.decode(errors="replace")


def test_the_proxy_child_gets_ready_and_decides_under_windows_python(tmp_path: Path) -> None:
    port = _free_port()
    child = _start(tmp_path, port)
    try:
        ready = _ready(child)
        assert ready is not None and ready["ready"] is True, _stop(child)[-3000:]
        with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
            c.sendall(b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n")
            answer = c.recv(4096)
    finally:
        err = _stop(child)
    assert answer.startswith(b"HTTP/1.1 403"), (answer, err[-3000:])
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_bytes().splitlines()]
    assert [(r.get("host"), r.get("action")) for r in records if r.get("event") == "decision"] == [
        ("denied.test", "deny")
    ]
    assert b"\r\n" not in (tmp_path / "audit.jsonl").read_bytes()  # one LF per record, as on Linux
    assert "Traceback" not in err and "front door: closed a connection" not in err, err[-3000:]


@pytest.mark.parametrize(
    "extra, says",
    [
        # the proxy as it was: asyncio's default loop (the Proactor one on Windows)
        (
            "from netguard.daemon import standalone; standalone.loop_factory = lambda platform=None: None; ",
            "add_reader",
        ),
    ],
)
def test_on_the_default_windows_loop_the_child_never_gets_ready(tmp_path: Path, extra: str, says: str) -> None:
    child = _start(tmp_path, _free_port(), extra)
    try:
        ready = _ready(child)
    finally:
        err = _stop(child)
    assert ready is None and says in err, err[-3000:]


def test_with_a_low_water_mark_every_connection_would_be_closed(tmp_path: Path) -> None:
    """The control of peek's Windows branch: SO_RCVLOWAT set as on Linux fails (WSAEINVAL) and the front door
    closes the connection unanswered, so the 403 above is evidence that the branch is taken."""
    port = _free_port()
    linux = "import types; from netguard.daemon import peek; peek.sys = types.SimpleNamespace(platform='linux'); "
    child = _start(tmp_path, port, linux)
    try:
        assert _ready(child) is not None
        with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
            c.sendall(b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n")
            try:
                answer = c.recv(4096)
            except ConnectionResetError:  # closed with the request unread: a reset
                answer = b""
    finally:
        err = _stop(child)
    assert answer == b"" and "closed a connection after an error" in err and ("WSAEINVAL" in err or "10022" in err), (
        err[-3000:]
    )


def test_the_hosts_own_addresses_on_windows_come_from_getaddrinfo_of_the_empty_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No netlink there: the veto table is what getaddrinfo("") lists, scope ids dropped, duplicates once."""
    from netguard import localaddrs

    asked: list[object] = []

    def lookup(host: object, *rest: object) -> list[tuple[object, ...]]:
        asked.append(host)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.10", 0)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%12", 0, 0, 12)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.10", 0)),
        ]

    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    got = [str(n) for n in localaddrs.read_local()]
    assert asked == [""] and got == ["192.0.2.10/32", "fe80::1/128"]
    table = localaddrs.LocalAddrs().table()  # and the proxy's veto table holds them
    import ipaddress

    assert table.lookup(ipaddress.ip_address("192.0.2.10")) is not None
    assert table.lookup(ipaddress.ip_address("192.0.2.11")) is None


def test_an_inspecting_policy_writes_its_ca_certificate(tmp_path: Path) -> None:
    """The CA file is opened without O_NOFOLLOW/O_CLOEXEC there (win-py P6) and named on the ready line."""
    child = _start(tmp_path, _free_port(), allow=("npm-readonly",))  # a bundled list whose hosts are inspected
    try:
        ready = _ready(child)
    finally:
        err = _stop(child)
    assert ready is not None and "Traceback" not in err, err[-3000:]
    ca = Path(str(ready["ca"]))
    assert ca.parent == tmp_path and b"BEGIN CERTIFICATE" in ca.read_bytes()


def test_a_module_planted_in_the_workspace_is_never_imported_by_the_proxy(tmp_path: Path) -> None:
    """The child runs in sandgate's cwd, the workspace the sandbox user may write (win-py P7): with runner's
    `-P` a json.py there is not imported; the control, the same argv without -P, imports it."""
    (tmp_path / "json.py").write_text("raise SystemExit('sandgate-planted json.py ran as the real user')\n")
    child = _start(tmp_path, _free_port())
    try:
        ready = _ready(child)
    finally:
        err = _stop(child)
    assert ready is not None and "sandgate-planted" not in err, err[-3000:]
    argv = _argv(tmp_path, _free_port())
    argv.remove("-P")
    control = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert control.returncode != 0 and "sandgate-planted json.py ran as the real user" in control.stderr


def _flood(port: int, n: int) -> list[socket.socket]:
    """n silent clients: each one a socket the proxy waits on (its head deadline is seconds away)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(n)]


@pytest.mark.parametrize("budgeted", [True, False], ids=["budget", "control-no-budget"])
def test_more_connections_than_select_can_wait_on_are_refused_not_a_dead_proxy(tmp_path: Path, budgeted: bool) -> None:
    """On Windows the proxy's loop waits with select(), 512 sockets a set (winpython.WindowsSelectSelector): 600
    silent clients past it would stop the loop and the run's whole network. With the budget, connections past
    the sandbox's share are closed at once and recorded, and the proxy still decides the next CONNECT; the
    control (no budget, the proxy before) dies of select()'s ValueError, so the limit is what the test meets."""
    port = _free_port()
    extra = "" if budgeted else "from netguard.daemon import standalone; standalone.budget = lambda p=None: None; "
    child = _start(tmp_path, port, extra)
    clients: list[socket.socket] = []
    answer = b""
    try:
        assert _ready(child) is not None
        clients = _flood(port, 600)
        deadline = time.monotonic() + (20 if budgeted else 3)
        while time.monotonic() < deadline and child.poll() is None:  # the proxy takes them, or its loop stops
            refused = sum(1 for c in clients if _closed(c))
            if budgeted and refused >= 600 - standalone.WINDOWS_BUDGET // 2:
                break
            time.sleep(0.2)
        alive = child.poll() is None
        for c in clients:
            c.close()
        if alive:  # the closed clients leave the proxy's sets and the share as it reads their ends: retry until
            until = time.monotonic() + (30 if budgeted else 0)  # the share has room again (a busy machine is slow)
            while True:
                time.sleep(0.3)
                answer = _connect_denied(port)
                if answer.startswith(b"HTTP/1.1 403") or time.monotonic() >= until:
                    break
    finally:
        err = _stop(child)
    if not budgeted:  # the loop stopped: no answer, and select()'s own words in the log
        assert not answer.startswith(b"HTTP/1.1 403") and "too many file descriptors in select()" in err, err[-3000:]
        return
    assert alive and answer.startswith(b"HTTP/1.1 403"), (answer, err[-3000:])
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_bytes().splitlines()]
    limited = [r for r in records if r.get("event") == "limit"]
    assert limited and "per-sandbox connection limit (224 open)" in json.dumps(limited), records[-3:]


def _connect_denied(port: int) -> bytes:
    """The proxy's answer to a CONNECT it must refuse; b"" when nobody answers (the control's stopped loop)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
            c.sendall(b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n")
            return c.recv(4096)
    except OSError:
        return b""


def _closed(c: socket.socket) -> bool:
    """The proxy closed this client (refused at accept): a read returns end of file at once."""
    c.setblocking(False)
    try:
        return c.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True

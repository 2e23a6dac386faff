"""The control protocol: messages and fds over SEQPACKET, the blocking client, and where the socket may live."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard.daemon import control, specfd
from netguard.daemon.control import ControlClient, ControlError
from netguard.policy import parse_network
from netguard.spec import BindingSpec, decode

SPEC = BindingSpec("t1", parse_network({"allow": ["a.test"]}, "p.yaml"))


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


# ---- messages -------------------------------------------------------------------------------


def test_message_and_fds_round_trip() -> None:
    a, b = pair()
    r, w = os.pipe()
    with a, b:
        control.send_message(a, {"op": "bind", "x": "é"}, [r, w])
        data, fds, flags = control.recv_raw(b)
        assert control.parse_message(data, flags) == {"op": "bind", "x": "é"}
        assert len(fds) == 2 and flags == 0
        assert all(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC for fd in fds)  # never inherited
        os.write(fds[1], b"hi")
        assert os.read(fds[0], 2) == b"hi"
        control.close_fds([r, w, *fds])
        a.close()
        assert control.recv_raw(b) == (b"", [], 0)  # EOF


def test_parse_message_refuses() -> None:
    with pytest.raises(ValueError, match="larger"):
        control.parse_message(b"{}", socket.MSG_TRUNC)
    with pytest.raises(ValueError, match="larger"):
        control.parse_message(b"{}", socket.MSG_CTRUNC)
    with pytest.raises(ValueError, match="not JSON"):
        control.parse_message(b"\xff{", 0)
    with pytest.raises(ValueError, match="not a JSON object"):
        control.parse_message(b"[1]", 0)
    with pytest.raises(ValueError, match="exceeds"):
        control.send_message(pair()[0], {"x": "a" * control.MAX_MESSAGE})


def test_too_many_fds_are_reported_not_silently_dropped() -> None:
    a, b = pair()
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(control.MAX_FDS + 4)]
    with a, b:
        control.send_message(a, {"op": "bind"}, fds)
        data, got, flags = control.recv_raw(b)
        control.close_fds(fds + got)
        with pytest.raises(ValueError):
            control.parse_message(data, flags)


# ---- the client against a scripted daemon ---------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be longer."""
    d = Path(tempfile.mkdtemp(prefix="sgc"))
    try:
        yield d
    finally:
        shutil.rmtree(d)


class Scripted:
    """A daemon stand-in answering each request with the next scripted reply (None: hang up)."""

    def __init__(self, path: Path, replies: list[dict[str, Any] | None]) -> None:
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.srv.bind(str(path))
        self.srv.listen(1)
        self.got: list[tuple[dict[str, Any], int]] = []
        self.replies = replies
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn, _ = self.srv.accept()
        with conn:
            for reply in self.replies:
                data, fds, flags = specfd.expand(*control.recv_raw(conn))  # a bind's spec comes in a memfd
                self.got.append((control.parse_message(data, flags), len(fds)))
                control.close_fds(fds)
                if reply is None:
                    return
                control.send_message(conn, reply)


def test_client_requests_and_replies(short_dir: Path) -> None:
    path = short_dir / "d.sock"
    status = {"ok": True, "pid": 1, "uptime": 2.0, "bindings": []}
    srv = Scripted(path, [{"ok": True}, status, {"ok": False, "error": "nope: bad thing"}, {"ok": True}, None])
    files = [os.open("/dev/null", os.O_RDONLY) for _ in control.BIND_FDS]
    with ControlClient.connect(path, timeout=5) as c:
        c.bind(SPEC, files)
        assert c.status() == status
        with pytest.raises(ControlError, match=r"^nope: bad thing$"):
            c.end()
        c.stop()
        with pytest.raises(ControlError, match="closed the connection"):
            c.status()
        assert isinstance(c.fileno(), int)
    control.close_fds(files)
    srv.thread.join(5)
    (bind, nfds), *rest = srv.got
    assert bind["op"] == "bind" and nfds == 5 and decode(bind["spec"]) == SPEC
    assert [m["op"] for m, _ in rest] == ["status", "end", "stop", "status"]


def test_client_checks_fd_count_and_unreachable_daemon(short_dir: Path) -> None:
    with pytest.raises(ControlError, match="cannot reach the sandgate daemon"):
        ControlClient.connect(short_dir / "none.sock", timeout=1)
    a, b = pair()
    with a, b, pytest.raises(ControlError, match="needs 5 fds"):
        ControlClient(a).bind(SPEC, [0, 1])


# ---- where the socket lives -----------------------------------------------------------------


def test_socket_path_names_the_network_namespace_and_the_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ino = os.stat("/proc/self/ns/net").st_ino
    first = control.socket_path(tmp_path)
    assert first.parent == tmp_path and first.name.startswith(f"daemon-{ino}-") and first.suffix == ".sock"
    assert control.socket_path(tmp_path) == first  # stable while nothing changes
    monkeypatch.setattr(sys, "executable", "/another/venv/bin/python")
    assert control.socket_path(tmp_path) != first  # another installation: another daemon


def test_runtime_base(tmp_path: Path) -> None:
    uid = os.geteuid()
    assert control.runtime_base({"XDG_RUNTIME_DIR": str(tmp_path)}, uid) == tmp_path / "sandgate"
    # Not ours, not a directory, not absolute: the fallbacks.
    assert control.runtime_base({"XDG_RUNTIME_DIR": str(tmp_path)}, uid + 1) == Path(f"/tmp/sandgate-{uid + 1}")
    (tmp_path / "f").write_text("")
    assert control.runtime_base({"XDG_RUNTIME_DIR": str(tmp_path / "f")}, 0) == Path("/run/sandgate")
    assert control.runtime_base({"XDG_RUNTIME_DIR": "relative"}, 1000) == Path("/tmp/sandgate-1000")
    assert control.runtime_base({}, 0) == Path("/run/sandgate")


def test_private_dir_is_created_0700(tmp_path: Path) -> None:
    d = control.private_dir(tmp_path / "sg")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert control.private_dir(d) == d  # an existing good one is fine


@pytest.mark.parametrize("attack", ["symlink", "mode", "owner", "file"])
def test_private_dir_refuses_squatted_entries(tmp_path: Path, attack: str) -> None:
    target = tmp_path / "sandgate-1000"
    uid = os.geteuid()
    if attack == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "elsewhere")
    elif attack == "mode":
        target.mkdir()
        target.chmod(0o755)
    elif attack == "owner":
        target.mkdir(mode=0o700)
        uid += 1  # as if someone else had created it first
    else:
        target.write_text("")
    with pytest.raises(ControlError) as e:
        control.private_dir(target, uid)
    msg = str(e.value)
    assert msg.startswith(f"refusing the sandgate runtime directory {target}:") and msg.count(".") <= 2
    assert {"symlink": "symbolic link", "mode": "0755", "owner": "belongs to uid", "file": "not a directory"}[
        attack
    ] in msg


def test_runtime_dir_uses_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert control.runtime_dir() == tmp_path / "sandgate"
    (tmp_path / "sandgate").chmod(0o770)
    with pytest.raises(ControlError, match="lets other users in"):
        control.runtime_dir()


def test_control_imports_no_mitmproxy_or_dnspython() -> None:
    code = (
        "import sys, netguard.daemon.control; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mitmproxy', 'dns', 'netguard')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == [
        "netguard",
        "netguard.canonpath",
        "netguard.credentials",
        "netguard.daemon",
        "netguard.daemon.control",
        "netguard.daemon.daemonpath",
        "netguard.daemon.specfd",
        "netguard.daemon.status",
        "netguard.hosts",
        "netguard.httprules",
        "netguard.otlp",  # the run's export settings travel in the spec (issue 27); small, stdlib only
        "netguard.policy",
        "netguard.ruleinvariants",
        "netguard.spec",
        "netguard.upstreamproxy",  # the run's upstream proxy travels in the spec (issue 27); small, stdlib only
    ]


# ---- the daemon's check of passed fds --------------------------------------------------------


def _listener(kind: int = socket.SOCK_STREAM, listen: bool = True, bind: bool = True) -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    if bind:
        s.bind(("127.0.0.1", 0))
    if listen and kind == socket.SOCK_STREAM:
        s.listen(8)
    return s


def _bind_fds(tmp_path: Path, **override: Any) -> list[int]:
    parts: dict[str, Any] = {
        "audit": os.open(tmp_path / "a.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
        "regular": _listener(),
        "transparent": _listener(),
        "dns_udp": _listener(socket.SOCK_DGRAM),
        "dns_tcp": _listener(),
    }
    parts.update(override)
    return [v if isinstance(v, int) else v.detach() for v in (parts[k] for k in control.BIND_FDS)]


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_adopt_fds_accepts_the_right_kinds(tmp_path: Path) -> None:
    fds = _bind_fds(tmp_path)
    p = control.adopt_fds(fds)
    assert p.audit == fds[0] and p.dns_udp.type == socket.SOCK_DGRAM
    for s in (p.regular, p.transparent, p.dns_udp, p.dns_tcp):
        s.close()
    os.close(p.audit)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"audit": "readonly"}, "O_APPEND"),
        ({"audit": "noappend"}, "O_APPEND"),
        ({"audit": "pipe"}, "not a regular file"),
        ({"regular": "notlistening"}, "regular fd is not a listening socket"),
        ({"transparent": "udp"}, "transparent fd is not a TCP socket"),
        ({"dns_udp": "unbound"}, "dns_udp fd is not bound"),
        ({"dns_tcp": "unix"}, "not an IPv4/IPv6 socket"),
        ({"dns_tcp": "file"}, "dns_tcp fd is not a socket"),
    ],
)
def test_adopt_fds_refuses_and_closes_everything(tmp_path: Path, override: dict[str, str], message: str) -> None:
    (tmp_path / "ro").write_text("")
    make: dict[str, Callable[[], int | socket.socket]] = {
        "readonly": lambda: os.open(tmp_path / "ro", os.O_RDONLY | os.O_APPEND),
        "noappend": lambda: os.open(tmp_path / "ro", os.O_WRONLY),
        "pipe": lambda: os.pipe()[0],
        "notlistening": lambda: _listener(listen=False),
        "udp": lambda: _listener(socket.SOCK_DGRAM),
        "unbound": lambda: _listener(socket.SOCK_DGRAM, bind=False),
        "unix": lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
        "file": lambda: os.open(tmp_path / "ro", os.O_RDONLY),
    }
    fds = _bind_fds(tmp_path, **{k: make[v]() for k, v in override.items()})
    with pytest.raises(control.BindError, match=message):
        control.adopt_fds(fds)
    assert all(_closed(fd) for fd in fds)  # a refused bind leaves nothing open in the daemon


def test_adopt_fds_refuses_wrong_count_and_duplicates(tmp_path: Path) -> None:
    fds = _bind_fds(tmp_path)
    with pytest.raises(control.BindError, match="needs 5 fds"):
        control.adopt_fds(fds[:3])
    assert all(_closed(fd) for fd in fds[:3])
    control.close_fds(fds[3:])
    fds = _bind_fds(tmp_path)
    dup = os.dup(fds[1])
    os.close(fds[2])
    fds[2] = dup
    with pytest.raises(control.BindError, match="passed twice"):
        control.adopt_fds(fds)
    assert all(_closed(fd) for fd in fds)


@pytest.mark.parametrize(
    "reply",
    [
        {"ok": True},
        {"ok": True, "pid": "1", "uptime": 2.0, "bindings": []},
        {"ok": True, "pid": 1, "uptime": 2.0, "bindings": [{"task": 5, "since": "x"}]},
        {"ok": True, "pid": 1, "uptime": 2.0, "bindings": {}},
    ],
)
def test_a_malformed_status_reply_is_a_control_error(reply: dict[str, object]) -> None:
    from netguard.daemon.status import parse_status

    with pytest.raises(ValueError, match="malformed"):
        parse_status(reply)

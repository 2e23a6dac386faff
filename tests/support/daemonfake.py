"""A daemon under test and what it serves: `python -m netguard.daemon` on a temporary socket, a web
server, sandboxes made of loopback listeners, and small clients (for tests/unit/test_daemon.py)."""

from __future__ import annotations

import contextlib
import http.server
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from netguard.audit import read_records
from netguard.daemon import control
from netguard.daemon.control import ControlClient
from netguard.policy import parse_network
from netguard.spec import BindingSpec

REPO = Path(__file__).resolve().parent.parent.parent


class Web:
    """A fake upstream HTTP server on 127.0.0.1 that counts requests (the canary)."""

    def __init__(self) -> None:
        hits = self.hits = [0]

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits[0] += 1
                body = b"hello from web"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Daemon:
    """`python -m netguard.daemon` on a short temporary path, HOME pointed at an empty directory."""

    def __init__(self, base: Path, idle: float = 300, name: str = "d.sock") -> None:
        self.path = base / name
        self.home = base / "home"
        self.home.mkdir(exist_ok=True)
        self.logfile = base / "daemon.log"
        self.proc, ready = self.spawn(idle)
        assert ready == b"ready\n", self.log()

    def spawn(self, idle: float = 300) -> tuple[subprocess.Popen[bytes], bytes]:
        r, w = os.pipe()
        with open(self.logfile, "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "netguard.daemon",
                    "--socket",
                    str(self.path),
                    "--ready-fd",
                    str(w),
                    "--idle-exit",
                    str(idle),
                ],
                pass_fds=(w,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=REPO,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)},
            )
        os.close(w)
        try:
            ready, _, _ = select.select([r], [], [], 30)
            return proc, os.read(r, 64) if ready else b""
        finally:
            os.close(r)

    def log(self) -> str:
        return self.logfile.read_text() if self.logfile.exists() else ""

    def client(self) -> ControlClient:
        return ControlClient.connect(self.path, timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert list(self.home.iterdir()) == [], "the daemon wrote into its home directory"


def listener() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


class Box:
    """One sandbox: its listeners (ports recorded, our copies closed after the bind) and its audit log."""

    def __init__(self, d: Daemon, task: str, network: dict[str, Any]) -> None:
        self.task = task
        self.audit = d.path.parent / f"{task}.jsonl"
        afd = os.open(self.audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        socks = [listener(), listener(), udp, listener()]
        self.regular, self.transparent, self.dns_udp, self.dns_tcp = (s.getsockname()[1] for s in socks)
        self.client = d.client()
        try:
            self.client.bind(
                BindingSpec(task, parse_network(network, f"{task}.yaml")), [afd] + [s.fileno() for s in socks]
            )
        finally:
            os.close(afd)
            for s in socks:
                s.close()

    def get(self, url: str, host: str | None = None) -> tuple[int, str]:
        return http_get(self.regular, url, host)

    def decisions(self) -> list[Any]:
        return [r for r in read_records(self.audit) if r["event"] == "decision"]


def http_get(port: int, url: str, host: str | None = None, version: str = "HTTP/1.1") -> tuple[int, str]:
    """A request through the explicit proxy on `port`: (status, body)."""
    host = host or url.split("/")[2]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {url} {version}\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def raw(c: ControlClient, msg: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
    """Send anything, even what ControlClient would not, and return the daemon's reply."""
    control.send_message(c._sock, msg, fds or [])
    data, got, flags = control.recv_raw(c._sock)
    assert got == []
    return control.parse_message(data, flags)


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    return False


def eventually(pred: Callable[[], bool], timeout: float = 5) -> bool:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def fresh_daemon(prefix: str = "sgd") -> Iterator[Daemon]:
    """A daemon of its own in a new 0700 directory with a short path (AF_UNIX paths are short), stopped
    by PID and its directory removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o700)
    d = Daemon(base)
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)

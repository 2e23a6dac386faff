"""Shared helpers for the sandgate benchmarks: free ports, local test servers, the proxy subprocess.

Everything here talks to 127.0.0.1 only. Processes are started as subprocesses whose Popen
objects are kept, and stopped (SIGTERM, then SIGKILL after a grace period) by the context
managers that started them; temp dirs are removed on exit.

The local servers run in their own Python process (``python _common.py --serve ...``) so that
a Python benchmark client does not share a GIL with them:

  GET /big?bytes=N  -> N bytes (Content-Length N), streamed in 256 KiB chunks of one
                       preallocated buffer, so memory stays flat whatever N is;
  GET /small        -> b"ok\\n".

Both a plain HTTP and an HTTPS listener (throwaway CA from selftest/certs.py, certificate for
127.0.0.1, localhost and 198.18.0.1) are served. They behave like real servers, so the bench meets
what real traffic meets (issue 25: a bench server that wrote once hid a 40 ms Nagle/delayed-ACK stall):
TLS 1.3 only, with session tickets sent after the handshake (OpenSSL's default, `num_tickets` 2:
small writes of their own before the response); the response head and the body in separate writes
(one send each, never coalesced); TCP_NODELAY on every accepted socket, as nginx and friends set it;
HTTP/1.1 keep-alive unless the client sends ``Connection: close``.

SANDGATE_BENCH_CHECKOUT=DIR runs the proxy and daemon of another checkout of this repository (for
example an older commit in a `git worktree`), with this checkout's bench: the before/after of a change.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

LOOPBACK = "127.0.0.1"
#: The name the proxy inspects (TLS terminated with its own CA): inspection needs a name to sign for,
#: and the same server reached by its address stays passthrough, the baseline in the same run.
INSPECTED = "localhost"
REPO = Path(__file__).resolve().parent.parent
#: The checkout whose proxy/daemon is measured (PYTHONPATH of the processes under test): this one by default.
CHECKOUT = Path(os.environ.get("SANDGATE_BENCH_CHECKOUT") or REPO).resolve()
#: A non-loopback address for servers a sandbox must reach (its own 127.0.0.1 is its own; the proxy refuses
#: names resolving to loopback): a dummy link in a private netns (bench/_netns.py), a TEST-NET-like range.
SANDBOX_SERVER_IP = "198.18.0.1"
VENV_BIN = REPO / ".venv" / "bin"
PYTHON = str(VENV_BIN / "python")
SANDGATE = str(VENV_BIN / "sandgate")
READY_TIMEOUT = 20.0
CHUNK = 256 * 1024
MiB = 1024 * 1024

# Proxy variables in the environment would send "direct" measurements through some other proxy.
_PROXY_ENV = tuple(v for k in ("http", "https", "all", "no") for v in (f"{k}_proxy", f"{k.upper()}_PROXY"))


def clean_env() -> dict[str, str]:
    """os.environ without proxy variables, for curl and friends."""
    return {k: v for k, v in os.environ.items() if k not in _PROXY_ENV}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop one process we started: SIGTERM, wait, SIGKILL if it will not go."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


def _wait_for_line(
    proc: subprocess.Popen[bytes], stream: IO[bytes] | None, marker: str, timeout: float, what: str
) -> list[str]:
    """Read `stream` (in a daemon thread, which keeps draining it afterwards) until a line contains `marker`."""
    assert stream is not None, "started without a pipe for its output"
    seen: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for raw in stream:
            line = raw.decode(errors="replace")
            if len(seen) < 200:
                seen.append(line.rstrip("\n"))
            if marker in line:
                ready.set()
        ready.set()  # EOF: the process died; the caller notices below

    threading.Thread(target=pump, daemon=True, name=f"{what}-output").start()
    if not ready.wait(timeout) or proc.poll() is not None:
        tail = "\n  ".join(seen[-20:]) or "(no output)"
        raise RuntimeError(f"{what} did not become ready within {timeout:.0f}s (exit code {proc.poll()}):\n  {tail}")
    return seen


def _wait_ready_fd(proc: subprocess.Popen[bytes], fd: int, timeout: float, what: str) -> None:
    """`sandgate proxy --ready-fd`: one JSON line once it accepts connections; EOF first means it exited."""
    import json
    import select

    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        line = os.read(fd, 65536) if ready else b""
    finally:
        os.close(fd)
    if not line or not json.loads(line).get("ready"):
        err = proc.stderr.read().decode(errors="replace") if proc.stderr and proc.poll() is not None else ""
        raise RuntimeError(f"{what} did not become ready within {timeout:.0f}s (exit code {proc.poll()}): {err}")


# --- certificates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca_pem: Path  # trust anchor for clients (curl --cacert, ssl.create_default_context(cafile=...))
    cert_pem: Path  # server certificate chain for 127.0.0.1
    key_pem: Path


def make_certs(directory: Path) -> Certs:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from selftest.certs import CA  # the same throwaway CA code sandgate verify and the tests use

    ca = CA("sandgate bench CA")
    certs = Certs(directory / "ca.pem", directory / "server-chain.pem", directory / "server-key.pem")
    ca.write_cert(certs.ca_pem)
    ca.issue(LOOPBACK, INSPECTED, SANDBOX_SERVER_IP).write(certs.cert_pem, certs.key_pem)
    return certs


def client_context(certs: Certs) -> ssl.SSLContext:
    """A verifying client context trusting only the benchmark CA."""
    return ssl.create_default_context(cafile=str(certs.ca_pem))


# --- servers -------------------------------------------------------------------------------------

_BUFFER = memoryview(bytes(CHUNK))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the client says Connection: close
    server_version = "sandgate-bench"
    sys_version = ""
    timeout = 30  # an idle keep-alive connection is dropped, as real servers do
    # wbufsize 0 (StreamRequestHandler's default): every wfile.write is its own send (one TLS record):
    # end_headers() sends the head, the body follows in a write of its own.

    def setup(self) -> None:
        # TLS handshake in the handler thread, not in the accepting thread (see _TLSServer).
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/small":
            body = b"ok\n"
            self._head(len(body))
            self.wfile.write(body)
        elif url.path == "/big":
            try:
                n = int(parse_qs(url.query).get("bytes", ["0"])[0])
                if n < 0:
                    raise ValueError
            except ValueError:
                self.send_error(400, "bytes must be a non-negative integer")
                return
            self._head(n)
            while n > 0:
                k = min(n, CHUNK)
                self.wfile.write(_BUFFER[:k])
                n -= k
        else:
            self.send_error(404)

    def _head(self, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        if self.close_connection:  # the client asked for it (parse_request saw Connection: close)
            self.send_header("Connection", "close")
        self.end_headers()  # the head: one write; the body is the next

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as real servers: no Nagle of our own
        return sock, addr

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:  # a client hanging up mid-transfer is not news
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            super().handle_error(request, client_address)


class _TLSServer(_Server):
    def __init__(self, addr: tuple[str, int], ctx: ssl.SSLContext) -> None:
        super().__init__(addr, _Handler)
        self.ctx = ctx

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


def _serve_forever(host: str, http_port: int, https_port: int, cert: str, key: str) -> None:
    """Body of the server subprocess: both listeners until SIGTERM."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.num_tickets = 2  # sent after the handshake, before any response: what real TLS 1.3 servers do
    ctx.load_cert_chain(cert, key)
    servers = [_Server((host, http_port), _Handler), _TLSServer((host, https_port), ctx)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print("bench-servers: ready", flush=True)
    while not stop.wait(3600):
        pass
    for s in servers:
        s.shutdown()
        s.server_close()


@dataclass
class Servers:
    http_port: int
    https_port: int
    certs: Certs
    proc: subprocess.Popen[bytes]
    host: str = LOOPBACK

    def url(self, scheme: str, path: str) -> str:
        port = self.http_port if scheme == "http" else self.https_port
        return f"{scheme}://{self.host}:{port}{path}"


@contextlib.contextmanager
def local_servers(host: str = LOOPBACK) -> Iterator[Servers]:
    """Start the HTTP + HTTPS test servers in a subprocess, listening on `host` (127.0.0.1, or
    SANDBOX_SERVER_IP in a private netns that has it); yields their ports and the CA to trust."""
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-bench-certs-"))
    proc = None
    try:
        certs = make_certs(tmp)
        http_port, https_port = free_port(), free_port()
        while https_port == http_port:
            https_port = free_port()
        certs_args = (str(certs.cert_pem), str(certs.key_pem))
        proc = subprocess.Popen(
            [PYTHON, str(Path(__file__).resolve()), "--serve", host, *map(str, (http_port, https_port)), *certs_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        _wait_for_line(proc, proc.stdout, "bench-servers: ready", READY_TIMEOUT, "local test servers")
        yield Servers(http_port, https_port, certs, proc, host)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


# --- the proxy -----------------------------------------------------------------------------------


@dataclass
class Proxy:
    port: int
    proc: subprocess.Popen[bytes]
    audit_log: Path
    ca_pem: Path | None = None  # the proxy's own CA (it inspects INSPECTED): what clients of that host trust

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def memory_kib(self) -> dict[str, int]:
        """VmRSS / VmHWM (peak RSS) of the proxy and its relay workers, in KiB, from /proc/<pid>/status."""
        out: dict[str, int] = {"VmRSS": 0, "VmHWM": 0}
        for pid in process_tree(self.proc.pid):
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in out:
                        out[key] += int(rest.split()[0])
        return out

    def reset_peak(self) -> bool:
        """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs); False if not permitted."""
        try:
            for pid in process_tree(self.proc.pid):
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            return True
        except OSError:
            return False


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants: the proxy's relay workers move spliced bytes, so they are part of its cost."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass  # exited meanwhile
    return out


def policy_yaml(ports: list[int], inspect_port: int | None = None) -> str:
    """An allow-only policy for 127.0.0.1 on exactly `ports` (loopback needs an explicit cidr rule); with
    `inspect_port`, INSPECTED on that port is inspected (every request allowed, each one audited)."""
    text = f"version: 1\nnetwork:\n  allow:\n    - cidr: {LOOPBACK}/32\n      ports: [{', '.join(map(str, ports))}]\n"
    if inspect_port is not None:
        text += f"    - host: {INSPECTED}\n      ports: [{inspect_port}]\n      inspect: true\n"
    return text


@contextlib.contextmanager
def sandgate_proxy(allowed_ports: list[int], inspect: tuple[int, Certs] | None = None) -> Iterator[Proxy]:
    """Run `sandgate proxy` on a free loopback port with a generated policy; stopped and cleaned up on exit.

    inspect=(port, certs): INSPECTED:port is inspected, its upstream verified against certs' CA.
    """
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-bench-proxy-"))
    proc = None
    try:
        policy = tmp / "policy.yaml"
        policy.write_text(policy_yaml(allowed_ports, inspect[0] if inspect else None))
        audit = tmp / "audit.jsonl"
        port = free_port()
        r, w = os.pipe()
        listen = ["--listen", f"{LOOPBACK}:{port}", "--audit-log", str(audit), "--ready-fd", str(w)]
        if inspect is not None:
            listen += ["--upstream-ca", str(inspect[1].ca_pem), "--ca-cert", str(tmp / "proxy-ca.pem")]
        proc = subprocess.Popen(
            [SANDGATE, "proxy", "--policy", str(policy), *listen],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=tmp,
            env={**clean_env(), "PYTHONPATH": str(CHECKOUT)},  # this checkout's proxy, not the editable install's
            pass_fds=(w,),
        )
        os.close(w)
        _wait_ready_fd(proc, r, READY_TIMEOUT, "sandgate proxy")
        yield Proxy(port, proc, audit, tmp / "proxy-ca.pem" if inspect is not None else None)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="internal: run the benchmark's local HTTP/HTTPS servers")
    ap.add_argument("--serve", nargs=5, metavar=("HOST", "HTTP_PORT", "HTTPS_PORT", "CERT", "KEY"), required=True)
    a = ap.parse_args()
    _serve_forever(a.serve[0], int(a.serve[1]), int(a.serve[2]), a.serve[3], a.serve[4])

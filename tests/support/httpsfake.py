"""A fake HTTPS upstream for the e2e tests: it answers every request and logs what it received.

    fake = httpsfake.start(world, "api.test", "198.51.100.72")   # a cert from world.ca (the test CA)
    ... a client in a sandbox sends requests through sandgate ...
    fake.seen()            # every request that reached it: method, target (with query), headers, body

It runs inside the world's network namespace (`python -m tests.support.httpsfake`), speaks
HTTP/1.1 with keep-alive and HTTP/2 (ALPN h2), or plain HTTP/1.1 (`plain=True`). The log is the
evidence of what a refusal kept away: a request the proxy refused never appears in it. The
default handler answers `hello from NAME METHOD PATH`; `/bytes/N` answers N bytes; `/status/N`
answers status N; `/echo` reflects the request's headers (as JSON and as X-Echo-* headers; gzipped
when the request accepts gzip). tests/support/gitfake.py puts git's smart-HTTP CGI behind the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import itertools
import json
import os
import select
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import h2.config
import h2.connection
import h2.events
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

REPO = Path(__file__).resolve().parent.parent.parent
READY_TIMEOUT = 10.0


class Seen(TypedDict):
    """One request as the fake received it (one JSON line of its log)."""

    conn: int  # connection number: requests on one kept-alive connection share it
    proto: str  # "h2" or "http/1.1"
    sni: str | None
    method: str
    target: str  # the request target as sent: path and query
    headers: list[list[str]]  # [name, value] in order received (h2 names in lower case)
    body: int  # bytes of request body
    status: int  # what the fake answered


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Response]


def hello(name: str) -> Handler:
    """The default handler: a body naming the host, method and path, so a client can tell who answered."""

    def handle(req: Request) -> Response:
        path = req.target.split("?", 1)[0]
        if path.startswith("/bytes/") and path[7:].isdigit():
            return Response(200, b"x" * int(path[7:]))
        if path == "/echo":  # an upstream that reflects what it got: the request headers, in body and headers
            echoed = [("X-Echo-" + k, v) for k, v in req.headers if k.lower() not in ("content-length", "host")]
            body = json.dumps(req.headers).encode()
            if "gzip" in (req.header("accept-encoding") or ""):  # as real servers do when asked
                return Response(200, gzip.compress(body), [*echoed, ("Content-Encoding", "gzip")])
            return Response(200, body, echoed)
        if path.startswith("/status/") and path[8:].isdigit():
            return Response(int(path[8:]), f"status {path[8:]} from {name}\n".encode())
        return Response(200, f"hello from {name} {req.method} {path}\n".encode())

    return handle


# ---- the server (inside the world) ------------------------------------------------------------


class Server:
    """One listening socket; each connection is HTTP/2 when ALPN chose h2, else HTTP/1.1 keep-alive."""

    def __init__(self, handler: Handler, log: Path) -> None:
        self.handler = handler
        self.log = log.open("a", encoding="utf-8")
        self.conns = itertools.count(1)
        self.sni: dict[int, str | None] = {}

    def record(self, conn: int, proto: str, sni: str | None, req: Request, resp: Response) -> None:
        seen = Seen(
            conn=conn,
            proto=proto,
            sni=sni,
            method=req.method,
            target=req.target,
            headers=[[k, v] for k, v in req.headers],
            body=len(req.body),
            status=resp.status,
        )
        self.log.write(json.dumps(seen) + "\n")
        self.log.flush()

    def tls_context(self, cert: str, key: str) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["h2", "http/1.1"])

        def on_sni(obj: ssl.SSLSocket | ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
            self.sni[id(obj)] = name

        ctx.sni_callback = on_sni
        return ctx

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(self.conns)
        obj = writer.get_extra_info("ssl_object")
        sni = self.sni.pop(id(obj), None) if obj is not None else None
        proto = (obj.selected_alpn_protocol() if obj is not None else None) or "http/1.1"
        try:
            if proto == "h2":
                await self.serve_h2(conn, sni, reader, writer)
            else:
                await self.serve_h1(conn, sni, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def serve_h1(self, conn: int, sni: str | None, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers = [(k.strip(), v.strip()) for k, v in (x.split(":", 1) for x in lines[1:] if x)]
            req = Request(method, target, headers, b"")
            req = Request(method, target, headers, await _h1_body(reader, req))
            resp = self.handler(req)
            self.record(conn, "http/1.1", sni, req, resp)
            close = (req.header("connection") or "").lower() == "close" or version == "HTTP/1.0"
            await self.answer_h1(w, method, resp, close)
            if close:
                return

    async def answer_h1(self, w: asyncio.StreamWriter, method: str, resp: Response, close: bool) -> None:
        """One HTTP/1.1 answer in one write (a subclass may answer the way another server does)."""
        out = [f"HTTP/1.1 {resp.status} X", f"Content-Length: {len(resp.body)}", *_lines(resp.headers)]
        out += ["Connection: close"] if close else []
        w.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else resp.body))
        await w.drain()

    async def serve_h2(self, conn: int, sni: str | None, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        h2c.initiate_connection()
        w.write(h2c.data_to_send())
        streams: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        pending: dict[int, bytes] = {}
        while data := await reader.read(65536):
            for ev in h2c.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived) and ev.stream_id is not None:
                    streams[ev.stream_id] = ([(str(k), str(v)) for k, v in ev.headers or []], bytearray())
                elif isinstance(ev, h2.events.DataReceived) and ev.stream_id is not None:
                    streams[ev.stream_id][1].extend(ev.data or b"")
                    h2c.acknowledge_received_data(ev.flow_controlled_length or 0, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id in streams:
                    pending[ev.stream_id] = self._h2_answer(conn, sni, h2c, ev.stream_id, *streams.pop(ev.stream_id))
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    return
            _pump(h2c, pending)
            w.write(h2c.data_to_send())
            await w.drain()

    def _h2_answer(
        self,
        conn: int,
        sni: str | None,
        h2c: h2.connection.H2Connection,
        sid: int,
        hs: list[tuple[str, str]],
        body: bytearray,
    ) -> bytes:
        """Answer one stream's headers now; its body goes out as flow control allows (_pump)."""
        pseudo = dict(h for h in hs if h[0].startswith(":"))
        req = Request(
            pseudo.get(":method", ""), pseudo.get(":path", ""), [h for h in hs if not h[0].startswith(":")], bytes(body)
        )
        resp = self.handler(req)
        self.record(conn, "h2", sni, req, resp)
        extra = [(k.lower(), v) for k, v in resp.headers if k.lower() not in ("connection", "transfer-encoding")]
        h2c.send_headers(sid, [(":status", str(resp.status)), ("content-length", str(len(resp.body))), *extra])
        return b"" if req.method == "HEAD" else resp.body


def _pump(h2c: h2.connection.H2Connection, pending: dict[int, bytes]) -> None:
    """Send each stream's remaining body as far as the peer's flow-control window lets us."""
    for sid in list(pending):
        body = pending[sid]
        while body:
            n = min(h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size, len(body))
            if n <= 0:
                break
            h2c.send_data(sid, body[:n])
            body = body[n:]
        if body:
            pending[sid] = body
        else:
            h2c.end_stream(sid)
            del pending[sid]


async def _h1_body(reader: asyncio.StreamReader, req: Request) -> bytes:
    if (req.header("transfer-encoding") or "").lower() == "chunked":
        out = bytearray()
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            out += await reader.readexactly(size)
            await reader.readexactly(2)
        while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
            pass
        return bytes(out)
    return await reader.readexactly(int(req.header("content-length") or 0))


def _lines(headers: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{k}: {v}" for k, v in headers if k.lower() not in ("content-length", "connection")]


def serve_forever(handler: Handler, args: argparse.Namespace, kind: type[Server] | None = None) -> None:
    """Listen, print "ready" (the parent waits for it), serve until killed; `kind`: a Server subclass."""
    server = (kind or Server)(handler, Path(args.log))
    ctx = None if args.plain else server.tls_context(args.cert, args.key)

    async def main() -> None:
        srv = await asyncio.start_server(server.connection, args.ip, args.port, ssl=ctx)
        print("ready", flush=True)
        async with srv:
            await srv.serve_forever()

    asyncio.run(main())


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--plain", action="store_true", help="plain HTTP/1.1, no TLS")
    return ap


# ---- the test's side ----------------------------------------------------------------------------


@dataclass
class Fake:
    """A running fake upstream: its name, address, certificate and log."""

    name: str
    ip: str
    port: int
    log: Path
    cert_pem: bytes  # b"" for plain HTTP
    proc: subprocess.Popen[bytes]

    def seen(self) -> list[Seen]:
        """Every request it has answered so far (a line being written is skipped)."""
        out: list[Seen] = []
        for line in self.log.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def mark(self) -> int:
        return len(self.seen())

    def since(self, mark: int) -> list[Seen]:
        return self.seen()[mark:]

    def fingerprint(self) -> str:
        """SHA-256 of its leaf certificate (DER, hex): what a client that reached it directly sees."""
        return hashlib.sha256(x509.load_pem_x509_certificate(self.cert_pem).public_bytes(Encoding.DER)).hexdigest()


def header(seen: Seen, name: str) -> list[str]:
    """Every value of header `name` (any case) in one seen request."""
    return [v for k, v in seen["headers"] if k.lower() == name.lower()]


def start(
    world: Any,
    name: str,
    ip: str,
    port: int = 443,
    *,
    plain: bool = False,
    module: str = __name__,
    extra: Sequence[str] = (),
) -> Fake:
    """Start a fake upstream `name` on ip:port inside `world` (a selftest World); waits until it listens.

    The name resolves to ip in the world's DNS; the certificate is issued by the world's test CA
    for [name, ip]. `module` is the server's `python -m` module (gitfake passes its own).
    """
    world.add_host(name, ip)
    log = world.tmp / f"fake-{name}-{port}-{time.monotonic_ns()}.jsonl"
    log.touch()
    argv = [sys.executable, "-P", "-m", module, "--ip", ip, "--port", str(port), "--log", str(log), "--name", name]
    cert_pem = b""
    if not plain:
        chain, key = world.cert_for(name, ip)
        cert_pem = Path(chain).read_bytes()
        argv += ["--cert", str(chain), "--key", str(key)]
    else:
        argv += ["--plain"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    err = log.with_suffix(".stderr")
    with err.open("wb") as errf:
        proc: subprocess.Popen[bytes] = world.popen(
            [*argv, *extra], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=errf
        )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
    line = proc.stdout.readline() if ready else b""
    if line != b"ready\n":
        proc.kill()
        raise RuntimeError(f"fake {name} on {ip}:{port} did not start: {line!r} {err.read_text(errors='replace')}")
    return Fake(name, ip, port, log, cert_pem, proc)


# ---- clients inside the sandbox -------------------------------------------------------------------

#: `sgprobe.py` (write_probes): what a test's script inside the sandbox imports. Each attempt prints
#: one JSON line {"name", "status" (HTTP, 0 if none), "body", "error", ...}; `results()` reads them.
PROBE_PY = r"""
import http.client, json, os, socket, ssl, subprocess, sys, urllib.request

NO_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")

def emit(name, **kw):
    print(json.dumps({"name": name, **kw}), flush=True)

def proxied():
    return bool(os.environ.get("HTTPS_PROXY"))

def curl(name, *args):
    # One curl run, maybe several transfers (--next): one line "status connects version" per transfer.
    w = "\n@@%{http_code} %{num_connects} %{http_version}\n"
    argv, cur = ["curl", "-sS", "-m", "10"], ["-o", "-", "-w", w]
    for a in args:
        if a == "--next":
            argv += [*cur, "--next"]
        else:
            argv.append(a)
    p = subprocess.run([*argv, *cur], capture_output=True, text=True, timeout=30)
    parts = p.stdout.split("\n@@")
    bodies, metas = [parts[0]], []
    for part in parts[1:]:
        meta, _, rest = part.partition("\n")
        metas.append(meta.split())
        bodies.append(rest)
    for i, m in enumerate(metas or [["0", "0", "0"]]):
        emit(f"{name}.{i}" if len(metas) > 1 else name, status=int(m[0]), connects=int(m[1]), version=m[2],
             body=bodies[i], code=p.returncode, error=p.stderr[-600:])

def guard(name, fn):
    try:
        status, body = fn()
        emit(name, status=status, body=body)
    except Exception as e:
        emit(name, status=0, body="", error=f"{type(e).__name__}: {e}")

def with_requests(name, method, url, data=None, session=None, **kw):
    import requests
    def go():
        r = (session or requests).request(method, url, data=data, timeout=10, **kw)
        return r.status_code, r.text
    guard(name, go)

def with_urllib(name, method, url, data=None):
    def go():
        req = urllib.request.Request(url, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    guard(name, go)

def connection(host, port=443, context=None):
    # One http.client connection: through the explicit proxy (CONNECT) when HTTPS_PROXY is set.
    ctx = context or ssl.create_default_context()
    if proxied():
        hp = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/")
        c = http.client.HTTPSConnection(hp.split(":")[0], int(hp.split(":")[1]), context=ctx, timeout=10)
        c.set_tunnel(host, port)
    else:
        c = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
    return c

def keepalive(name, host, requests_):
    # Several requests on ONE connection; each line carries the connection's local port.
    c = connection(host)
    for i, (method, path) in enumerate(requests_):
        def go():
            c.request(method, path, body=b"x" if method == "POST" else None)
            r = c.getresponse()
            body = r.read().decode()
            return r.status, body
        guard(f"{name}.{i}", go)
        print(json.dumps({"name": f"{name}.{i}.sock", "status": 0, "body": str(c.sock.getsockname() if c.sock else None)}), flush=True)

def peer(name, host, port=443, context=None):
    # The certificate the client sees (DER sha256 and issuer) and whether it verified.
    import hashlib
    ctx = context
    if ctx is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    def go():
        c = connection(host, port, ctx)
        c.connect()
        der = c.sock.getpeercert(binary_form=True)
        from cryptography import x509
        cert = x509.load_der_x509_certificate(der)
        c.close()
        return 200, json.dumps({"sha256": hashlib.sha256(der).hexdigest(), "issuer": cert.issuer.rfc4514_string()})
    guard(name, go)

def node(name, mode, attempts):
    # mode "https" (https.request), "https-chunked" (a body without Content-Length) or "fetch" (global
    # fetch); attempts: [[name, method, url, body], ...]
    p = subprocess.run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "sgprobe.js"), mode,
                        json.dumps(attempts)], capture_output=True, text=True, timeout=60)
    for line in p.stdout.splitlines():
        r = json.loads(line)
        emit(f"{name}.{r['name']}", status=r["status"], body=r["body"], error=r.get("error", "") + p.stderr[-300:])

def sh(name, script, env=None):
    p = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    emit(name, status=p.returncode, body=p.stdout, error=p.stderr[-2000:])
"""

PROBE_JS = r"""
const https = require('https');
const [mode, list] = [process.argv[2], JSON.parse(process.argv[3])];
function viaHttps(method, url, body, chunked) {
  // Content-Length when there is a body, unless `chunked` (Node's own default for req.write()).
  const headers = body && !chunked ? {'Content-Length': Buffer.byteLength(body)} : {};
  return new Promise(res => {
    const req = https.request(url, {method, headers}, r => {
      let d = ''; r.on('data', c => d += c); r.on('end', () => res({status: r.statusCode, body: d}));
    });
    req.on('error', e => res({status: 0, body: '', error: String(e)}));
    if (body) req.write(body);
    req.end();
  });
}
async function viaFetch(method, url, body) {
  try {
    const r = await fetch(url, {method, body: body || undefined});
    return {status: r.status, body: await r.text()};
  } catch (e) { return {status: 0, body: '', error: String(e) + ' ' + String(e.cause)}; }
}
(async () => {
  for (const [name, method, url, body] of list) {
    const r = await (mode === 'fetch' ? viaFetch : viaHttps)(method, url, body, mode === 'https-chunked');
    console.log(JSON.stringify({name, ...r}));
  }
})();
"""


class Result(TypedDict):
    """One probe's line: HTTP status (0 if none, or an exit status for `sh`), body and error text."""

    name: str
    status: int
    body: str
    error: str
    connects: NotRequired[int]  # curl: new connections this transfer made (0: reused)
    version: NotRequired[str]  # curl: the HTTP version spoken
    count: NotRequired[int]  # certificates in a bundle


def write_probes(where: Path) -> None:
    """Put sgprobe.py and sgprobe.js into `where` (a directory the sandbox can read: its cwd)."""
    (where / "sgprobe.py").write_text(PROBE_PY)
    (where / "sgprobe.js").write_text(PROBE_JS)


def results(stdout: str) -> dict[str, Result]:
    """The probes' JSON lines by name (other output is ignored)."""
    out: dict[str, Result] = {}
    for line in stdout.splitlines():
        if line.startswith('{"name"'):
            rec = json.loads(line)
            rec.setdefault("error", "")
            out[rec["name"]] = rec
    return out


if __name__ == "__main__":
    _args = parser().parse_args()
    serve_forever(hello(_args.name), _args)

"""A fake OpenTelemetry collector: OTLP/HTTP on a socket the test made (loopback, or inside a World).

It keeps every request (path, headers, the body un-gzipped) and decodes bodies with the official
opentelemetry-proto classes, never with sandgate's own encoder. Modes: "ok" (200), "hang" (reads the
request and never answers until closed), "fail:N:CODE" (the first N requests get CODE with
Retry-After: 0, then 200), "partial:N" (200 saying N records were rejected).
"""

from __future__ import annotations

import gzip
import http.server
import os
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Row:
    """One log record as the collector decoded it."""

    resource: dict[str, Any]
    scope: tuple[str, str]
    time_ns: int
    observed_ns: int
    severity: int
    severity_text: str
    body: str
    event_name: str
    attributes: dict[str, Any] = field(default_factory=dict)


def listen_in_netns(netns: Path | None, ip: str, port: int) -> socket.socket:
    """A listening TCP socket born in the network namespace `netns` names (None: this one).

    A network namespace is per thread: a short-lived thread enters it, makes the socket and ends."""
    out: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            if netns is not None:
                fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.setns(fd, os.CLONE_NEWNET)
                finally:
                    os.close(fd)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((ip, port))
            s.listen(64)
            out.append(s)
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


class Collector:
    """Serves OTLP/HTTP on `sock` (taken over) in threads until `close`."""

    def __init__(self, sock: socket.socket, mode: str = "ok", tls: tuple[Path, Path] | None = None) -> None:
        self.mode = mode
        self.requests: list[Received] = []
        self.answered = 0
        self.release = threading.Event()  # ends every hanging request
        self._lock = threading.Lock()
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            sock = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                code, body = collector._received(Received(self.path, dict(self.headers.items()), data))
                if code == 0:
                    collector.release.wait(60)
                    self.close_connection = True
                    return
                self.send_response(code)
                if code != 200:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Type", self.headers.get("Content-Type", "application/x-protobuf"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

        self.server = Server(sock.getsockname()[:2], Handler, bind_and_activate=False)
        self.server.socket.close()
        self.server.socket = sock
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True)
        self.thread.start()

    def _received(self, r: Received) -> tuple[int, bytes]:
        json_answer = r.headers.get("Content-Type") == "application/json"
        with self._lock:
            self.requests.append(r)
            n = len(self.requests)
        kind, _, arg = self.mode.partition(":")
        if kind == "hang":
            return 0, b""
        if kind == "fail":
            count, _, code = arg.partition(":")
            if n <= int(count):
                return int(code), b""
        self.answered += 1
        response = logs_service_pb2.ExportLogsServiceResponse()
        if kind == "partial":
            response.partial_success.rejected_log_records = int(arg)
        if json_answer:
            return 200, json_format.MessageToJson(response).encode()
        return 200, response.SerializeToString()

    def rows(self) -> list[Row]:
        """Every log record received so far, decoded with opentelemetry-proto."""
        with self._lock:
            got = list(self.requests)
        return [row for r in got for row in decode(r)]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def decode(r: Received) -> list[Row]:
    req = logs_service_pb2.ExportLogsServiceRequest()
    if r.headers.get("Content-Type") == "application/json":
        json_format.Parse(r.body, req)
    else:
        req.ParseFromString(r.body)
    out = []
    for rl in req.resource_logs:
        resource = {kv.key: value(kv.value) for kv in rl.resource.attributes}
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                out.append(
                    Row(
                        resource,
                        (sl.scope.name, sl.scope.version),
                        lr.time_unix_nano,
                        lr.observed_time_unix_nano,
                        lr.severity_number,
                        lr.severity_text,
                        lr.body.string_value,
                        lr.event_name,
                        {kv.key: value(kv.value) for kv in lr.attributes},
                    )
                )
    return out


def value(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None

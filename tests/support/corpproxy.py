"""A fake corporate HTTP proxy for the e2e tests: logs every request head it gets, may demand Basic auth.

Run inside a test World (`start`): `python -m tests.support.corpproxy --ip IP --port PORT --log FILE
[--auth USER:PASS] [--answer STATUS]`. Each request is one JSON line in FILE: {"method", "target",
"auth" (the Proxy-Authorization value or null), "status"}. A CONNECT that passes is answered 200
and relayed to its target (an address of the world: the fake upstreams); anything else gets 405.
`--answer 403` refuses every request with that status (a proxy that filters).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REASONS = {
    200: "Connection established",
    403: "Forbidden",
    405: "Method Not Allowed",
    407: "Proxy Authentication Required",
}


@dataclass
class CorpProxy:
    """A running fake proxy: its address and what it logged."""

    ip: str
    port: int
    log: Path
    proc: subprocess.Popen[Any]

    def url(self, auth: str | None = None) -> str:
        return f"http://{auth + '@' if auth else ''}{self.ip}:{self.port}"

    def seen(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def targets(self) -> list[str]:
        return [r["target"] for r in self.seen()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start(world: Any, ip: str, port: int, *, auth: str | None = None, answer: int | None = None) -> CorpProxy:
    """The fake proxy in `world` (its process group is killed when the world closes, and by `stop`)."""
    from .runner import REPO, env

    world.add_host(f"corpproxy-{port}.test", ip)  # holds the address in the world
    log = world.tmp / f"corpproxy-{port}-{time.monotonic_ns()}.jsonl"
    log.touch()
    cmd = [sys.executable, "-m", "tests.support.corpproxy", "--ip", ip, "--port", str(port), "--log", str(log)]
    cmd += ["--auth", auth] if auth else []
    cmd += ["--answer", str(answer)] if answer else []
    proc = world.popen(cmd, env=env(), cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    if not ready or proc.stdout.readline().strip() != b"ready":
        proc.kill()
        raise RuntimeError("the fake corporate proxy did not start")
    return CorpProxy(ip, port, log, proc)


async def _relay(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except OSError:
        pass
    finally:
        w.close()


class _Server:
    def __init__(self, log: Path, auth: str | None, answer: int | None) -> None:
        self.log, self.answer = log, answer
        self.want = "Basic " + base64.b64encode(auth.encode()).decode() if auth else None

    def write(self, rec: dict[str, Any]) -> None:
        with self.log.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            w.close()
            return
        lines = head.split("\r\n")
        method, target = [*lines[0].split(" "), "", ""][:2]
        fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
        got = fields.get("proxy-authorization")
        status = self.answer or (407 if self.want and got != self.want else 200 if method == "CONNECT" else 405)
        self.write({"method": method, "target": target, "auth": got, "status": status})
        if status != 200:
            body = f"corpproxy: {status}\n".encode()
            extra = 'Proxy-Authenticate: Basic realm="corp"\r\n' if status == 407 else ""
            w.write(f"HTTP/1.1 {status} {REASONS.get(status, 'No')}\r\n{extra}Content-Length: {len(body)}\r\n"
                    f"Connection: close\r\n\r\n".encode() + body)  # fmt: skip
            await w.drain()
            w.close()
            return
        host, _, port = target.rpartition(":")
        try:
            ur, uw = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            w.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            w.close()
            return
        w.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_relay(r, uw), _relay(ur, w))


async def _main(a: argparse.Namespace) -> None:
    srv = _Server(Path(a.log), a.auth, a.answer)
    server = await asyncio.start_server(srv.handle, a.ip, a.port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--ip", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--auth")
    p.add_argument("--answer", type=int)
    asyncio.run(_main(p.parse_args()))

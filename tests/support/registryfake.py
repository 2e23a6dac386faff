"""A fake package registry for the e2e tests: httpsfake's server, answering the way a registry's CDN does.

    fake = httpsfake.start(world, "registry.test", ip, module=registryfake.__name__)

What differs from httpsfake's HTTP/1.1 answer: the head and the body leave in separate writes (the
body itself in two), each drained before the next, and the connection is kept alive for as many
requests as the client sends. `/bytes/N` answers N bytes, so a client can ask for bodies of varied
size (packuments of a few KB, tarballs of hundreds). Every request is logged with its connection
number (httpsfake.Seen.conn): how many upstream connections the proxy opened is part of the evidence.
"""

from __future__ import annotations

import asyncio

from . import httpsfake


class RegistryServer(httpsfake.Server):
    async def answer_h1(self, w: asyncio.StreamWriter, method: str, resp: httpsfake.Response, close: bool) -> None:
        """The head alone, as a CDN's first write, then the body in two more, each drained before the next."""
        body = b"" if method == "HEAD" else resp.body
        out = [f"HTTP/1.1 {resp.status} X", f"Content-Length: {len(resp.body)}", "Content-Type: application/json"]
        out += ["Connection: close"] if close else []
        w.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        await w.drain()
        half = len(body) // 2
        for part in (body[:half], body[half:]):
            if part:
                w.write(part)
                await w.drain()


if __name__ == "__main__":
    _args = httpsfake.parser().parse_args()
    httpsfake.serve_forever(httpsfake.hello(_args.name), _args, RegistryServer)

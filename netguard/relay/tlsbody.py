"""A large inspected response body moved in one tight decrypt/encrypt loop, outside mitmproxy's layers.

On an inspected connection (TLS terminated with the run's CA), mitmproxy passes every 64 KiB of a
response body through its whole layer stack: a read event, the server's TLS layer, the HTTP/1
reader, the stream callback, the client's TLS layer, a write command. That costs more than the
cryptography itself (issue 25: inspected downloads at a quarter of direct speed, 4 CPU-s per GB).
Once a response's headers were judged and sent, its body is only bytes of a known length, so the
bodyrelay takeover (same checks, same hand-back, same end) hands it to `TlsCopy`: read the
upstream's ciphertext, decrypt it with the very SSL object mitmproxy's server TLS layer uses,
encrypt it with the client TLS layer's SSL object, write it to the client's own transport. Sharing
those two objects keeps both TLS sessions exactly where mitmproxy left them, so nothing is
renegotiated and mitmproxy's own later writes (the end) continue the record sequence.

What it never does:
  - relay more than Content-Length: plaintext beyond the body (a pipelined answer, a server
    sending garbage) is dropped, and the response already says `Connection: close`;
  - relay a body of a host with a credential bound (the Gate keeps those with mitmproxy: the
    scrubber masks an echoed secret) or of a request the Gate did not judge;
  - read the client: mitmproxy keeps reading it (a pipelined request waits there, unjudged and
    unsent, and dies with the connection).
"""

from __future__ import annotations

import asyncio
import os
import time

from mitmproxy import http
from OpenSSL import SSL

from netguard.relay.bodycopy import BodyCopy, OnDone

# A takeover ends the connection (no later request on it may pass unjudged), and the client's next
# request then pays a new inspected connection (two TLS handshakes, ~5 ms): below a few MiB that costs
# more than the loop saves (~2 ms per MiB), and npm's many mid-sized tarballs keep their connections.
THRESHOLD = 4 * 1024 * 1024
_READ = 256 * 1024  # ciphertext per read: fewer, larger steps than mitmproxy's 64 KiB
_RECORD = 16 * 1024  # TLS plaintext per record (RFC 8446 5.1): what one SSL_read can return
_OUT = 1024 * 1024  # ciphertext per BIO read: what one upstream read becomes, in one piece
_HIGH = 1024 * 1024  # client bytes queued before upstream reading pauses (a slow client never grows us)


def eligible(flow: http.HTTPFlow) -> bool:
    """Only inspected TLS on both sides; the length and method checks are bodyrelay's."""
    return bool(flow.client_conn.tls and flow.server_conn.tls and flow.request.scheme == "https")


def _drain(conn: SSL.Connection) -> bytes:
    """Every byte `conn` has queued for its peer (records, alerts, a KeyUpdate answer), copied once."""
    chunks: list[bytes] = []
    while True:
        try:
            chunks.append(conn.bio_read(_OUT))
        except SSL.WantReadError:
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class TlsCopy(BodyCopy):
    """Exactly `limit` plaintext bytes upstream -> client through both TLS sessions; closes `src` when done.

    `src` is our own fd of the upstream socket (its asyncio transport is paused); writes go through
    the client's and the upstream's asyncio writers, in order with anything mitmproxy writes."""

    def __init__(
        self,
        src: int,
        tls: tuple[SSL.Connection, SSL.Connection],
        writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        limit: int,
        on_done: OnDone,
        idle: float,
    ) -> None:
        super().__init__(src, limit, on_done, idle)
        (self._up, self._down), (self._writer, upstream) = tls, writers
        self._client, self._server = self._writer.transport, upstream.transport

    def start(self) -> None:
        self._client.set_write_buffer_limits(_HIGH)  # bodyrelay drained it to 0; drain() waits for _HIGH // 4
        super().start()

    def _readable(self) -> None:
        try:
            data = os.read(self.src, _READ)
        except BlockingIOError:
            return
        except OSError as e:
            self.finish(f"upstream read failed: {os.strerror(e.errno or 0)}")
            return
        if not data:
            self.finish("upstream closed before the end of the body")
            return
        self._last = time.monotonic()
        self._up.bio_write(data)
        why = self._relay()
        answer = _drain(self._up)  # a KeyUpdate wants its answer upstream
        if answer:
            self._server.write(answer)
        out = _drain(self._down)
        if out:
            self._client.write(out)
        if why is not None or self.left == 0:
            self.finish(why)
        elif self._client.get_write_buffer_size() > _HIGH:
            self._pause()

    def _relay(self) -> str | None:
        """Each record the upstream's session can decrypt now, encrypted at once for the client (no
        copy in between); None, or why the body cannot go on. Bytes past the body are never relayed."""
        while self.left > 0:
            try:
                plain = self._up.recv(_RECORD)
            except SSL.WantReadError:
                return None
            except SSL.ZeroReturnError:
                return "upstream closed before the end of the body"
            except SSL.Error as e:
                return f"upstream TLS error: {e}"
            if len(plain) > self.left:
                plain = plain[: self.left]
            try:
                self._down.sendall(plain)
            except SSL.Error as e:  # the client's session ended meanwhile (an alert it sent)
                return f"client TLS error: {e}"
            self.left -= len(plain)
            self.moved += len(plain)
        return None

    def _pause(self) -> None:
        """Backpressure: no upstream read until the client took what is queued for it."""
        self._loop.remove_reader(self.src)
        self._loop.create_task(self._resume_when_drained())

    async def _resume_when_drained(self) -> None:
        try:
            await self._writer.drain()  # the transport is past its high-water mark: this waits for its low one
        except (OSError, ConnectionError):
            self.finish("client closed")
            return
        if self._on_done is not None:
            self._loop.add_reader(self.src, self._readable)

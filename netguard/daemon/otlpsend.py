"""One POST of an OTLP/HTTP request body to a collector, on the exporter's thread (netguard.daemon.otlpexport).

http.client from the standard library: no dependency, and it runs on a thread of its own, so its
blocking calls never touch the daemon's event loop. The connection is kept alive between batches
and dropped after any error. TLS verifies the collector with the system's store, or with the PEM
roots of OTEL_EXPORTER_OTLP_CERTIFICATE alone. The collector is reached directly from the daemon's
network namespace; it is not a destination of the sandbox and no policy rule applies to it.
The configured headers are sent and never described: an Answer's `why` names a status or an error.
"""

from __future__ import annotations

import email.utils
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netguard.otlp import OtlpConfig

if TYPE_CHECKING:
    import http.client

MAX_ANSWER = 64 * 1024  # bytes read of an answer; a longer one costs its connection
USER_AGENT = "sandgate-otlp/1"
#: Headers sandgate sets itself: a configured one of these names is not sent (it would break the request).
OWN = frozenset({"host", "content-type", "content-length", "content-encoding", "transfer-encoding", "connection"})


@dataclass(frozen=True)
class Answer:
    """A collector's status (None: no answer at all), the start of its body, its Retry-After, and why it failed."""

    status: int | None
    data: bytes
    retry_after: str | None
    why: str


class Sender:
    """The connection to one run's collector; used from one thread only."""

    def __init__(self, config: OtlpConfig) -> None:
        from netguard import otlplogs

        u = urllib.parse.urlsplit(config.endpoint)
        self.config = config
        self.https = u.scheme == "https"
        self.host = u.hostname or ""
        self.port = u.port or (443 if self.https else 80)
        self.target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        own = {"Content-Type": otlplogs.content_type(config), "User-Agent": USER_AGENT}
        if config.compression == "gzip":
            own["Content-Encoding"] = "gzip"
        # Values as bytes: a percent-decoded header may hold UTF-8 that http.client's latin-1 would refuse.
        self.headers: dict[str, str | bytes] = {k: v.encode() for k, v in config.headers if k.lower() not in OWN}
        self.headers.update(own)
        self._conn: http.client.HTTPConnection | None = None
        self._tls: ssl.SSLContext | None = None

    def post(self, body: bytes, timeout: float) -> Answer:
        import http.client

        try:
            conn = self._connection(timeout)
            conn.request("POST", self.target, body, self.headers)
            resp = conn.getresponse()
            data = resp.read(MAX_ANSWER)
            if not resp.isclosed() or resp.will_close:
                self.close()  # an answer longer than we read, or the collector's own close
            return Answer(resp.status, data, resp.getheader("Retry-After"), f"HTTP {resp.status} {resp.reason}")
        except (OSError, http.client.HTTPException) as e:
            self.close()
            return Answer(None, b"", None, describe(e, timeout))

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        import http.client

        if self._conn is None:
            if self.https:
                if self._tls is None:
                    self._tls = ssl.create_default_context(cadata=self.config.certificate)
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._tls)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def describe(e: BaseException, timeout: float) -> str:
    """An error in words for the audit log: never a header, never more than the exception's kind and text."""
    if isinstance(e, socket.timeout | TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS verification of the collector failed ({e.verify_message})"
    if isinstance(e, OSError):
        return f"cannot reach the collector ({e.strerror or type(e).__name__})"
    return f"a broken answer ({type(e).__name__})"


def backoff(attempt: int, retry_after: str | None, first: float, cap: float, jitter: float) -> float:
    """Seconds to wait before try `attempt` + 1: the collector's Retry-After (seconds or an HTTP date) if it
    gave one, else `first` doubled per try up to `cap`, +-20% by `jitter` (0..1). Pure but for the clock."""
    if retry_after is not None:
        text = retry_after.strip()
        if text.isdigit():
            return float(int(text))
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            when = None
        if when is not None and when.tzinfo is not None:
            return max(0.0, float(when.timestamp()) - time.time())
    return min(cap, first * 2.0**attempt) * (0.8 + 0.4 * jitter)

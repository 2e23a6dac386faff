"""What the proxy does with one request it can read: judge it, broker credentials into it. Pure: no I/O.

The proxy reads a request when it is plain HTTP or when its destination is inspected (TLS
terminated with the run's CA). Every such request is checked for an attempted leak first: a
credential's sentinel (or its real value) in a header or the URL, on its way anywhere but to that
credential's own host over HTTPS, is refused. Then an inspected destination's `http:` rules judge
the method, the path (refused unless canonical), method-override headers and upgrades
(netguard.httprules). An allowed HTTPS request to a credential's host gets the real header (`broker`).

When a credential is bound, request bodies up to 1 MiB to anywhere but its own host are held and
scanned (`body_leak`, called by the Gate's `request` hook); larger ones stream unscanned: a body
may be gigabytes, and what it could leak is only the sentinel, worthless outside the proxy (the
real value never enters the sandbox).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from netguard import credentials, httprules
from netguard.audit import Kind, RequestRecord, request_record
from netguard.credentials import Secret
from netguard.rules import Inspection

Headers = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Judged:
    """The verdict on one request: `leak` names the variable of an attempted leak."""

    allowed: bool
    rule: str | None
    reason: str
    leak: str | None = None


@dataclass
class Logged:
    """A judged request as its audit record will name it (query cut, secrets redacted)."""

    kind: Kind
    host: str
    port: int
    method: str
    path: str
    judged: Judged

    def record(self, task: str, id: str, status: int | None, up: int, down: int, ms: int) -> RequestRecord:
        j = self.judged
        action = "allow" if j.allowed else "deny"
        return request_record(
            task, id, self.kind, action, self.host, self.port, self.method, self.path, status=status,
            bytes_up=up, bytes_down=down, duration_ms=ms, rule=j.rule, reason=j.reason, leak=j.leak,
        )  # fmt: skip


def redact(text: str, secrets: Iterable[Secret]) -> str:
    """`text` with every secret's real value and sentinel shown as ${VARIABLE}: what may be logged or shown."""
    for s in secrets:
        if s.real:
            text = text.replace(s.real, f"${{{s.variable}}}")
        text = text.replace(s.sentinel, f"${{{s.variable}}}")
    return text


def logged_path(target: str, log_query: bool, secrets: Iterable[Secret]) -> str:
    """The request target as the audit log keeps it: the query cut unless the rule asks (it may hold tokens)."""
    return redact(target if log_query else target.split("?", 1)[0], secrets)


def _where(s: Secret, host: str, target: str, headers: Headers) -> str | None:
    """Where a request carries `s` (a header's name, or the URL), or None."""
    one = (s,)
    for name, value in headers:
        if credentials.carried(f"{name}: {value}", one) is not None:
            return f"header {name}"
    url = f"{host}{target}"
    if credentials.carried(url, one) is not None or credentials.carried(unquote(url), one) is not None:
        return "the URL"  # unquoted too: %73andgate-sentinel-... is the same sentinel to the upstream
    return None


def find_leak(secrets: Iterable[Secret], host: str, target: str, headers: Headers, bound_ok: bool) -> Judged | None:
    """An attempted leak: a secret carried to a host it is not bound to, or (bound_ok False) not over inspected TLS."""
    for s in secrets:
        if bound_ok and s.host == host:
            continue  # its own host over verified TLS: where the proxy puts it anyway
        where = _where(s, host, target, headers)
        if where is not None:
            return Judged(False, str(s.origin), credentials.leak_reason(s, host, where), s.variable)
    return None


def body_leak(secrets: Iterable[Secret], host: str, body: bytes) -> Judged | None:
    """An attempted leak in a held request body (to anywhere but a credential's own host over HTTPS)."""
    text = body.decode("latin-1")  # bytes as they are: a sentinel is ASCII
    for s in secrets:
        if credentials.carried(text, (s,)) is not None:
            return Judged(False, str(s.origin), credentials.leak_reason(s, host, "the body"), s.variable)
    return None


def judge(
    insp: Inspection | None,
    secrets: Sequence[Secret],
    host: str,
    method: str,
    target: str,
    headers: Headers,
    https: bool,
) -> Judged | None:
    """The verdict on a request the proxy can read; None: not judged here (plain HTTP, not inspected, no leak).

    `host` is normalised. An HTTPS request the proxy reads for a host that is not inspected (its
    Host header names another host than the connection's) is refused: we would otherwise decrypt
    and pass on traffic the policy said to leave alone, a fronting trick's way past the rules.
    """
    leak = find_leak(secrets, host, target, headers, bound_ok=https and insp is not None)
    if leak is not None:
        return Judged(leak.allowed, leak.rule, redact(leak.reason, secrets), leak.leak)
    if insp is None:
        if https:
            return Judged(False, None, f"{host} is not inspected: its requests are not read on another host's TLS")
        return None
    d = httprules.decide_request(insp.http, host, method, target, headers)  # headers: overrides, upgrades
    return Judged(d.allowed, d.rule or insp.origin, redact(d.reason, secrets))


def broker(headers: Headers, secrets: Iterable[Secret], host: str, lower: bool = False) -> list[tuple[str, str]]:
    """The headers of an inspected HTTPS request to `host` with its credentials in: each secret's header set
    (replacing whatever the sandbox sent), its sentinel swapped for the real value in any other header.

    `lower`: header names in lower case (HTTP/2 forbids upper case). A brokered request also asks for
    an uncompressed response (`Accept-Encoding: identity`): `Scrub` can only mask an echoed real value
    it can read, and the sandbox choosing gzip must not turn the echo into a way out.
    """
    out = list(headers)
    for s in secrets:
        if s.host != host:
            continue
        out = _set(out, s.header, s.value, lower, (s.sentinel, s.real))
    if out != list(headers):
        out = _set(out, "Accept-Encoding", "identity", lower, ("", ""))
    return out


def _set(
    fields: list[tuple[str, str]], header: str, value: str, lower: bool, swap: tuple[str, str]
) -> list[tuple[str, str]]:
    """`fields` with `header` set to `value` once (where it first was, else last); in the others the
    text swap[0] replaced by swap[1] (nothing when empty)."""
    name = header.lower() if lower else header
    at = next((i for i, (n, _) in enumerate(fields) if n.lower() == header.lower()), len(fields))
    rest = [(n, v.replace(*swap) if swap[0] else v) for n, v in fields if n.lower() != header.lower()]
    return [*rest[:at], (name, value), *rest[at:]]


def unsecret(value: bytes, secrets: Iterable[Secret]) -> bytes:
    """A response header with any real value put back to its sentinel: what the sandbox may hold."""
    for s in secrets:
        if s.real:
            value = value.replace(s.real.encode(), s.sentinel.encode())
    return value


class Scrub:
    """A response body stream (mitmproxy calls it per chunk, then with b"" at the end) that masks the
    real values of `secrets` with '*' of the same length, also across chunk boundaries.

    Defends against an upstream echoing the brokered header back (a debug endpoint, an error message
    quoting the key): the sandbox must never hold the real value. Same length, so a Content-Length
    stays true. A compressed body is not looked into (the value would be unreadable there as well,
    short of decompressing it, which the sandbox can do): brokered hosts should be APIs, not echoes.
    """

    def __init__(self, inner: Callable[[bytes], bytes], secrets: Iterable[Secret]) -> None:
        self.inner = inner
        self.reals = [s.real.encode() for s in secrets if s.real]
        self.keep = max((len(r) for r in self.reals), default=1) - 1  # a value cut by a chunk boundary
        self.tail = b""

    def __call__(self, data: bytes) -> bytes:
        buf = self.tail + self.inner(data)
        for r in self.reals:
            buf = buf.replace(r, b"*" * len(r))
        cut = len(buf) if not data else max(0, len(buf) - self.keep)  # b"": the end, flush everything
        out, self.tail = buf[:cut], buf[cut:]
        return out


def refusal_text(method: str, path: str, host: str, j: Judged) -> str:
    """The 403 body: what was refused, why, and by which rule (secrets already redacted by the caller)."""
    what = "attempted credential leak" if j.leak is not None else "request refused"
    rule = f" (rule {j.rule})" if j.rule else ""
    return f"sandgate: {what}: {method} {path} on {host}: {j.reason}{rule}\n"

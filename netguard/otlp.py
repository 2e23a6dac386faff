"""The OpenTelemetry export settings of one run: a typed record, and its form inside the bind's spec.

The daemon is shared by every run of a user, so it never reads its own environment for this: each
run's launcher reads its own OTEL_* variables (netguard.otelenv, only when some are set) and sends
the result in its bind (netguard.spec); the daemon exports that binding's records with it
(netguard.daemon.otlpexport). `decode` is as strict as the rest of the spec. The headers are secrets
(a collector's API key): they are never in a message, a repr or a log line. Pure; small on purpose:
every `sandgate run` imports it with the spec.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Protocol = Literal["http/protobuf", "http/json"]
Compression = Literal["gzip", "none"]
MAX_QUEUE: Final = 16384  # records a binding may hold unsent: the daemon is shared, its memory too
MAX_SECONDS: Final = 120.0  # longest request or export deadline honoured: a run's end waits at most this
MAX_PAIRS: Final = 64
MAX_TEXT: Final = 8192
TOKEN: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class OtlpError(ValueError):
    """A setting sandgate cannot honour; one line for `sandgate: error:` (never a header's value)."""


@dataclass(frozen=True)
class OtlpConfig:
    """Where and how one binding's audit records go; `headers` are secrets (never in its repr)."""

    endpoint: str  # the full URL records are POSTed to
    protocol: Protocol = "http/protobuf"
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout: float = 10.0  # seconds per request
    compression: Compression = "none"
    resource: tuple[tuple[str, str], ...] = (("service.name", "sandgate"),)
    certificate: str | None = field(default=None, repr=False)  # PEM roots instead of the system store
    queue: int = 2048  # OTEL_BLRP_MAX_QUEUE_SIZE: records held unsent; past it the newest are dropped
    batch: int = 512  # OTEL_BLRP_MAX_EXPORT_BATCH_SIZE
    delay: float = 1.0  # OTEL_BLRP_SCHEDULE_DELAY, seconds: the longest a record waits for its batch
    deadline: float = 30.0  # OTEL_BLRP_EXPORT_TIMEOUT, seconds: one batch's tries and waits together

    def origin(self) -> str:
        """scheme://host[:port] of the endpoint: what messages may name (no path, query or userinfo)."""
        u = urllib.parse.urlsplit(self.endpoint)
        return f"{u.scheme}://{u.netloc}"


def check_url(url: str, name: str) -> str:
    """An http(s) URL with a host and no userinfo or fragment; OtlpError naming `name` (not the value)."""
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port  # ValueError for a port out of range or not a number
    except ValueError:
        raise OtlpError(f"{name} is not a URL; set it to http(s)://HOST:PORT[/PATH]") from None
    if u.scheme not in ("http", "https") or not u.hostname or port == 0 or u.fragment:
        raise OtlpError(f"{name} must be an http:// or https:// URL with a host (OTLP over HTTP)")
    if u.username is not None or u.password is not None:
        # A credential in a URL ends up in messages: the collector's key belongs in the headers.
        raise OtlpError(f"{name} carries a user or password: put credentials in OTEL_EXPORTER_OTLP_HEADERS")
    if any(c in url for c in "\r\n\0 ") or len(url) > MAX_TEXT:
        raise OtlpError(f"{name} holds spaces or control characters, or is too long")
    return url


def fields(cfg: OtlpConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in WIRE_KEYS}


# ---- on the wire to the daemon (inside the bind's spec) -------------------------------------

WIRE_KEYS: Final = (
    "endpoint", "protocol", "headers", "timeout", "compression", "resource", "certificate",
    "queue", "batch", "delay", "deadline",
)  # fmt: skip


def encode(cfg: OtlpConfig | None) -> dict[str, Any] | None:
    """Plain JSON: pairs as two-element lists."""
    if cfg is None:
        return None
    out = fields(cfg)
    out["headers"] = [list(p) for p in cfg.headers]
    out["resource"] = [list(p) for p in cfg.resource]
    return out


def decode(obj: Any, error: type[Exception] = ValueError) -> OtlpConfig | None:
    """What `encode` made, checked as strictly as the rest of the spec; `error` (the spec's SpecError) names
    the field, never a value (a header's value is a secret)."""
    if obj is None:
        return None
    try:
        return _decode(obj)
    except OtlpError as e:
        raise error(str(e)) from None


def _decode(obj: Any) -> OtlpConfig:
    if not isinstance(obj, dict) or set(obj) != set(WIRE_KEYS):
        raise OtlpError(f"otlp must be an object with exactly the keys {', '.join(WIRE_KEYS)}")
    endpoint = check_url(_str(obj["endpoint"], "endpoint"), "otlp.endpoint")
    if obj["protocol"] not in ("http/protobuf", "http/json") or obj["compression"] not in ("gzip", "none"):
        raise OtlpError("otlp.protocol or otlp.compression is not one sandgate speaks")
    headers = _pairs(obj["headers"], "otlp.headers")
    if any(not set(k) <= TOKEN or not k or any(c in v for c in "\r\n\0") for k, v in headers):
        raise OtlpError("otlp.headers holds an invalid header name or value")
    cert = obj["certificate"]
    if cert is not None:
        cert = _str(cert, "otlp.certificate", 1 << 20)
    queue, batch = _count(obj["queue"], "otlp.queue"), _count(obj["batch"], "otlp.batch")
    if batch > queue:
        raise OtlpError("otlp.batch is larger than otlp.queue")
    return OtlpConfig(
        endpoint,
        obj["protocol"],
        headers,
        _seconds(obj["timeout"], "otlp.timeout"),
        obj["compression"],
        _pairs(obj["resource"], "otlp.resource"),
        cert,
        queue,
        batch,
        _seconds(obj["delay"], "otlp.delay"),
        _seconds(obj["deadline"], "otlp.deadline"),
    )


def _str(value: Any, where: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise OtlpError(f"{where} must be a string of at most {limit} characters")
    return value


def _pairs(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or len(value) > MAX_PAIRS:
        raise OtlpError(f"{where} must be a list of at most {MAX_PAIRS} pairs")
    out = []
    for p in value:
        if not isinstance(p, list) or len(p) != 2:
            raise OtlpError(f"{where} must hold [name, value] pairs")
        out.append((_str(p[0], where), _str(p[1], where)))
    return tuple(out)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_QUEUE:
        raise OtlpError(f"{where} must be an integer from 1 to {MAX_QUEUE}")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise OtlpError(f"{where} must be a number of seconds")
    if not 0 < value <= MAX_SECONDS:
        raise OtlpError(f"{where} must be more than 0 and at most {MAX_SECONDS:g} seconds")
    return float(value)

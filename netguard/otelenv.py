"""The standard OTEL_* variables of `sandgate run` as one OtlpConfig (netguard.otlp), read as the OTel spec says.

Per the spec (protocol/exporter.md, configuration/sdk-environment-variables.md):
  OTEL_EXPORTER_OTLP_LOGS_ENDPOINT  used as is; else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/logs. Neither
                                     set: no export (sandgate never guesses a localhost:4318)
  *_PROTOCOL   http/protobuf (default) or http/json; grpc is refused (not implemented)
  *_HEADERS    k=v,k2=v2, values percent-decoded (W3C baggage without properties)
  *_TIMEOUT    ms per request (10000);  *_COMPRESSION gzip|none;  *_CERTIFICATE a PEM file of roots
  OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME (default service.name "sandgate"), OTEL_SDK_DISABLED,
  OTEL_LOGS_EXPORTER (none: off), OTEL_BLRP_* (the batch processor's queue, batch, delay, deadline)
The LOGS_ variable of a pair wins over the generic one, whole (headers are not merged). A value that
cannot be parsed is warned about and treated as unset, as the spec says; what sandgate cannot honour
(grpc, an endpoint that is not an http(s) URL, an unreadable certificate) is an OtlpError. Warnings
and errors name variables and positions, never a header's value. Pure: no I/O but the certificate
reader the caller passes.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping

from netguard.otlp import (
    MAX_PAIRS,
    MAX_QUEUE,
    MAX_SECONDS,
    MAX_TEXT,
    TOKEN,
    Compression,
    OtlpConfig,
    OtlpError,
    Protocol,
    check_url,
    fields,
)


def from_env(environ: Mapping[str, str], read_pem: Callable[[str], str]) -> tuple[OtlpConfig | None, list[str]]:
    """The run's export settings (None: no export) and warnings about values treated as unset."""
    warnings: list[str] = []

    def get(name: str) -> str | None:
        value = environ.get(name, "").strip()
        return value or None  # the spec: an empty value is an unset one

    def pick(suffix: str) -> tuple[str, str] | None:
        for name in (f"OTEL_EXPORTER_OTLP_LOGS_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}"):
            value = get(name)
            if value is not None:
                return name, value
        return None

    if (get("OTEL_SDK_DISABLED") or "").lower() == "true":
        return None, warnings
    exporters = get("OTEL_LOGS_EXPORTER")
    if exporters is not None and "otlp" not in [e.strip().lower() for e in exporters.split(",")]:
        return None, warnings
    endpoint = _endpoint(get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    if endpoint is None:
        return None, warnings
    cfg = OtlpConfig(
        endpoint,
        _protocol(pick("PROTOCOL"), warnings),
        _headers(pick("HEADERS"), warnings),
        _millis(pick("TIMEOUT"), 10.0, warnings),
        _compression(pick("COMPRESSION"), warnings),
        _resource(get("OTEL_RESOURCE_ATTRIBUTES"), get("OTEL_SERVICE_NAME"), warnings),
        _certificate(pick("CERTIFICATE"), read_pem),
    )
    return _batching(cfg, get, warnings), warnings


def _endpoint(logs: str | None, generic: str | None) -> str | None:
    if logs is not None:
        return check_url(logs, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
    if generic is None:
        return None
    base = check_url(generic, "OTEL_EXPORTER_OTLP_ENDPOINT")
    u = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(u._replace(path=u.path.rstrip("/") + "/v1/logs"))


def _protocol(found: tuple[str, str] | None, warnings: list[str]) -> Protocol:
    if found is None:
        return "http/protobuf"
    name, value = found
    if value in ("http/protobuf", "http/json"):
        return "http/protobuf" if value == "http/protobuf" else "http/json"
    if value == "grpc":
        raise OtlpError(
            f"{name}=grpc: sandgate exports over OTLP/HTTP only; set OTEL_EXPORTER_OTLP_LOGS_PROTOCOL=http/protobuf "
            "and an OTLP/HTTP endpoint (the collector's port 4318)"
        )
    warnings.append(f"{name}: unknown protocol {value[:40]!r}, using http/protobuf")
    return "http/protobuf"


def parse_pairs(text: str, name: str, warnings: list[str]) -> list[tuple[str, str]]:
    """`k=v,k2=v2` as the spec reads it (W3C baggage without properties): keys and values trimmed,
    values percent-decoded; a member without `=` or with an empty key is skipped with a warning that
    names its position only (the values may be secrets)."""
    out: list[tuple[str, str]] = []
    for i, member in enumerate(text.split(","), 1):
        if not member.strip():
            continue
        key, eq, value = member.partition("=")
        key = key.strip()
        if not eq or not key:
            warnings.append(f"{name}: entry {i} is not key=value; ignored")
            continue
        out.append((urllib.parse.unquote(key), urllib.parse.unquote(value.strip(), errors="replace")))
    if len(out) > MAX_PAIRS:
        warnings.append(f"{name}: more than {MAX_PAIRS} entries; the rest ignored")
    return out[:MAX_PAIRS]


def _headers(found: tuple[str, str] | None, warnings: list[str]) -> tuple[tuple[str, str], ...]:
    if found is None:
        return ()
    name, text = found
    out = []
    for i, (key, value) in enumerate(parse_pairs(text, name, warnings), 1):
        # Threat: a decoded CR/LF would add headers (or a request) of its own to every export.
        if not set(key) <= TOKEN or any(c in value for c in "\r\n\0") or len(value) > MAX_TEXT:
            warnings.append(f"{name}: header {i} is not a valid HTTP header name and value; ignored")
            continue
        out.append((key, value))
    return tuple(out)


def _millis(found: tuple[str, str] | None, default: float, warnings: list[str]) -> float:
    if found is None:
        return default
    name, value = found
    try:
        ms = int(value)
    except ValueError:
        ms = -1
    if ms <= 0:
        warnings.append(f"{name}: not a positive number of milliseconds; using {int(default * 1000)}")
        return default
    return min(ms / 1000, MAX_SECONDS)


def _compression(found: tuple[str, str] | None, warnings: list[str]) -> Compression:
    if found is None or found[1] == "none":
        return "none"
    if found[1] == "gzip":
        return "gzip"
    warnings.append(f"{found[0]}: unknown compression {found[1][:40]!r}; sending uncompressed")
    return "none"


def _resource(attrs: str | None, service: str | None, warnings: list[str]) -> tuple[tuple[str, str], ...]:
    """OTEL_RESOURCE_ATTRIBUTES, with service.name from OTEL_SERVICE_NAME first, else "sandgate"."""
    pairs = dict(parse_pairs(attrs, "OTEL_RESOURCE_ATTRIBUTES", warnings)) if attrs else {}
    if service is not None:
        pairs["service.name"] = service
    pairs.setdefault("service.name", "sandgate")
    return tuple(pairs.items())


def _certificate(found: tuple[str, str] | None, read_pem: Callable[[str], str]) -> str | None:
    if found is None:
        return None
    name, path = found
    try:
        pem = read_pem(path)
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or type(e).__name__
        raise OtlpError(f"cannot read {name} {path}: {why}; point it at a PEM file of CA certificates") from None
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise OtlpError(f"{name} {path} holds no PEM certificate")
    return pem


def _batching(cfg: OtlpConfig, get: Callable[[str], str | None], warnings: list[str]) -> OtlpConfig:
    """OTEL_BLRP_*: the batch log record processor's settings, bounded (the daemon is shared)."""

    def number(name: str, default: int, top: int) -> int:
        value = get(name)
        if value is None:
            return default
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n <= 0:
            warnings.append(f"{name}: not a positive integer; using {default}")
            return default
        return min(n, top)

    queue = number("OTEL_BLRP_MAX_QUEUE_SIZE", 2048, MAX_QUEUE)
    batch = min(number("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", 512, MAX_QUEUE), queue)  # the spec: at most the queue
    delay = number("OTEL_BLRP_SCHEDULE_DELAY", 1000, int(MAX_SECONDS * 1000)) / 1000
    deadline = number("OTEL_BLRP_EXPORT_TIMEOUT", 30000, int(MAX_SECONDS * 1000)) / 1000
    return OtlpConfig(**{**fields(cfg), "queue": queue, "batch": batch, "delay": delay, "deadline": deadline})

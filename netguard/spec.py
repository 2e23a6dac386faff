"""What the launcher tells the daemon about one sandbox: a typed spec and its plain-JSON form.

The launcher parses YAML and argv once and sends `encode(spec)`; the daemon only ever runs `decode`, which is strict
(exact keys, exact JSON types), so a confused or hostile peer is refused with one clear message instead of being
half-understood. What a value must be (canonical hosts, ports, request rules...) the types check when made
(netguard.ruleinvariants, HttpRule, Secret, BindingSpec): the decoder only builds them, and a refusal of theirs
becomes its one SpecError. Origins travel as [FILE, LINE]. Pure: no I/O. Long runs of plain name rules (a hosts_file
of 10^5 names) travel as groups: one object with the names and their origins' line numbers each joined by newlines,
~10x smaller and faster than a dict per rule. `to_bytes` puts the policy apart from the rest so the daemon can cache the decoded, compiled policy
by the hash of exactly those bytes (netguard.daemon.specbytes).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from netguard import otlp, upstreamproxy
from netguard.credentials import Secret
from netguard.httprules import HttpRule
from netguard.policy import NetworkPolicy, Rule, new_rule
from sgbase.origin import Origin

SPEC_KEYS = (
    "task", "policy", "learn", "ask_all", "approval_socket", "ask_timeout", "ca", "upstream_ca", "secrets",
    "upstream_proxy", "otlp",
)  # fmt: skip
POLICY_KEYS = ("allow", "deny", "ask", "resolver", "resolver_origin")
RULE_KEYS = ("kind", "value", "ports", "origin", "dns", "inspect", "http", "log_query")
GROUP_KEYS = ("kind", "ports", "origin", "values", "lines")  # `origin` + each line: the rule's origin
GROUP_MIN = 32  # shorter runs stay one dict per rule: the form every small policy has always had
GROUP_KIND = "names"  # a group's kind: host names, and wildcards written `*.suffix`
HTTP_KEYS = ("methods", "paths", "origin", "websocket")
CA_KEYS = ("cert", "key")
SECRET_KEYS = ("host", "header", "value", "real", "sentinel", "variable", "origin")
MAX_PEM = 1 << 20
MAX_TASK = 200
MAX_TEXT = 4096
MAX_LINE_DIGITS = 9  # a line number in a group's `lines`: int() of a longer text is not worth the time


class SpecError(ValueError):
    """A spec the daemon refuses; the message names the offending field."""


@dataclass(frozen=True)
class CaPair:
    """The run's inspection CA: PEM certificate and private key (the key never enters the sandbox)."""

    cert: str
    key: str


@dataclass(frozen=True)
class Received:
    """A spec as read from the launcher's memfd: the rest still to decode, the policy already decoded (cached)."""

    header: dict[str, Any]  # encode(spec) without "policy"
    policy: NetworkPolicy


@dataclass(frozen=True)
class BindingSpec:
    """One sandbox as the daemon needs it: already parsed, compiled by the daemon with rules.compile_policy."""

    task: str
    policy: NetworkPolicy
    learn: bool = False
    ask_all: bool = False
    approval_socket: str | None = None
    ask_timeout: float = 60.0
    ca: CaPair | None = None  # needed when any rule inspects or a credential is bound
    upstream_ca: str | None = None  # PEM: extra roots for inspected upstreams (default: the host's store)
    secrets: tuple[Secret, ...] = ()
    upstream_proxy: upstreamproxy.Upstream | None = None  # the run's corporate proxy (netguard.upstreamproxy)
    otlp: otlp.OtlpConfig | None = None  # the run's OTEL_* settings: its records go there too (netguard.otlp)

    def __post_init__(self) -> None:
        """What every spec is, whoever made it (the launcher, decode): SpecError if not."""
        if not self.task or not self.task.isprintable():
            raise SpecError("task must be a non-empty string of printable characters")  # one log line per bind
        if self.approval_socket is not None and (
            not self.approval_socket.startswith("/") or "\0" in self.approval_socket
        ):
            raise SpecError("approval_socket must be an absolute path")  # the daemon's cwd is not the launcher's
        t = self.ask_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise SpecError("ask_timeout must be a positive finite number of seconds")
        if self.ca is None and (self.secrets or any(r.inspect for r in self.policy.allow)):
            raise SpecError("ca is needed: a rule inspects or a credential is bound")  # fail closed, never passthrough


# ---- encode ---------------------------------------------------------------------------------


def encode(spec: BindingSpec) -> dict[str, Any]:
    """Plain JSON-able data (dicts, lists, str, int, float, bool, None)."""
    p = spec.policy
    return {
        "task": spec.task,
        "policy": {
            "allow": _encode_list(p.allow),
            "deny": _encode_list(p.deny),
            "ask": _encode_list(p.ask),
            "resolver": [p.resolver[0], p.resolver[1]] if p.resolver is not None else None,
            "resolver_origin": _encode_origin(p.resolver_origin) if p.resolver_origin is not None else None,
        },
        "learn": spec.learn,
        "ask_all": spec.ask_all,
        "approval_socket": spec.approval_socket,
        "ask_timeout": float(spec.ask_timeout),
        "ca": {"cert": spec.ca.cert, "key": spec.ca.key} if spec.ca is not None else None,
        "upstream_ca": spec.upstream_ca,
        "secrets": [_encode_secret(x) for x in spec.secrets],
        "upstream_proxy": upstreamproxy.encode(spec.upstream_proxy),
        "otlp": otlp.encode(spec.otlp),
    }


def _encode_origin(o: Origin) -> list[Any]:
    return [o.path, o.line]


def _encode_secret(x: Secret) -> dict[str, Any]:
    return {k: _encode_origin(x.origin) if k == "origin" else getattr(x, k) for k in SECRET_KEYS}


def _encode_list(rules: tuple[Rule, ...]) -> list[dict[str, Any]]:
    """Rule dicts; runs of GROUP_MIN or more plain name rules with one ports set and origin file as groups
    (names and wildcards together, a wildcard's suffix as `*.suffix`: a hosts file mixes them freely)."""
    out: list[dict[str, Any]] = []
    run: list[Rule] = []
    key: tuple[Any, ...] = ()
    for r in rules:
        if r.kind == "cidr" or r.dns or r.inspect or r.http is not None or r.log_query:
            _flush(run, out)
            out.append(_encode_rule(r))
            continue
        if (r.ports, r.origin.path) != key:
            _flush(run, out)
            key = (r.ports, r.origin.path)
        run.append(r)
    _flush(run, out)
    return out


def _flush(run: list[Rule], out: list[dict[str, Any]]) -> None:
    if len(run) < GROUP_MIN:
        out.extend(_encode_rule(r) for r in run)
    elif run:
        ports = run[0].ports
        values = "\n".join(f"*.{r.value}" if r.kind == "wildcard" else str(r.value) for r in run)
        out.append({"kind": GROUP_KIND, "ports": sorted(ports) if ports is not None else None,
                    "origin": run[0].origin.path, "values": values,
                    "lines": "\n".join("" if r.origin.line is None else str(r.origin.line) for r in run)})  # fmt: skip
    run.clear()


def _encode_rule(r: Rule) -> dict[str, Any]:
    return {
        "kind": r.kind,
        "value": str(r.value),
        "ports": sorted(r.ports) if r.ports is not None else None,
        "origin": _encode_origin(r.origin),
        "dns": sorted(r.dns) if r.dns else None,
        "inspect": r.inspect,
        "http": [_encode_http(h) for h in r.http] if r.http is not None else None,
        "log_query": r.log_query,
    }


def _encode_http(h: HttpRule) -> dict[str, Any]:
    return {
        "methods": sorted(h.methods) if h.methods is not None else None,
        "paths": list(h.paths) if h.paths is not None else None,
        "origin": _encode_origin(h.origin),
        "websocket": h.websocket,
    }


# ---- decode ---------------------------------------------------------------------------------


def decode(obj: Any) -> BindingSpec:
    """The spec `obj` describes (encode's dict, or a Received); SpecError for anything `encode` would not have produced."""
    if isinstance(obj, Received):
        d = _mapping(obj.header, "spec", tuple(k for k in SPEC_KEYS if k != "policy"))
        policy = obj.policy
    else:
        d = _mapping(obj, "spec", SPEC_KEYS)
        policy = decode_policy(d["policy"])
    sock = _text(d["approval_socket"], "approval_socket", MAX_TEXT) if d["approval_socket"] is not None else None
    timeout = d["ask_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise SpecError("ask_timeout must be a positive finite number of seconds")
    ca = None
    if d["ca"] is not None:
        c = _mapping(d["ca"], "ca", CA_KEYS)
        ca = CaPair(_text(c["cert"], "ca.cert", MAX_PEM), _text(c["key"], "ca.key", MAX_PEM))
    upstream = _text(d["upstream_ca"], "upstream_ca", MAX_PEM) if d["upstream_ca"] is not None else None
    secrets = tuple(_decode_secret(x, f"secrets[{i}]") for i, x in enumerate(_list(d["secrets"], "secrets")))
    return BindingSpec(  # checks itself (SpecError)
        _text(d["task"], "task", MAX_TASK),
        policy,
        _bool(d["learn"], "learn"),
        _bool(d["ask_all"], "ask_all"),
        sock,
        float(timeout),
        ca,
        upstream,
        secrets,
        upstreamproxy.decode(d["upstream_proxy"], SpecError),
        otlp.decode(d["otlp"], SpecError),
    )


def _built[T](where: str, make: Callable[[], T]) -> T:
    """`make()`, its refusal (a type's invariant, netguard.ruleinvariants) turned into the decoder's one error."""
    try:
        return make()
    except ValueError as e:  # PolicyError, and Origin's refusal of a line
        raise SpecError(f"{where}: {e}") from None


def _decode_secret(obj: Any, where: str) -> Secret:
    d = _mapping(obj, where, SECRET_KEYS)
    f = {k: _text(d[k], f"{where}.{k}", MAX_TEXT) for k in SECRET_KEYS if k != "origin"}
    origin = _decode_origin(d["origin"], f"{where}.origin")
    return _built(where, lambda: Secret(**f, origin=origin))


def decode_policy(obj: Any) -> NetworkPolicy:
    d = _mapping(obj, "policy", POLICY_KEYS)
    lists: dict[str, tuple[Rule, ...]] = {}
    for name in ("allow", "deny", "ask"):
        found: list[Rule] = []
        for i, item in enumerate(_list(d[name], f"policy.{name}")):
            if isinstance(item, dict) and "values" in item:
                found.extend(_decode_group(item, f"policy.{name}[{i}]"))
            else:
                found.append(_decode_rule(item, f"policy.{name}[{i}]"))
        lists[name] = tuple(found)
    resolver = d["resolver"]
    if resolver is not None and (
        not isinstance(resolver, list) or len(resolver) != 2 or not isinstance(resolver[0], str)
        or isinstance(resolver[1], bool) or not isinstance(resolver[1], int)
    ):  # fmt: skip
        raise SpecError("policy.resolver must be null or [IP, PORT]")
    origin = d["resolver_origin"]
    origin = _decode_origin(origin, "policy.resolver_origin") if origin is not None else None
    return _built(
        "policy",
        lambda: NetworkPolicy(
            lists["allow"], lists["deny"], lists["ask"], (resolver[0], resolver[1]) if resolver else None, origin
        ),
    )


def _decode_group(obj: Any, where: str) -> list[Rule]:
    """A run of plain name rules (see _flush), each built (and so checked) like any other rule."""
    d = _mapping(obj, where, GROUP_KEYS)
    ports = _ints(d["ports"], f"{where}.ports")
    path = _text(d["origin"], f"{where}.origin", MAX_TEXT)
    if not isinstance(d["values"], str) or not isinstance(d["lines"], str):
        raise SpecError(f"{where}.values and .lines must be strings")
    values, lines = d["values"].split("\n"), d["lines"].split("\n")
    if len(values) != len(lines) or len(values) < GROUP_MIN:
        raise SpecError(f"{where}: values and lines differ in number, or the group is shorter than {GROUP_MIN}")
    if any(line and not (line.isascii() and line.isdigit() and len(line) <= MAX_LINE_DIGITS) for line in lines):
        raise SpecError(f"{where}.lines: a line that is not a line number")
    if d["kind"] != GROUP_KIND:
        raise SpecError(f"{where}.kind must be {GROUP_KIND!r}")
    return _built(
        where,
        lambda: [
            new_rule("wildcard", v[2:], ports, Origin(path, int(n) if n else None))
            if v.startswith("*.")  # no canonical name starts with "*": a wildcard's suffix, as written in hosts files
            else new_rule("host", v, ports, Origin(path, int(n) if n else None))
            for v, n in zip(values, lines, strict=True)
        ],
    )


def _ints(obj: Any, where: str) -> frozenset[int] | None:
    """Null or a list of whole numbers (ports, DNS types): what they must be, the rule checks."""
    if obj is None:
        return None
    if not isinstance(obj, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in obj):
        raise SpecError(f"{where} must be null or a list of whole numbers")
    return frozenset(obj)


def _decode_origin(obj: Any, where: str) -> Origin:
    if not isinstance(obj, list) or len(obj) != 2 or (obj[1] is not None and type(obj[1]) is not int):
        raise SpecError(f"{where} must be [FILE, LINE] with LINE a whole number or null")
    path = _text(obj[0], where, MAX_TEXT)
    return _built(where, lambda: Origin(path, obj[1]))


def _decode_rule(obj: Any, where: str) -> Rule:
    d = _mapping(obj, where, RULE_KEYS)
    text = _text(d["value"], f"{where}.value", MAX_TEXT)
    value: str | ipaddress.IPv4Network | ipaddress.IPv6Network = text
    if d["kind"] == "cidr":
        try:
            value = ipaddress.ip_network(text, strict=True)
        except ValueError as e:
            raise SpecError(f"{where}.value: invalid network: {e}") from None
    ports, dns = _ints(d["ports"], f"{where}.ports"), _ints(d["dns"], f"{where}.dns")
    origin = _decode_origin(d["origin"], f"{where}.origin")
    inspect, log_query = _bool(d["inspect"], f"{where}.inspect"), _bool(d["log_query"], f"{where}.log_query")
    http = _decode_http(d["http"], where)
    return _built(where, lambda: Rule(d["kind"], value, ports, origin, dns, inspect, http, log_query))


def _decode_http(obj: Any, where: str) -> tuple[HttpRule, ...] | None:
    if obj is None:
        return None
    out = []
    for i, item in enumerate(_list(obj, f"{where}.http")):
        w = f"{where}.http[{i}]"
        d = _mapping(item, w, HTTP_KEYS)
        methods, paths = (_strings(d[k], f"{w}.{k}") for k in ("methods", "paths"))
        origin = _decode_origin(d["origin"], f"{w}.origin")
        websocket = _bool(d["websocket"], f"{w}.websocket")
        ms = frozenset(methods) if methods is not None else None
        ps = tuple(paths) if paths is not None else None
        out.append(_built(w, lambda: HttpRule(ms, ps, origin, websocket)))  # noqa: B023 (called at once)
    return tuple(out)


def _strings(obj: Any, where: str) -> list[str] | None:
    if obj is not None and (not isinstance(obj, list) or not all(isinstance(x, str) for x in obj)):
        raise SpecError(f"{where} must be null or a list of strings")
    return obj


def _list(obj: Any, where: str) -> list[Any]:
    if not isinstance(obj, list):
        raise SpecError(f"{where} must be a list")
    return obj


def _mapping(obj: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise SpecError(f"{where} must be an object")
    missing = [k for k in keys if k not in obj]
    extra = sorted(str(k) for k in obj if k not in keys)
    if missing or extra:
        # Unknown keys are refused, not ignored: a newer launcher's setting must never be silently dropped.
        raise SpecError(
            f"{where}: "
            + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else [])
                + ([f"unknown {', '.join(extra)}"] if extra else [])
            )
        )
    return obj


def _text(value: Any, where: str, limit: int) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{where} must be a string")
    if len(value) > limit:
        raise SpecError(f"{where} is longer than {limit} characters")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{where} must be true or false")
    return value

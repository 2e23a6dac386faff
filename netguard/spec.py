"""What the launcher tells the daemon about one sandbox: a typed spec and its plain-JSON form.

The launcher parses YAML and argv once and sends `encode(spec)`; the daemon only ever runs `decode`, which is strict
(exact keys, exact types, canonical hosts), so a confused or hostile peer is refused with one clear message instead
of being half-understood. Pure: no I/O. Long runs of plain name rules (a hosts_file of 10^5 names) travel as groups:
one object with the names and their origins' line numbers each joined by newlines, ~10x smaller and faster than a
dict per rule. `to_bytes` puts the policy apart from the rest so the daemon can cache the decoded, compiled policy
by the hash of exactly those bytes (netguard.daemon.specbytes).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Any

from netguard import hosts, otlp, upstreamproxy
from netguard.credentials import Secret
from netguard.httprules import HttpRule, canonical_path
from netguard.policy import NetworkPolicy, Rule, new_rule

SPEC_KEYS = (
    "task", "policy", "learn", "ask_all", "approval_socket", "ask_timeout", "ca", "upstream_ca", "secrets",
    "upstream_proxy", "otlp",
)  # fmt: skip
POLICY_KEYS = ("allow", "deny", "ask", "resolver", "resolver_origin")
RULE_KEYS = ("kind", "value", "ports", "origin", "dns", "inspect", "http", "log_query")
GROUP_KEYS = ("kind", "ports", "origin", "values", "lines")  # `origin` + each line: the rule's origin
GROUP_MIN = 32  # shorter runs stay one dict per rule: the form every small policy has always had
HTTP_KEYS = ("methods", "paths", "origin", "websocket")
CA_KEYS = ("cert", "key")
SECRET_KEYS = ("host", "header", "value", "real", "sentinel", "variable", "origin")
MAX_PEM = 1 << 20
RULE_KINDS = ("host", "wildcard", "cidr")
MAX_TASK = 200
MAX_TEXT = 4096


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
            "resolver_origin": p.resolver_origin,
        },
        "learn": spec.learn,
        "ask_all": spec.ask_all,
        "approval_socket": spec.approval_socket,
        "ask_timeout": float(spec.ask_timeout),
        "ca": {"cert": spec.ca.cert, "key": spec.ca.key} if spec.ca is not None else None,
        "upstream_ca": spec.upstream_ca,
        "secrets": [{k: getattr(x, k) for k in SECRET_KEYS} for x in spec.secrets],
        "upstream_proxy": upstreamproxy.encode(spec.upstream_proxy),
        "otlp": otlp.encode(spec.otlp),
    }


def _encode_list(rules: tuple[Rule, ...]) -> list[dict[str, Any]]:
    """Rule dicts; runs of GROUP_MIN or more plain name rules with one ports set and origin file as groups."""
    out: list[dict[str, Any]] = []
    run: list[Rule] = []
    key: tuple[Any, ...] = ()
    for r in rules:
        prefix = r.origin[: r.origin.rfind(":") + 1]
        plain = r.kind != "cidr" and not (r.dns or r.inspect or r.http is not None or r.log_query)
        if not plain or "\n" in r.origin[len(prefix) :]:  # a line break in a file name cannot be joined
            _flush(run, out)
            out.append(_encode_rule(r))
            continue
        if (r.kind, r.ports, prefix) != key:
            _flush(run, out)
            key = (r.kind, r.ports, prefix)
        run.append(r)
    _flush(run, out)
    return out


def _flush(run: list[Rule], out: list[dict[str, Any]]) -> None:
    if len(run) < GROUP_MIN:
        out.extend(_encode_rule(r) for r in run)
    elif run:
        n, ports = run[0].origin.rfind(":") + 1, run[0].ports
        out.append({"kind": run[0].kind, "ports": sorted(ports) if ports is not None else None,
                    "origin": run[0].origin[:n], "values": "\n".join(str(r.value) for r in run),
                    "lines": "\n".join(r.origin[n:] for r in run)})  # fmt: skip
    run.clear()


def _encode_rule(r: Rule) -> dict[str, Any]:
    return {
        "kind": r.kind,
        "value": str(r.value),
        "ports": sorted(r.ports) if r.ports is not None else None,
        "origin": r.origin,
        "dns": sorted(r.dns) if r.dns else None,
        "inspect": r.inspect,
        "http": [_encode_http(h) for h in r.http] if r.http is not None else None,
        "log_query": r.log_query,
    }


def _encode_http(h: HttpRule) -> dict[str, Any]:
    return {
        "methods": sorted(h.methods) if h.methods is not None else None,
        "paths": list(h.paths) if h.paths is not None else None,
        "origin": h.origin,
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
    task = _text(d["task"], "task", MAX_TASK)
    if not task or not task.isprintable():
        raise SpecError("task must be a non-empty string of printable characters")  # one log line per bind
    sock = d["approval_socket"]
    if sock is not None:
        sock = _text(sock, "approval_socket", MAX_TEXT)
        if not sock.startswith("/") or "\0" in sock:
            raise SpecError("approval_socket must be an absolute path")  # the daemon's cwd is not the launcher's
    timeout = d["ask_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise SpecError("ask_timeout must be a positive finite number of seconds")
    ca = None
    if d["ca"] is not None:
        c = _mapping(d["ca"], "ca", CA_KEYS)
        ca = CaPair(_text(c["cert"], "ca.cert", MAX_PEM), _text(c["key"], "ca.key", MAX_PEM))
    upstream = _text(d["upstream_ca"], "upstream_ca", MAX_PEM) if d["upstream_ca"] is not None else None
    if not isinstance(d["secrets"], list):
        raise SpecError("secrets must be a list")
    secrets = tuple(_decode_secret(x, f"secrets[{i}]") for i, x in enumerate(d["secrets"]))
    if ca is None and (secrets or any(r.inspect for r in policy.allow)):
        raise SpecError("ca is needed: a rule inspects or a credential is bound")  # fail closed, never passthrough
    return BindingSpec(
        task,
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


def _decode_secret(obj: Any, where: str) -> Secret:
    d = _mapping(obj, where, SECRET_KEYS)
    f = {k: _text(d[k], f"{where}.{k}", MAX_TEXT) for k in SECRET_KEYS}
    if not f["sentinel"] or not f["real"] or any(c in f["value"] for c in "\r\n\0"):
        raise SpecError(f"{where}: empty sentinel or secret, or a line break in the header value")
    try:
        canonical = hosts.normalise_name(f["host"])
    except hosts.HostError as e:
        raise SpecError(f"{where}.host: {e}") from None
    if canonical != f["host"]:
        raise SpecError(f"{where}.host {f['host']!r} is not in canonical form ({canonical!r})")
    return Secret(**f)


def decode_policy(obj: Any) -> NetworkPolicy:
    d = _mapping(obj, "policy", POLICY_KEYS)
    lists: dict[str, tuple[Rule, ...]] = {}
    for name in ("allow", "deny", "ask"):
        items = d[name]
        if not isinstance(items, list):
            raise SpecError(f"policy.{name} must be a list")
        found: list[Rule] = []
        for i, item in enumerate(items):
            if isinstance(item, dict) and "values" in item:
                found.extend(_decode_group(item, f"policy.{name}[{i}]"))
            else:
                found.append(_decode_rule(item, f"policy.{name}[{i}]"))
        lists[name] = tuple(found)
    resolver = _decode_resolver(d["resolver"])
    origin = d["resolver_origin"]
    if origin is not None:
        origin = _text(origin, "policy.resolver_origin", MAX_TEXT)
    return NetworkPolicy(lists["allow"], lists["deny"], lists["ask"], resolver, origin)


def _decode_group(obj: Any, where: str) -> list[Rule]:
    """A run of plain name rules (see _flush): every name canonical, every origin bounded like a rule's."""
    d = _mapping(obj, where, GROUP_KEYS)
    if d["kind"] not in ("host", "wildcard"):
        raise SpecError(f"{where}.kind must be host or wildcard")
    ports = _ports(d["ports"], where)
    prefix = _text(d["origin"], f"{where}.origin", MAX_TEXT)
    if not isinstance(d["values"], str) or not isinstance(d["lines"], str):
        raise SpecError(f"{where}.values and .lines must be strings")
    values, lines = d["values"].split("\n"), d["lines"].split("\n")
    if len(values) != len(lines) or len(values) < GROUP_MIN:
        raise SpecError(f"{where}: values and lines differ in number, or the group is shorter than {GROUP_MIN}")
    kind, rules = d["kind"], []
    for value, line in zip(values, lines, strict=True):
        _canonical(value, where)
        if len(prefix) + len(line) > MAX_TEXT:
            raise SpecError(f"{where}.lines: an origin is longer than {MAX_TEXT} characters")
        rules.append(new_rule(kind, value, ports, prefix + line))
    return rules


def _canonical(value: str, where: str) -> None:
    # A non-canonical name would silently never match: refuse it so the launcher's bug is seen.
    try:
        canonical = hosts.normalise_name(value)
    except hosts.HostError as e:
        raise SpecError(f"{where}.value: {e}") from None
    if canonical != value:
        raise SpecError(f"{where}.value {value!r} is not in canonical form ({canonical!r})")


def _ports(ports: Any, where: str) -> frozenset[int] | None:
    if ports is None:
        return None
    if not isinstance(ports, list) or any(
        isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536 for p in ports
    ):
        raise SpecError(f"{where}.ports must be null or a list of port numbers from 1 to 65535")
    return frozenset(ports)


def _decode_rule(obj: Any, where: str) -> Rule:
    d = _mapping(obj, where, RULE_KEYS)
    kind = d["kind"]
    if kind not in RULE_KINDS:
        raise SpecError(f"{where}.kind must be one of {', '.join(RULE_KINDS)}")
    value = _text(d["value"], f"{where}.value", MAX_TEXT)
    ports = _ports(d["ports"], where)
    origin = _text(d["origin"], f"{where}.origin", MAX_TEXT)
    dns = d["dns"]
    if dns is not None:
        if (
            not isinstance(dns, list)
            or not dns
            or any(isinstance(t, bool) or not isinstance(t, int) or not 0 < t < 65536 for t in dns)
        ):
            raise SpecError(f"{where}.dns must be null or a non-empty list of DNS type numbers from 1 to 65535")
        if kind != "wildcard":
            raise SpecError(f"{where}.dns is only meaningful on a wildcard rule")
        dns = frozenset(dns)
    inspect, log_query = _bool(d["inspect"], f"{where}.inspect"), _bool(d["log_query"], f"{where}.log_query")
    http = _decode_http(d["http"], where)
    if (http is not None or log_query) and not inspect:
        raise SpecError(f"{where}: http rules and log_query need inspect")
    if kind == "cidr":
        if inspect:
            raise SpecError(f"{where}: a cidr rule cannot inspect")
        return Rule("cidr", _network(value, where), ports, origin)
    _canonical(value, where)
    return Rule("host" if kind == "host" else "wildcard", value, ports, origin, dns, inspect, http, log_query)


def _decode_http(obj: Any, where: str) -> tuple[HttpRule, ...] | None:
    if obj is None:
        return None
    if not isinstance(obj, list) or not obj:
        raise SpecError(f"{where}.http must be null or a non-empty list")
    out = []
    for i, item in enumerate(obj):
        w = f"{where}.http[{i}]"
        d = _mapping(item, w, HTTP_KEYS)
        methods, paths = d["methods"], d["paths"]
        if methods is not None and (not isinstance(methods, list) or not methods or not all(
            isinstance(m, str) and m and m == m.upper() and m.isprintable() and " " not in m for m in methods
        )):  # fmt: skip
            raise SpecError(f"{w}.methods must be null or a non-empty list of upper-case methods")
        if paths is not None and (not isinstance(paths, list) or not paths or not all(
            isinstance(p, str) and canonical_path(p.replace("*", "x")) == p.replace("*", "x") for p in paths
        )):  # fmt: skip
            raise SpecError(f"{w}.paths must be null or a non-empty list of canonical path patterns")
        out.append(HttpRule(
            frozenset(methods) if methods is not None else None,
            tuple(paths) if paths is not None else None,
            _text(d["origin"], f"{w}.origin", MAX_TEXT),
            _bool(d["websocket"], f"{w}.websocket"),
        ))  # fmt: skip
    return tuple(out)


def _network(text: str, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError as e:
        raise SpecError(f"{where}.value: invalid network: {e}") from None
    if net.prefixlen == 0:
        raise SpecError(f"{where}.value {text} covers every address")  # policy.parse_cidr never makes one
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None:
        raise SpecError(f"{where}.value {text}: IPv4-mapped ranges are written as IPv4")  # would never match
    return net


def _decode_resolver(obj: Any) -> tuple[str, int] | None:
    if obj is None:
        return None
    if (
        not isinstance(obj, list)
        or len(obj) != 2
        or not isinstance(obj[0], str)
        or isinstance(obj[1], bool)
        or not isinstance(obj[1], int)
        or not 0 < obj[1] < 65536
    ):
        raise SpecError("policy.resolver must be null or [IP, PORT]")
    try:
        ip = ipaddress.ip_address(obj[0])
    except ValueError:
        raise SpecError(f"policy.resolver: {obj[0]!r} is not an IP address") from None
    if str(ip) != obj[0]:
        raise SpecError(f"policy.resolver: {obj[0]!r} is not in canonical form ({ip})")
    return obj[0], obj[1]


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

"""What the launcher tells the daemon about one sandbox: a typed spec and its plain-JSON form.

The launcher parses YAML and argv once and sends `encode(spec)`; the daemon only ever runs
`decode`, which is strict (exact keys, exact types, canonical hosts), so a confused or
hostile peer is refused with one clear message instead of being half-understood. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Any

from netguard import hosts
from netguard.policy import NetworkPolicy, Rule

SPEC_KEYS = ("task", "policy", "learn", "ask_all", "approval_socket", "ask_timeout")
POLICY_KEYS = ("allow", "deny", "ask", "resolver", "resolver_origin")
RULE_KEYS = ("kind", "value", "ports", "origin", "dns")
RULE_KINDS = ("host", "wildcard", "cidr")
MAX_TASK = 200
MAX_TEXT = 4096


class SpecError(ValueError):
    """A spec the daemon refuses; the message names the offending field."""


@dataclass(frozen=True)
class BindingSpec:
    """One sandbox as the daemon needs it: already parsed, compiled by the daemon with rules.compile_policy."""

    task: str
    policy: NetworkPolicy
    learn: bool = False
    ask_all: bool = False
    approval_socket: str | None = None
    ask_timeout: float = 60.0


# ---- encode ---------------------------------------------------------------------------------


def encode(spec: BindingSpec) -> dict[str, Any]:
    """Plain JSON-able data (dicts, lists, str, int, float, bool, None)."""
    p = spec.policy
    return {
        "task": spec.task,
        "policy": {
            "allow": [_encode_rule(r) for r in p.allow],
            "deny": [_encode_rule(r) for r in p.deny],
            "ask": [_encode_rule(r) for r in p.ask],
            "resolver": [p.resolver[0], p.resolver[1]] if p.resolver is not None else None,
            "resolver_origin": p.resolver_origin,
        },
        "learn": spec.learn,
        "ask_all": spec.ask_all,
        "approval_socket": spec.approval_socket,
        "ask_timeout": float(spec.ask_timeout),
    }


def _encode_rule(r: Rule) -> dict[str, Any]:
    return {
        "kind": r.kind,
        "value": str(r.value),
        "ports": sorted(r.ports) if r.ports is not None else None,
        "origin": r.origin,
        "dns": sorted(r.dns) if r.dns else None,
    }


# ---- decode ---------------------------------------------------------------------------------


def decode(obj: Any) -> BindingSpec:
    """The spec `obj` describes; SpecError for anything `encode` would not have produced."""
    d = _mapping(obj, "spec", SPEC_KEYS)
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
    return BindingSpec(
        task,
        _decode_policy(d["policy"]),
        _bool(d["learn"], "learn"),
        _bool(d["ask_all"], "ask_all"),
        sock,
        float(timeout),
    )


def _decode_policy(obj: Any) -> NetworkPolicy:
    d = _mapping(obj, "policy", POLICY_KEYS)
    lists: dict[str, tuple[Rule, ...]] = {}
    for name in ("allow", "deny", "ask"):
        items = d[name]
        if not isinstance(items, list):
            raise SpecError(f"policy.{name} must be a list")
        lists[name] = tuple(_decode_rule(item, f"policy.{name}[{i}]") for i, item in enumerate(items))
    resolver = _decode_resolver(d["resolver"])
    origin = d["resolver_origin"]
    if origin is not None:
        origin = _text(origin, "policy.resolver_origin", MAX_TEXT)
    return NetworkPolicy(lists["allow"], lists["deny"], lists["ask"], resolver, origin)


def _decode_rule(obj: Any, where: str) -> Rule:
    d = _mapping(obj, where, RULE_KEYS)
    kind = d["kind"]
    if kind not in RULE_KINDS:
        raise SpecError(f"{where}.kind must be one of {', '.join(RULE_KINDS)}")
    value = _text(d["value"], f"{where}.value", MAX_TEXT)
    ports = d["ports"]
    if ports is not None:
        if not isinstance(ports, list) or any(
            isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536 for p in ports
        ):
            raise SpecError(f"{where}.ports must be null or a list of port numbers from 1 to 65535")
        ports = frozenset(ports)
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
    if kind == "cidr":
        return Rule("cidr", _network(value, where), ports, origin)
    # A non-canonical name would silently never match: refuse it so the launcher's bug is seen.
    try:
        canonical = hosts.normalise_name(value)
    except hosts.HostError as e:
        raise SpecError(f"{where}.value: {e}") from None
    if canonical != value:
        raise SpecError(f"{where}.value {value!r} is not in canonical form ({canonical!r})")
    return Rule("host" if kind == "host" else "wildcard", value, ports, origin, dns)


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

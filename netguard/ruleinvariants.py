"""What every network rule and policy is, whoever built it: the checks Rule and NetworkPolicy run when made.

The parser (netguard.policy) phrases a user's mistake first, with the user's text and line; the daemon's
decoder (netguard.spec) only converts JSON into these types. Either way a rule that exists passed
here, so a spec edited between the launcher and the daemon cannot smuggle in a rule the parser would
never make (a name that silently never matches, a cidr for every address, an inspecting cidr that would
fall back to passthrough). A refusal is a PolicyError naming the rule's origin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any, Protocol

from netguard import hosts
from netguard.httprules import HttpRule
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError


class Rule(Protocol):
    """What the checks read of a rule (netguard.policy.Rule, which runs them): its fields, read-only."""

    @property
    def kind(self) -> str: ...
    @property
    def value(self) -> object: ...
    @property
    def ports(self) -> frozenset[int] | None: ...
    @property
    def origin(self) -> Origin: ...
    @property
    def dns(self) -> frozenset[int] | None: ...
    @property
    def inspect(self) -> bool: ...
    @property
    def http(self) -> tuple[HttpRule, ...] | None: ...
    @property
    def log_query(self) -> bool: ...


class Credential(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def header(self) -> str: ...


class NetworkPolicy(Protocol):
    """What the checks read of a policy (netguard.policy.NetworkPolicy, which runs them)."""

    @property
    def allow(self) -> Sequence[Rule]: ...
    @property
    def deny(self) -> Sequence[Rule]: ...
    @property
    def ask(self) -> Sequence[Rule]: ...
    @property
    def resolver(self) -> tuple[str, int] | None: ...
    @property
    def resolver_origin(self) -> Origin | None: ...
    @property
    def credentials(self) -> Sequence[Credential]: ...


RULE_KINDS = ("host", "wildcard", "cidr")
#: DNS meta types (dns.rdatatype.is_metatype: OPT and 128-255): questions about the protocol, not data.
_META_TYPE_OPT = 41


def is_data_type(t: Any) -> bool:
    """A DNS record type number a wildcard allow may forward: 1-65535, no meta type (ANY, AXFR, OPT...)."""
    return type(t) is int and 0 < t < 65536 and t != _META_TYPE_OPT and not 128 <= t < 256


#: The last port set found valid, held (so its identity is never reused): the 10^5 rules of a hosts
#: file share one set. By identity, not equality: frozenset({True}) equals frozenset({1}).
_last_ports: list[frozenset[int]] = []


def ports_ok(ports: object) -> bool:
    """None (any port) or a non-empty set of port numbers."""
    if ports is None or (_last_ports and ports is _last_ports[0]):
        return True
    if type(ports) is not frozenset or not ports or not all(type(p) is int and 0 < p < 65536 for p in ports):
        return False
    _last_ports[:] = [ports]
    return True


def check_rule(r: Rule) -> None:
    """PolicyError unless `r` is a rule the parser could have made."""
    if type(r.origin) is not Origin:
        raise PolicyError(f"a rule's origin is an Origin record, not {type(r.origin).__name__}")
    if _plain_name(r):
        return  # the 10^5 names of a hosts file: a few field reads and one regex each
    why = _name_problem(r) if r.kind in ("host", "wildcard") else _cidr_problem(r)
    why = why or _extras_problem(r)
    if why is not None:
        raise PolicyError(why, origin=r.origin)


def check_new_name(r: Rule) -> None:
    """check_rule for what netguard.policy.new_rule makes (its other fields are the defaults): the hot path."""
    value: object = r.value
    if not (
        type(r.origin) is Origin
        and (r.kind == "host" or r.kind == "wildcard")
        and type(value) is str
        and ports_ok(r.ports)
        and hosts.is_canonical_name(value)
    ):
        check_rule(r)  # refused there, with the reason


def plain_names(names: Sequence[str], ports: object) -> bool:
    """check_new_name for many names at once (one port set, one file): True when every rule new_rule would
    make of them passes; False sends each through its own check, to be refused with its reason."""
    return ports_ok(ports) and hosts.all_canonical_names(names)


def _plain_name(r: Rule) -> bool:
    """A valid name rule without extras (what new_rule makes); False sends it through the full check."""
    value: object = r.value
    return (
        (r.kind == "host" or r.kind == "wildcard")
        and r.dns is None
        and r.http is None
        and r.inspect is False
        and r.log_query is False
        and type(value) is str
        and ports_ok(r.ports)
        and hosts.is_canonical_name(value)
    )


def _name_problem(r: Rule) -> str | None:
    if not isinstance(r.value, str):
        return f"a {r.kind} rule's value is a name, not {type(r.value).__name__}"
    try:
        canonical = hosts.normalise_name(r.value)
    except hosts.HostError as e:
        return f"value: {e}"
    if canonical != r.value:
        # A non-canonical name would silently never match: refused, so the builder's bug is seen.
        return f"value {r.value!r} is not in canonical form ({canonical!r})"
    return None


def _cidr_problem(r: Rule) -> str | None:
    if r.kind != "cidr":
        return f"kind must be one of {', '.join(RULE_KINDS)}, not {r.kind!r}"
    net = r.value
    if not isinstance(net, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return f"a cidr rule's value is a network, not {type(net).__name__}"
    if net.prefixlen == 0:
        return f"value {net} covers every address"
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None:
        return f"value {net}: IPv4-mapped ranges are written as IPv4"  # rules match normalised addresses
    if r.inspect:
        return "a cidr rule cannot inspect"  # no name to check the certificate for
    return None


def _extras_problem(r: Rule) -> str | None:
    """Ports, DNS types and the request-level fields, for every kind."""
    if not ports_ok(r.ports):
        return "ports must be null or a non-empty set of port numbers from 1 to 65535"
    if r.dns is not None:
        if type(r.dns) is not frozenset or not r.dns or not all(map(is_data_type, r.dns)):
            return "dns must be null or a non-empty set of DNS type numbers from 1 to 65535 (no meta types)"
        if r.kind != "wildcard":
            return "dns is only meaningful on a wildcard rule"  # an exact name is served every type
    flags: tuple[object, ...] = (r.inspect, r.log_query)  # whoever built it may not have been type-checked
    if any(type(f) is not bool for f in flags):
        return "inspect and log_query must be true or false"
    if r.http is not None and (type(r.http) is not tuple or not r.http or not all(type(h) is HttpRule for h in r.http)):
        return "http must be null or a non-empty tuple of http rules"
    if (r.http is not None or r.log_query) and not r.inspect:
        return "http rules and log_query need inspect"
    return None


def check_policy(p: NetworkPolicy) -> None:
    """PolicyError unless `p` is a policy the parser could have made (its rules were checked when made)."""
    if any(r.inspect or r.dns is not None for r in (*p.deny, *p.ask)):
        raise PolicyError("only allow rules inspect or forward extra DNS types")
    if p.resolver is not None:
        ip, port = p.resolver
        try:
            canonical = str(ipaddress.ip_address(ip))
        except ValueError:
            raise PolicyError(f"resolver {ip!r} is not an IP address") from None
        if canonical != ip:
            raise PolicyError(f"resolver {ip!r} is not in canonical form ({canonical})")
        if type(port) is not int or not 0 < port < 65536:
            raise PolicyError(f"resolver port {port!r} is not a port number from 1 to 65535")
    if p.resolver_origin is not None and type(p.resolver_origin) is not Origin:
        raise PolicyError("a resolver's origin is an Origin record")
    keys = [(c.host, c.header.lower()) for c in p.credentials]
    if len(set(keys)) != len(keys):
        raise PolicyError("two credentials for one header on one host")  # which one is sent?

"""The `network:` section of a sandgate policy: which destinations a task may reach.

Pure: takes already-loaded YAML values (plain dicts/lists, optionally carrying
`.line`/`.lines` attributes from the launcher's loader) and returns immutable
rules. Every rule remembers where it came from (`origin`, a sgbase.origin.Origin) so a
decision in the audit log can be traced back to the exact line that allowed it.

A rule that exists is valid, whoever built it (this parser, the daemon's decoder, a test): Rule and
NetworkPolicy check their invariants when made (netguard.ruleinvariants), so the daemon decodes and
never re-validates by hand. The parser still checks first, to phrase a mistake with the user's own
text and the exact line of the key at fault.

DNS through a wildcard: a name allowed only by a `*.suffix` entry is looked up for A and AAAA
(with the CNAME chain leading to them) and nothing else, because every such query is a message to
whoever runs that domain and a TXT answer is an easy way back (netguard.decision.dns says more). An
allow entry can list more types for its names:

    - host: "*.example.org"
      dns: [TXT, SRV]        # also forward these query types for names under example.org

Exact host entries need nothing: their name is fixed, every type is served.

Request-level rules (`inspect:`, `http:`, `log_query:` on allow entries) are netguard.httprules';
`credentials:` is netguard.credentials'.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from netguard import hosts, ruleinvariants
from netguard.credentials import Credential, parse_credentials
from netguard.httprules import HttpRule, parse_http
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError, line_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from netguard.hostsfile import HostsList

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
RuleKind = Literal["host", "wildcard", "cidr"]

#: An allow/ask entry without `ports:` means web traffic only; a deny entry without ports means every port.
DEFAULT_ALLOW_PORTS: frozenset[int] = frozenset({80, 443})

SECTION_KEYS = ("allow", "deny", "ask", "resolver", "credentials")
ENTRY_KEYS = ("host", "cidr", "ports", "dns", "inspect", "http", "log_query", "hosts_file")
_ENTRY_KEYS = frozenset(ENTRY_KEYS)


@dataclass(frozen=True)
class Rule:
    """One destination pattern. `ports is None` means any port."""

    kind: RuleKind
    value: str | Network  # exact name, wildcard suffix (without "*."), or network
    ports: frozenset[int] | None
    origin: Origin
    dns: frozenset[int] | None = None  # extra DNS query types (numbers) a wildcard allow forwards
    inspect: bool = False  # TLS is terminated and each request judged (netguard.httprules)
    http: tuple[HttpRule, ...] | None = None  # None with inspect: every request allowed, each audited
    log_query: bool = False  # audit records of inspected requests keep the query string

    def __post_init__(self) -> None:
        ruleinvariants.check_rule(self)

    def describe(self) -> str:
        return self._described

    @functools.cached_property
    def origin_text(self) -> str:  # once per rule: every decision's record names where the rule was written
        return str(self.origin)

    @functools.cached_property
    def _described(self) -> str:  # once per rule: every decision's record names its rule
        pat = f"*.{self.value}" if self.kind == "wildcard" else str(self.value)
        return pat if self.ports is None else f"{pat}:{','.join(map(str, sorted(self.ports)))}"


@dataclass(frozen=True)
class NetworkPolicy:
    """The `network:` section, compiled."""

    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    ask: tuple[Rule, ...] = ()
    resolver: tuple[str, int] | None = None
    resolver_origin: Origin | None = field(default=None, compare=False)
    credentials: tuple[Credential, ...] = ()

    def __post_init__(self) -> None:
        ruleinvariants.check_policy(self)


def parse_network(section: Any, source: str, hosts_files: Mapping[str, HostsList] | None = None) -> NetworkPolicy:
    """Validate one file's `network:` mapping; `source` names the file in rule origins.

    `hosts_files`: each `hosts_file:` value as written -> its names, read by the launcher's loader;
    None where no file may be read (an entry naming one is then refused).
    """
    if section is None:
        return NetworkPolicy()
    if not isinstance(section, dict):
        raise PolicyError(
            "'network' must be a mapping with allow/deny/ask/resolver/credentials", getattr(section, "line", None)
        )
    for key in section:
        if key not in SECTION_KEYS:
            raise PolicyError(
                f"unknown key 'network.{key}' (expected one of: {', '.join(SECTION_KEYS)})", line_of(section, key)
            )
    lists: dict[str, tuple[Rule, ...]] = {}
    for name in ("allow", "deny", "ask"):
        entries = section.get(name)
        if entries is None:
            lists[name] = ()
            continue
        if not isinstance(entries, list):
            raise PolicyError(f"'network.{name}' must be a list", line_of(section, name))
        default_ports = None if name == "deny" else DEFAULT_ALLOW_PORTS
        found: list[Rule] = []
        for i, entry in enumerate(entries):
            line = line_of(entries, i) or line_of(section, name)
            if isinstance(entry, dict) and "hosts_file" in entry:
                found.extend(_hosts_file(entry, line, default_ports, hosts_files))
            else:
                found.append(parse_entry(entry, source, line, default_ports, list_name=name))
        lists[name] = tuple(found)
    resolver = None
    resolver_origin = None
    if section.get("resolver") is not None:
        resolver = parse_resolver(section["resolver"], line_of(section, "resolver"))
        resolver_origin = Origin(source, line_of(section, "resolver"))
    creds = parse_credentials(section.get("credentials"), source, line_of(section, "credentials"))
    return NetworkPolicy(lists["allow"], lists["deny"], lists["ask"], resolver, resolver_origin, creds)


def parse_entry(
    entry: Any, source: str, line: int | None, default_ports: frozenset[int] | None, *, list_name: str = "allow"
) -> Rule:
    """One allow/deny/ask item: "host", "*.suffix", "1.2.3.0/24", or a mapping with host|cidr, ports (and dns)."""
    ports: frozenset[int] | None = default_ports
    if isinstance(entry, str):
        target, is_cidr = entry, False
    elif isinstance(entry, dict):
        for key in entry:
            if key not in _ENTRY_KEYS:
                raise PolicyError(
                    f"unknown key '{key}' in entry (expected host or cidr, ports, dns, inspect, http, log_query)",
                    line_of(entry, key),
                )
        if ("host" in entry) == ("cidr" in entry):
            raise PolicyError("an entry needs exactly one of 'host' or 'cidr'", line)
        is_cidr = "cidr" in entry
        target = entry["cidr"] if is_cidr else entry["host"]
        if not isinstance(target, str):
            raise PolicyError(f"'{'cidr' if is_cidr else 'host'}' must be a string, not {_typename(target)}", line)
        if "ports" in entry:
            ports = parse_ports(entry["ports"], line_of(entry, "ports"))
    else:
        raise PolicyError(f"an entry must be a host string or a mapping, not {_typename(entry)}", line)
    origin = Origin(source, line)
    if is_cidr or "/" in target:
        rule = Rule("cidr", parse_cidr(target, line), ports, origin)
    else:
        rule = parse_host_pattern(target, ports, origin, line)
    if isinstance(entry, dict) and "dns" in entry:
        where = line_of(entry, "dns")
        if list_name != "allow":
            raise PolicyError(f"'dns' belongs on allow entries, not {list_name} entries", where)
        if rule.kind != "wildcard":
            raise PolicyError(
                "'dns' is only for wildcard hosts ('*.example.org'): an exact name is served every query type", where
            )
        rule = dataclasses.replace(rule, dns=parse_dns_types(entry["dns"], where))
    if isinstance(entry, dict) and not entry.keys().isdisjoint(("inspect", "http", "log_query")):
        rule = _inspection(rule, entry, source, line, list_name)
    return rule


_NAME_KINDS: tuple[RuleKind, RuleKind] = ("host", "wildcard")  # by a hosts file line's wildcard flag


def _hosts_file(
    entry: dict[str, Any], line: int | None, default_ports: frozenset[int] | None, files: Mapping[str, HostsList] | None
) -> list[Rule]:
    """`- hosts_file: PATH` (with optional `ports:`): one rule per name, its origin the name's own line."""
    for key in entry:
        if key not in ("hosts_file", "ports"):
            raise PolicyError(f"'{key}' does not go with 'hosts_file' (only 'ports' does)", line_of(entry, key))
    path = entry["hosts_file"]
    if not isinstance(path, str) or not path:
        raise PolicyError(f"'hosts_file' must be a file path, not {_typename(path)}", line)
    if files is None:
        raise PolicyError(
            "'hosts_file' is not read from an untrusted workspace policy; review it, then run: sandgate trust FILE",
            line,
        )
    listed = files.get(path)
    if listed is None:
        raise PolicyError(f"hosts_file '{path}' was not read", line)  # the loader reads every one it finds
    ports = parse_ports(entry["ports"], line_of(entry, "ports")) if "ports" in entry else default_ports
    where, kinds = listed.where, _NAME_KINDS
    triples = zip(listed.lines, listed.names, listed.wildcard, strict=True)
    if not ruleinvariants.plain_names(listed.names, ports):
        return [new_rule(kinds[wild], name, ports, Origin(where, number)) for number, name, wild in triples]
    return [_checked_name_rule(kinds[wild], name, ports, Origin(where, number)) for number, name, wild in triples]


def _inspection(rule: Rule, entry: dict[str, Any], source: str, line: int | None, list_name: str) -> Rule:
    """`inspect`, `http`, `log_query` of an allow entry for names (netguard.httprules)."""
    key = next(k for k in ("inspect", "http", "log_query") if k in entry)
    where = line_of(entry, key) or line
    if list_name != "allow":
        raise PolicyError(f"'{key}' belongs on allow entries, not {list_name} entries", where)
    if rule.kind == "cidr":
        raise PolicyError(f"'{key}' needs a host name: an address has no name to check the certificate for", where)
    for flag in ("inspect", "log_query"):
        if flag in entry and not isinstance(entry[flag], bool):
            raise PolicyError(f"'{flag}' is true or false, not {_typename(entry[flag])}", line_of(entry, flag))
    http = parse_http(entry["http"], source, line_of(entry, "http") or line) if "http" in entry else None
    if entry.get("inspect") is False and (http is not None or entry.get("log_query")):
        raise PolicyError("'inspect: false' with http rules or log_query: rules need inspection; drop one", where)
    inspect = http is not None or bool(entry.get("inspect")) or bool(entry.get("log_query"))
    return dataclasses.replace(rule, inspect=inspect, http=http, log_query=bool(entry.get("log_query")))


def parse_dns_types(value: Any, line: int | None) -> frozenset[int]:
    """`[TXT, SRV]`: DNS query types by name; meta types (ANY, AXFR, ...) are not types of data."""
    import dns.rdatatype  # only here: dnspython costs ~15 ms at import and most policies never get here

    items = value if isinstance(value, list) else [value]
    if not items:
        raise PolicyError("'dns' is empty; leave it out for addresses only or list query types", line)
    types: set[int] = set()
    for i, item in enumerate(items):
        where = line_of(items, i) or line
        if not isinstance(item, str):
            raise PolicyError(f"'dns' lists query type names like TXT, not {_typename(item)}", where)
        try:
            rdtype = dns.rdatatype.from_text(item.strip())
        except (dns.rdatatype.UnknownRdatatype, ValueError):
            raise PolicyError(f"'dns': unknown query type '{item}'", where) from None
        if rdtype == 0 or dns.rdatatype.is_metatype(rdtype):
            raise PolicyError(f"'dns': {item} is not a record type; list the types it should cover", where)
        types.add(int(rdtype))
    return frozenset(types)


def parse_host_pattern(text: str, ports: frozenset[int] | None, origin: Origin, line: int | None) -> Rule:
    """A name, a `*.suffix` wildcard, or an IP literal (kept as a /32 or /128 network)."""
    if text.strip() in ("*", "*.", "**", ""):
        raise PolicyError(f"'{text}' would match every host; list the hosts instead", line)
    wildcard = text.startswith("*.")
    body = text[2:] if wildcard else text
    if "*" in body:
        raise PolicyError(f"'{text}': '*' is only allowed as the whole first label ('*.example.org')", line)
    if wildcard and (body == "" or body.startswith(".")):
        raise PolicyError(f"'{text}': empty label after '*.'", line)
    try:
        value = hosts.normalise(body)
    except hosts.HostError as e:
        raise PolicyError(f"invalid host '{text}': {e}", line) from None
    if not isinstance(value, str):
        if wildcard:
            raise PolicyError(f"'{text}': a wildcard cannot cover an IP address; use a cidr entry", line)
        return Rule("cidr", ipaddress.ip_network(value), ports, origin)
    return new_rule("wildcard" if wildcard else "host", value, ports, origin)


def new_rule(kind: RuleKind, value: str, ports: frozenset[int] | None, origin: Origin) -> Rule:
    """Rule(kind, value, ports, origin) for a name, at half the cost of the frozen __init__ (10^5 entries);
    checked like every other rule."""
    rule = _checked_name_rule(kind, value, ports, origin)
    ruleinvariants.check_new_name(rule)
    return rule


def _checked_name_rule(kind: RuleKind, value: str, ports: frozenset[int] | None, origin: Origin) -> Rule:
    """A name rule whose check its maker has done: new_rule's, or ruleinvariants.plain_names for a whole list."""
    rule = object.__new__(Rule)
    rule.__dict__.update(_name_rule_fields(), kind=kind, value=value, ports=ports, origin=origin)
    return rule


@functools.cache
def _name_rule_fields() -> dict[str, Any]:
    """Every field of a real Rule (its defaults): new_rule overrides only what it is given."""
    return dict(Rule("host", "a", None, Origin("")).__dict__)


def parse_cidr(text: str, line: int | None) -> Network:
    try:
        net = ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as e:
        raise PolicyError(f"invalid cidr '{text}': {e}", line) from None
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None:
        # Rules match normalised addresses, and hosts.normalise turns ::ffff:a.b.c.d into a.b.c.d.
        raise PolicyError(f"cidr '{text}': write IPv4-mapped ranges as plain IPv4", line)
    if net.prefixlen == 0:
        raise PolicyError(f"cidr '{text}' covers every address; list the ranges instead", line)
    return net


def parse_ports(value: Any, line: int | None) -> frozenset[int]:
    if isinstance(value, bool) or not isinstance(value, (list, int)):
        raise PolicyError(f"'ports' must be a list of port numbers, not {_typename(value)}", line)
    items = value if isinstance(value, list) else [value]
    if not items:
        raise PolicyError("'ports' is empty; leave it out for the default or list at least one port", line)
    ports: set[int] = set()
    for i, p in enumerate(items):
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            raise PolicyError(f"invalid port {p!r}: ports are whole numbers from 1 to 65535", line_of(items, i) or line)
        ports.add(p)
    return frozenset(ports)


def parse_resolver(value: Any, line: int | None) -> tuple[str, int]:
    """`host:port` or `[v6]:port` of the upstream DNS server; must be an IP so it needs no resolver itself."""
    if not isinstance(value, str):
        raise PolicyError(f"'resolver' must be a string 'IP:PORT', not {_typename(value)}", line)
    text = value.strip()
    after_bracket = text.partition("]")[2] if text.startswith("[") else ""
    if after_bracket and not after_bracket.startswith(":"):
        raise PolicyError(f"invalid resolver '{value}': expected '[IPv6]:PORT'", line)
    addr, port_text = hosts.split_host_port(text)
    port = 53 if port_text is None else _port(port_text, value, line)
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        raise PolicyError(f"invalid resolver '{value}': must be an IP address with optional port", line) from None
    return str(ip), port


def _port(text: str, whole: str, line: int | None) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise PolicyError(f"invalid port in '{whole}': ports are whole numbers from 1 to 65535", line)
    return int(text)


def merge(policies: list[NetworkPolicy]) -> NetworkPolicy:
    """Union of several files' sections; a second, different resolver is a conflict, not a silent override."""
    resolver: tuple[str, int] | None = None
    resolver_origin: Origin | None = None
    for p in policies:
        if p.resolver is not None:
            if resolver is not None and p.resolver != resolver:
                raise PolicyError(
                    f"two different resolvers: {resolver[0]}:{resolver[1]} ({resolver_origin}) and "
                    f"{p.resolver[0]}:{p.resolver[1]} ({p.resolver_origin}); keep one"
                )
            resolver, resolver_origin = p.resolver, p.resolver_origin
    creds: dict[tuple[str, str], Credential] = {}
    for c in (c for p in policies for c in p.credentials):
        other = creds.setdefault((c.host, c.header.lower()), c)
        if other != c:
            raise PolicyError(
                f"two credentials for header {c.header} on {c.host} ({other.origin} and {c.origin}); keep one"
            )
    return NetworkPolicy(
        allow=tuple(r for p in policies for r in p.allow),
        deny=tuple(r for p in policies for r in p.deny),
        ask=tuple(r for p in policies for r in p.ask),
        resolver=resolver,
        resolver_origin=resolver_origin,
        credentials=tuple(creds.values()),
    )


def _typename(v: Any) -> str:
    for t, name in (
        (bool, "a boolean"),
        (dict, "a mapping"),
        (list, "a list"),
        (str, "a string"),
        ((int, float), "a number"),
    ):
        if isinstance(v, t):
            return name
    return "null" if v is None else type(v).__name__

"""What the egress audit logs say: a per-destination summary and a suggested policy.

Pure except `read_logs`: records in, rows or YAML text out, so `sandgate audit`
can be tested without a sandbox. Log contents are untrusted (the sandboxed task
chose the names it asked for), so every logged string that reaches a terminal or
a YAML comment is escaped: a host name must never be able to inject a line.
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from publicsuffix2 import PublicSuffixList

from netguard import hosts
from netguard.policy import DEFAULT_ALLOW_PORTS, NetworkPolicy

Record = Mapping[str, Any]

#: A wildcard is proposed only when this many distinct subdomains of one registrable domain were seen.
WILDCARD_MIN_SIBLINGS = 3
#: Statuses under which the run got through, and so what `suggest` proposes to allow.
ALLOWED = frozenset({"allow", "would-deny"})
#: Statuses, most alarming first, as the STATUS column lists them.
_RISK_ORDER = ("deny", "would-deny", "allow")
_MAX_TASKS_SHOWN = 8


class ReportError(Exception):
    """An unreadable log, phrased for the one-line `sandgate: error:` message."""


@dataclass(frozen=True)
class Destination:
    """One destination over all runs: how often, how decided, by which rules, how many bytes."""

    host: str | None
    port: int | None  # None for DNS (and port-less packets such as ICMP)
    proto: str | None  # packet rows only ("udp", "icmp", ...)
    dns: bool  # a DNS name lookup row, kept apart from connections to the same host
    count: int
    decisions: frozenset[str]  # "allow", "deny", "would-deny" (allowed by learn mode only)
    kinds: frozenset[str]
    rules: frozenset[str]
    bytes_up: int
    bytes_down: int
    first_seen: str | None
    last_seen: str | None
    tasks: frozenset[str] = field(default_factory=frozenset)

    @property
    def risk(self) -> int:
        """0: something was denied (or an unknown action); 1: allowed only by learn mode; 2: allowed by policy."""
        if self.decisions - ALLOWED:
            return 0
        return 1 if "would-deny" in self.decisions else 2

    @property
    def label(self) -> str:
        """`host:port`, `[v6]:port`, `host` for DNS, `udp host:port` for dropped packets."""
        host = self.host if self.host is not None else "?"
        text = host if self.port is None else f"{_bracket(host)}:{self.port}"
        if self.proto is not None:
            text = f"{self.proto} {text}"
        return text


# ---- reading ----------------------------------------------------------------------------


def read_logs(paths: Sequence[Path | str]) -> list[dict[str, Any]]:
    """Every record of every log, in file then line order.

    The last line of a file may be cut short or garbage (writer killed, NUL padding
    after a crash): skipped silently. Anything invalid before it means the file is
    not an audit log (or was tampered with): an error naming FILE:LINE.
    """
    out: list[dict[str, Any]] = []
    for p in paths:
        path = Path(p)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ReportError(f"{path}: no such audit log") from None
        except OSError as e:
            raise ReportError(f"{path}: cannot read: {e.strerror or e}") from None
        lines = data.split(b"\n")
        # Blank lines carry nothing; the "last line" is the last one that is not blank.
        numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
        for n, (lineno, line) in enumerate(numbered):
            record = _parse_line(line)
            if record is None:
                if n == len(numbered) - 1:
                    break  # truncated tail
                raise ReportError(f"{path}:{lineno}: not a JSON record")
            out.append(record)
    return out


def _parse_line(line: bytes) -> dict[str, Any] | None:
    # A complete object without its newline is kept: no proper prefix of a JSON object is itself one.
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# ---- summary ------------------------------------------------------------------------------


def decision_status(record: Record) -> str:
    """ "allow", "deny", or "would-deny" (learn mode let through what the policy would have denied)."""
    action = str(record.get("action"))
    if action == "allow" and record.get("would") == "deny":
        return "would-deny"
    return action


def _key(record: Record) -> tuple[str | None, int | None, str | None, bool]:
    kind = record.get("kind")
    host = record.get("host")
    host = None if host is None else str(host)
    if kind == "dns":
        return host, None, None, True
    port = _int_or_none(record.get("port"))
    proto = record.get("proto")
    return host, port, (str(proto) if kind == "packet" and proto is not None else None), False


class _Acc:
    """Mutable accumulator for one destination while the records stream by."""

    def __init__(self) -> None:
        self.count = 0
        self.decisions: set[str] = set()
        self.kinds: set[str] = set()
        self.rules: set[str] = set()
        self.tasks: set[str] = set()
        self.up = self.down = 0
        self.first: str | None = None
        self.last: str | None = None

    def seen(self, ts: Any) -> None:
        if isinstance(ts, str):
            self.first = ts if self.first is None or ts < self.first else self.first
            self.last = ts if self.last is None or ts > self.last else self.last


def summarize(records: Iterable[Record]) -> list[Destination]:
    """One row per destination, riskiest first, so a reader sees the denials before the noise.

    Bytes come from `close` records matched to their decision by (task, id), falling
    back to id alone and then to the close record's own host/port.
    """
    accs: dict[tuple[str | None, int | None, str | None, bool], _Acc] = defaultdict(_Acc)
    by_id: dict[tuple[Any, Any], tuple[str | None, int | None, str | None, bool]] = {}
    by_bare_id: dict[Any, tuple[str | None, int | None, str | None, bool]] = {}
    closes: list[Record] = []
    for r in records:
        event = r.get("event")
        if event == "close":
            closes.append(r)
            continue
        if event != "decision":
            continue
        key = _key(r)
        acc = accs[key]
        acc.count += 1
        acc.decisions.add(decision_status(r))
        if r.get("kind") is not None:
            acc.kinds.add(str(r["kind"]))
        if r.get("rule") is not None:
            acc.rules.add(str(r["rule"]))
        if r.get("task") is not None:
            acc.tasks.add(str(r["task"]))
        acc.seen(r.get("ts"))
        if r.get("id") is not None:
            by_id[(r.get("task"), r["id"])] = key
            by_bare_id.setdefault(r["id"], key)
    for c in closes:
        key = by_id.get((c.get("task"), c.get("id"))) or by_bare_id.get(c.get("id"))
        if key is None:
            key = _key(c)
        if key not in accs:
            continue  # a close whose decision is not in these logs: nothing to attach it to
        accs[key].up += _int_or_none(c.get("bytes_up")) or 0
        accs[key].down += _int_or_none(c.get("bytes_down")) or 0
    rows = [
        Destination(
            host,
            port,
            proto,
            dns,
            a.count,
            frozenset(a.decisions),
            frozenset(a.kinds),
            frozenset(a.rules),
            a.up,
            a.down,
            a.first,
            a.last,
            frozenset(a.tasks),
        )
        for (host, port, proto, dns), a in accs.items()
    ]
    rows.sort(
        key=lambda d: (d.risk, -d.count, d.host or "", d.port if d.port is not None else -1, d.proto or "", d.dns)
    )
    return rows


def _status_text(decisions: frozenset[str]) -> str:
    known = [s for s in _RISK_ORDER if s in decisions]
    return "+".join(known + sorted(decisions - set(_RISK_ORDER)))


def format_table(rows: Sequence[Destination]) -> str:
    """Aligned text table with a header; every logged string escaped so it cannot drive the terminal."""
    header = ("STATUS", "DESTINATION", "KINDS", "COUNT", "UP", "DOWN", "FIRST SEEN", "LAST SEEN", "RULES")
    right = {3, 4, 5}
    table = [header]
    for d in rows:
        table.append(
            (
                _escape(_status_text(d.decisions)),
                _escape(d.label) + (" (dns)" if d.dns else ""),
                _escape(",".join(sorted(d.kinds))),
                str(d.count),
                "-" if d.dns else str(d.bytes_up),
                "-" if d.dns else str(d.bytes_down),
                _escape(d.first_seen or "-"),
                _escape(d.last_seen or "-"),
                _escape(", ".join(sorted(d.rules)) or "-"),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for row in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def as_json(rows: Sequence[Destination]) -> list[dict[str, Any]]:
    """Rows as plain JSON values (sets become sorted lists) for `--json`."""
    return [
        {
            "host": d.host,
            "port": d.port,
            "proto": d.proto,
            "dns": d.dns,
            "count": d.count,
            "decisions": sorted(d.decisions),
            "kinds": sorted(d.kinds),
            "rules": sorted(d.rules),
            "bytes_up": d.bytes_up,
            "bytes_down": d.bytes_down,
            "first_seen": d.first_seen,
            "last_seen": d.last_seen,
            "tasks": sorted(d.tasks),
        }
        for d in rows
    ]


# ---- public suffixes ----------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _psl() -> PublicSuffixList:
    return PublicSuffixList()


def public_suffix(name: str) -> str | None:
    """The public suffix of a DNS name (`co.uk`, `github.io`; an unknown TLD is its own suffix, per the PSL's `*` rule)."""
    return _psl().get_tld(name.lower().rstrip("."), wildcard=True, strict=False) or None


def registrable_domain(name: str) -> str | None:
    """The public suffix plus one label (`example.co.uk`), or None if `name` is itself a public suffix.

    Not `get_sld`: for TLDs missing from the list it answers the TLD itself
    (`a.b.internal` -> `internal`), which would make `*.internal` look registrable.
    """
    name = name.lower().rstrip(".")
    suffix = public_suffix(name)
    if suffix is None:
        return None
    labels = name.split(".")
    n = suffix.count(".") + 1
    if len(labels) <= n:
        return None
    return ".".join(labels[-(n + 1) :])


# ---- suggestion ---------------------------------------------------------------------------


def bundled_hosts(network: NetworkPolicy) -> set[str]:
    """A bundled list's allowed names as `suggest` expects them: exact hosts and `*.suffix` patterns."""
    out: set[str] = set()
    for r in network.allow:
        if r.kind == "host":
            out.add(str(r.value))
        elif r.kind == "wildcard":
            out.add(f"*.{r.value}")
    return out


def _pattern_matches(pattern: str, host: str) -> bool:
    p = pattern.lower().rstrip(".")
    if p.startswith("*."):
        return host.endswith("." + p[2:])
    return host == p


@dataclass
class _Use:
    """What the runs did with one host (name) or address, merged over ports and kinds."""

    ports: set[int] = field(default_factory=set)
    count: int = 0
    first: str | None = None

    def add(self, d: Destination) -> None:
        self.merge(_Use({d.port} if d.port is not None else set(), d.count, d.first_seen))

    def merge(self, other: _Use) -> None:
        self.ports |= other.ports
        self.count += other.count
        if other.first is not None and (self.first is None or other.first < self.first):
            self.first = other.first


def suggest(
    records: Sequence[Record], name: str | None = None, bundled: Mapping[str, Iterable[str]] | None = None
) -> str:
    """A `version: 1` policy that would have allowed what the runs were allowed (or learn mode let through).

    Denied destinations are never suggested, only listed as comments: the user decides.
    A wildcard is proposed only for >= 3 subdomains of one registrable domain, never at a
    public suffix, and never over a host that was denied. Bundled lists replace the hosts
    they cover on web ports. `bundled` maps a bundled list name to its hosts/`*.suffix`
    patterns (see `bundled_hosts`); the names must exist in allowlists/ for `include:`.
    """
    records = list(records)
    rows = summarize(records)
    names: dict[str, _Use] = defaultdict(_Use)  # normalised host -> allowed use
    addrs: dict[hosts.Address, _Use] = defaultdict(_Use)
    addr_protos: dict[hosts.Address, set[str]] = defaultdict(set)
    denied: list[Destination] = []
    denied_web: dict[str, set[int]] = defaultdict(set)  # host -> web ports seen only denied
    denied_pairs: set[tuple[str, int | None]] = set()  # (host, port; None = the DNS lookup) never allowed
    resolved: dict[str, Destination] = {}
    notes: list[str] = []
    connected: set[str] = set()

    for d in rows:
        dest = _normalise(d.host)
        if not d.dns and isinstance(dest, str):
            connected.add(dest)
    for d in rows:
        dest = _normalise(d.host)
        ok = bool(d.decisions & ALLOWED)
        if d.dns:
            if isinstance(dest, str) and not ok:
                denied_pairs.add((dest, None))  # a wildcard would make this lookup succeed
            if isinstance(dest, str) and dest not in connected:
                if ok:
                    resolved.setdefault(dest, d)
                else:
                    denied.append(d)
            continue
        if not ok:
            denied.append(d)
            if isinstance(dest, str):
                denied_pairs.add((dest, d.port))
                if d.port in DEFAULT_ALLOW_PORTS:
                    denied_web[dest].add(d.port)
            continue
        if dest is None:
            notes.append(f"not a valid destination, not suggested: {_comment(d.label)} ({_times(d.count)})")
        elif isinstance(dest, str):
            names[dest].add(d)
        elif d.port is None:
            notes.append(f"no port to allow, not suggested: {_comment(d.label)} ({_times(d.count)})")
        else:
            addrs[dest].add(d)
            if d.proto is not None:
                addr_protos[dest].add(d.proto)
    # A web port that was allowed once and denied another time is allowed, not "denied only".
    for host, ports in denied_web.items():
        ports -= names[host].ports if host in names else set()

    # Bundled lists: used when they cover a seen host; covered hosts drop out on web ports.
    lists = {k: {p.lower().rstrip(".") for p in v} for k, v in (bundled or {}).items()}
    includes: set[str] = set()
    covered: set[str] = set()
    for host in names:
        for list_name, patterns in lists.items():
            if any(_pattern_matches(p, host) for p in patterns):
                includes.add(list_name)
                covered.add(host)

    entries: list[tuple[tuple[Any, ...], str, str]] = []  # (sort key, entry, comment)

    def ports_form(host: str, use: _Use) -> bool:
        return not use.ports <= DEFAULT_ALLOW_PORTS or bool(denied_web.get(host))

    listed = {
        h: u
        for h, u in names.items()
        if not (h in covered and u.ports <= DEFAULT_ALLOW_PORTS and not denied_web.get(h))
    }

    # Wildcards: >= 3 distinct subdomains under one registrable domain, none of them denied.
    groups: dict[str, list[str]] = defaultdict(list)
    for host in listed:
        reg = registrable_domain(host)
        if reg is not None and host != reg:
            groups[reg].append(host)
    wild: set[str] = set()
    for reg, subs in groups.items():
        if len(subs) < WILDCARD_MIN_SIBLINGS:
            continue
        use = _Use()
        for h in subs:
            use.merge(listed[h])
        allows = use.ports if not use.ports <= DEFAULT_ALLOW_PORTS else DEFAULT_ALLOW_PORTS
        # Never widen onto a denial: a wildcard that would allow a denied lookup or port is not proposed.
        # (A denied lookup of a host that is suggested anyway changes nothing: its own entry allows the name.)
        if any(h.endswith("." + reg) and (p in allows if p is not None else h not in names) for h, p in denied_pairs):
            notes.append(f"*.{_comment(reg)} not suggested: it would allow a denied host under it")
            continue
        wild.update(subs)
        pattern = f"*.{reg}"
        entry = _host_entry(pattern, use.ports if not use.ports <= DEFAULT_ALLOW_PORTS else None)
        comment = f"covers {', '.join(sorted(subs, key=_name_key))}: {_use_text(use)}"
        entries.append(((0, _name_key(reg), 1), entry, comment))
    for host, use in listed.items():
        if host in wild:
            continue
        entry = _host_entry(host, use.ports if ports_form(host, use) else None)
        entries.append(((0, _name_key(host), 0), entry, _use_text(use)))
    for ip, use in addrs.items():
        bits = 32 if ip.version == 4 else 128
        protos = addr_protos.get(ip)
        text = _use_text(use) + (f" ({'/'.join(sorted(protos))} packets)" if protos else "")
        entries.append(((1, ip.version, int(ip)), _cidr_entry(f"{ip}/{bits}", use.ports), text))
    entries.sort(key=lambda e: e[0])

    # Comments for what is not suggested; say so when an include allows it anyway.
    def bundled_note(d: Destination) -> str:
        host = _normalise(d.host)
        if not isinstance(host, str) or (d.port is not None and d.port not in DEFAULT_ALLOW_PORTS):
            return ""
        by = sorted(n for n in includes if any(_pattern_matches(p, host) for p in lists[n]))
        return f"; note: include {', '.join(by)} allows it" if by else ""

    tail: list[str] = []
    for d in sorted(denied, key=lambda d: (d.proto is not None, d.dns, _label_key(d))):
        if d.proto is not None:
            tail.append(f"dropped, not suggested: {_comment(d.label)} ({_times(d.count)})")
        else:
            what = _comment(d.label) + (" (dns lookup)" if d.dns else "")
            tail.append(f"denied, not suggested: {what} ({_times(d.count)}){bundled_note(d)}")
    for host in sorted(resolved, key=_name_key):
        tail.append(f"resolved only: {_comment(host)} ({_plural(resolved[host].count, 'lookup')})")
    tail.extend(notes)

    n_records = len(records)
    tasks = sorted({str(r["task"]) for r in records if r.get("task") is not None})
    shown = ", ".join(_comment(t) for t in tasks[:_MAX_TASKS_SHOWN])
    if len(tasks) > _MAX_TASKS_SHOWN:
        shown += f", +{len(tasks) - _MAX_TASKS_SHOWN} more"
    out = [
        f"# suggested by sandgate audit suggest from {_plural(n_records, 'record')} of {_plural(len(tasks), 'run')}"
        + (f" (tasks: {shown})" if tasks else "")
    ]
    out.append("version: 1")
    if name is not None:
        out.append(f"description: {_quoted(name)}")
    if includes:
        out.append(f"include: [{', '.join(_scalar(n) for n in sorted(includes))}]")
    out.append("network:")
    if entries:
        out.append("  allow:")
        width = min(max(len(e[1]) for e in entries), 60)
        for _, entry, comment in entries:
            out.append(f"    - {entry.ljust(width)}  # {comment}")
    else:
        out.append("  allow: []")
    out.extend(f"  # {line}" for line in tail)
    return "\n".join(out) + "\n"


# ---- small helpers ------------------------------------------------------------------------


def _normalise(host: str | None) -> str | hosts.Address | None:
    if host is None:
        return None
    try:
        return hosts.normalise(host)
    except hosts.HostError:
        return None


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _name_key(host: str) -> tuple[str, ...]:
    """Sort names by their labels from the right, so a domain's hosts stay together."""
    return tuple(reversed(host.split(".")))


def _label_key(d: Destination) -> tuple[Any, ...]:
    host = _normalise(d.host)
    return (_name_key(host) if isinstance(host, str) else ("~", str(d.host)), d.port if d.port is not None else -1)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _times(n: int) -> str:
    return "1 time" if n == 1 else f"{n} times"


def _use_text(use: _Use) -> str:
    return f"{_plural(use.count, 'connection')}, first seen {_comment(use.first or 'unknown')}"


def _escape(text: str) -> str:
    """Printable ASCII stays; everything else (newlines, NEL, U+2028, ESC, non-ASCII) becomes a YAML-style escape."""
    out = []
    for ch in text:
        o = ord(ch)
        if 0x20 <= o < 0x7F:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out)


def _comment(text: str) -> str:
    """Logged text inside a `#` comment: one line, whatever the log contained."""
    return _escape(text)


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar; the escapes above are YAML's own, so it loads back to `text`."""
    return '"' + _escape(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


_PLAIN = re.compile(r"[a-z0-9][a-z0-9._/-]*")


def _scalar(text: str) -> str:
    """Plain when YAML reads it back as the same string (hosts, v4 cidrs), else double-quoted."""
    if _PLAIN.fullmatch(text):
        try:
            if yaml.safe_load(text) == text:
                return text
        except yaml.YAMLError:
            pass
    return _quoted(text)


def _ports(ports: set[int]) -> str:
    return "[" + ", ".join(str(p) for p in sorted(ports)) + "]"


def _host_entry(host: str, ports: set[int] | None) -> str:
    if ports is None or not ports:
        return _scalar(host)
    return f"{{host: {_scalar(host)}, ports: {_ports(ports)}}}"


def _cidr_entry(cidr: str, ports: set[int]) -> str:
    return f"{{cidr: {_scalar(cidr)}, ports: {_ports(ports)}}}"

"""The daemon's DNS cache, pure: what an upstream answer means, how long it may be kept, when to resend.

No I/O and no clock of its own: netguard.decision.resolver asks the network and passes the time in,
so the unit tests can walk TTLs and retry schedules forward without sleeping.

Why a cache: each connection used to resolve its name afresh (40 connections to one name cost 80
upstream queries), and each of those lookups was one more chance for a lost datagram to turn an
allowed host into a refusal. An answer says how long it stays true (its TTL); it is kept that long
and no longer, capped at MAX_TTL. Negative answers (NXDOMAIN, NODATA) are kept as RFC 2308 says:
min(SOA TTL, SOA MINIMUM) from the authority section, capped at NEGATIVE_MAX; without an SOA they
are not kept at all (RFC 2308 section 5). A failure (SERVFAIL, REFUSED) is kept FAILURE_TTL, only
to stop a burst of clients from re-asking a failing server at once; a timeout is never kept.

Keys hold the upstream servers: two sandboxes whose policies name different `resolver:`s never
see each other's answers (an attacker's resolver named in one policy cannot poison another's).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from netguard import verdict

#: The upstream of a lookup: the nameservers asked, in order (a policy's `resolver:`, or /etc/resolv.conf's).
Servers = tuple[tuple[str, int], ...]
#: What an exchange came to: records of the type asked, none (NODATA), no such name, a failure, no answer.
Outcome = Literal["answer", "nodata", "nxdomain", "failed", "timeout"]

MAX_TTL = 3600.0  # seconds: an answer is never kept longer, whatever its TTL says
NEGATIVE_MAX = 30.0  # seconds: a "no such name" is re-asked at least this often (a name may be created)
FAILURE_TTL = 1.0  # seconds a SERVFAIL/REFUSED is kept: enough to absorb a burst, short enough to retry soon
MAX_ENTRIES = 4096  # least recently used entries go first beyond this: the cache's memory is bounded
MAX_CNAME_CHAIN = 16
#: Seconds between resends of one query: doubling, as stub resolvers do. The first resend comes after
#: 1 s (glibc waits 5 s), so one lost datagram costs a second, not a refusal.
SCHEDULE = (1.0, 2.0, 4.0)
#: Seconds a lookup may take in all. Longer than the system resolver's own retry (glibc: timeout 5 s x
#: attempts 2 = 10 s, resolv.conf(5)): a client behind the proxy must never be refused an answer it
#: would have waited for on its own (a resolver answering after 5.3 s made allowed hosts a 403).
DEADLINE = 15.0

NO_SUCH_NAME, NO_ADDRESS = verdict.NO_SUCH_NAME, verdict.NO_ADDRESS


@dataclass(frozen=True)
class Key:
    """One question to one upstream: what single flight and the cache are keyed by."""

    name: dns.name.Name  # absolute, lower-cased (the only spelling that ever leaves)
    rdtype: dns.rdatatype.RdataType
    rdclass: dns.rdataclass.RdataClass
    servers: Servers


def key(
    name: str | dns.name.Name, rdtype: dns.rdatatype.RdataType, rdclass: dns.rdataclass.RdataClass, servers: Servers
) -> Key:
    """The key of a question; a str name is taken as absolute (no search list: the name judged is the name asked).

    Raises dns.exception.DNSException for a name DNS cannot carry (a label over 63 bytes...)."""
    n = name if isinstance(name, dns.name.Name) else dns.name.from_text(name)
    return Key(n.canonicalize(), rdtype, rdclass, servers)


@dataclass(frozen=True)
class Result:
    """What one question came to; `answer` is the upstream's answer section as received (TTLs as of `aged`)."""

    outcome: Outcome
    rcode: dns.rcode.Rcode  # the upstream's; SERVFAIL when there was no answer
    answer: tuple[dns.rrset.RRset, ...] = ()
    ttl: float = 0.0  # seconds it may be kept; 0: not kept
    why: str = ""  # for anything but an answer: the words a refusal says (netguard.verdict.unresolved)

    @property
    def trouble(self) -> bool:
        """The resolver failed or did not answer: not a statement about the name."""
        return self.outcome in ("failed", "timeout")


def timed_out(seconds: float) -> Result:
    return Result("timeout", dns.rcode.SERVFAIL, why=verdict.NO_ANSWER.format(seconds=seconds))


def unreachable(error: str) -> Result:
    return Result("failed", dns.rcode.SERVFAIL, why=verdict.UNREACHABLE.format(error=error))


def busy(flights: int) -> Result:
    return Result("failed", dns.rcode.SERVFAIL, why=verdict.FAILED.format(rcode=f"{flights} lookups already in flight"))


def classify(msg: dns.message.Message, k: Key) -> Result:
    """What the upstream's reply `msg` to question `k` means, and how long it may be kept."""
    rcode = msg.rcode()
    answer = tuple(msg.answer)
    if rcode == dns.rcode.NXDOMAIN:
        return Result("nxdomain", rcode, answer, _negative_ttl(msg, chain(answer, k)), NO_SUCH_NAME)
    if rcode != dns.rcode.NOERROR:
        return Result("failed", rcode, (), FAILURE_TTL, verdict.FAILED.format(rcode=dns.rcode.to_text(rcode)))
    found = chain(answer, k)
    if any(r.rdtype == k.rdtype or k.rdtype == dns.rdatatype.ANY for r in found):
        return Result("answer", rcode, answer, min(MAX_TTL, *(float(r.ttl) for r in found)))
    return Result("nodata", rcode, answer, _negative_ttl(msg, found), NO_ADDRESS)


def _negative_ttl(msg: dns.message.Message, found: Sequence[dns.rrset.RRset]) -> float:
    """RFC 2308: the SOA's TTL, at most its MINIMUM field, capped; no SOA, not kept."""
    soas = [r for r in msg.authority if r.rdtype == dns.rdatatype.SOA and len(r)]
    if not soas:
        return 0.0
    soa = soas[0]
    return min(NEGATIVE_MAX, float(soa.ttl), float(soa[0].minimum), *(float(r.ttl) for r in found))


def chain(answer: Iterable[dns.rrset.RRset], k: Key) -> list[dns.rrset.RRset]:
    """RRsets at the question's name and along its CNAME chain (loops and chains over MAX_CNAME_CHAIN cut).

    Everything else a resolver put in the answer is not the question's business (nor a sandbox's)."""
    records = list(answer)
    out: list[dns.rrset.RRset] = []
    name: dns.name.Name = k.name
    seen: set[dns.name.Name] = set()
    for _ in range(MAX_CNAME_CHAIN + 1):
        seen.add(name)
        target: dns.name.Name | None = None
        for rrset in records:
            if rrset.name != name or rrset.rdclass != k.rdclass:
                continue
            if rrset.rdtype == k.rdtype or k.rdtype == dns.rdatatype.ANY:
                out.append(rrset)
            elif rrset.rdtype == dns.rdatatype.CNAME and len(rrset) == 1:
                out.append(rrset)
                target = rrset[0].target
        if target is None or target in seen:
            break
        name = target
    return out


def addresses(r: Result, k: Key) -> list[str]:
    """The A or AAAA addresses `r` gives for `k` (through its CNAME chain), in the order received."""
    if r.outcome != "answer" or k.rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA):
        return []
    return [str(rd.address) for rrset in chain(r.answer, k) if rrset.rdtype == k.rdtype for rd in rrset]


def aged(r: Result, age: float) -> Result:
    """`r` as served `age` seconds after it arrived: each record's TTL lowered by the whole seconds gone."""
    gone = int(age)
    if gone <= 0 or not r.answer:
        return r
    return replace(r, answer=tuple(_with_ttl(rrset, max(0, rrset.ttl - gone)) for rrset in r.answer))


def _with_ttl(rrset: dns.rrset.RRset, ttl: int) -> dns.rrset.RRset:
    return dns.rrset.from_rdata_list(rrset.name, ttl, list(rrset))  # the rdatas are immutable: shared


def send_times(schedule: Sequence[float], deadline: float) -> tuple[float, ...]:
    """When, in seconds from the start, each (re)send of a query goes out: 0, then after each wait."""
    times = [0.0]
    for wait in schedule:
        times.append(times[-1] + wait)
    return tuple(t for t in times if t < deadline)


@dataclass(frozen=True)
class _Entry:
    result: Result
    stored: float
    expires: float


class Cache:
    """Results by key until their TTL runs out; at most `size` entries, least recently used dropped first."""

    def __init__(self, size: int = MAX_ENTRIES) -> None:
        self.size = size
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, k: Key, now: float) -> Result | None:
        """The result kept for `k` at time `now`, aged; None if there is none or it expired."""
        entry = self._entries.get(k)
        if entry is None:
            return None
        if now >= entry.expires:
            del self._entries[k]
            return None
        self._entries.move_to_end(k)
        return aged(entry.result, now - entry.stored)

    def put(self, k: Key, r: Result, now: float) -> None:
        """Keep `r` for its TTL from `now` (a TTL of 0 keeps nothing and forgets what was kept)."""
        self._entries.pop(k, None)
        if r.ttl <= 0:
            return
        self._entries[k] = _Entry(r, now, now + r.ttl)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

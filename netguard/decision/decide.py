"""The decision about one destination of one client connection: verdict pipeline, one audit record, the pin.

One function for every way a connection reaches the daemon: the Gate's mitmproxy hooks and the
front door (netguard.daemon.frontdoor) both call `Decider.authorize`, so a flow decided by either
writes the same record and is pinned to the same checked address. Two deciders would drift apart,
and a drifted copy is a policy bypass nobody reviews.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dns.exception

from netguard import hosts, localaddrs, rules, verdict
from netguard.audit import Kind, decision_record, new_id
from netguard.decision import limits, resolver
from netguard.decision.binding import Binding


def norm_key(host: str, port: int) -> tuple[str, int]:
    """The key a connection's pins use: the normalised name (or the text as given when it is no name)."""
    try:
        return str(rules.normalise(host)), port
    except hosts.HostError:
        return host, port


@dataclass
class Decided:
    """One decision about one destination of a connection: its audit id and the verdict."""

    id: str
    host: str
    port: int
    verdict: verdict.Verdict

    @property
    def allowed(self) -> bool:
        return self.verdict.allowed and self.verdict.ip is not None


@dataclass
class Conn:
    """What the proxy knows about one client connection."""

    binding: Binding
    peer: tuple[str, int] | None = None
    kind: Kind = "tcp"
    pins: dict[tuple[str, int], Decided] = field(default_factory=dict)
    last: Decided | None = None


class Decider:
    """Runs the verdict pipeline for a connection's destinations; shared by every listener of the process."""

    def __init__(self, names: resolver.Resolver | None = None) -> None:
        self.local = localaddrs.LocalAddrs()  # this host's own addresses: read now, refreshed when stale
        self._names = names  # None: the daemon's one resolver, shared with its DNS server (resolver.shared)

    async def authorize(
        self, st: Conn, kind: Kind, host: str, port: int, *, method: str | None = None, url: str | None = None
    ) -> Decided:
        """Run the verdict pipeline, write exactly one audit record; pin if allowed."""
        key = norm_key(host, port)
        b = st.binding

        async def ask(d: rules.Decision) -> rules.Decision:
            assert b.approver is not None
            return verdict.answered(d, await b.approver.ask(key[0], port, kind, st.peer, d.reason))

        async def resolve(v: verdict.Verdict) -> verdict.Verdict:
            pinned = st.pins.get(key)
            if pinned is not None:
                return verdict.Verdict(v.decision, v.by, v.would, pinned.verdict.ip)
            return await self._resolve(b, host, port, v, kind)

        v = await b.verdict(host, port, ask, resolve)
        out = Decided(new_id(), key[0], port, v)
        b.write_decision(
            decision_record(
                b.task,
                out.id,
                kind,
                "allow" if out.allowed else "deny",
                out.host,
                port,
                ip=v.ip if out.allowed else None,
                method=method,
                url=url,
                rule=v.decision.rule,
                reason=v.decision.reason,
                would=v.would if out.allowed else None,
            )
        )
        if out.allowed:
            st.pins[key] = out
            st.last = out
        return out

    async def _resolve(self, b: Binding, host: str, port: int, v: verdict.Verdict, kind: Kind) -> verdict.Verdict:
        """The address to pin an allowed destination to: resolved and vetoed, or the allowed address itself."""
        dest = rules.normalise(host)
        if not isinstance(dest, str):
            return verdict.Verdict(v.decision, v.by, v.would, str(dest))  # allowed by a cidr rule: nothing to resolve
        if b.lookups >= limits.LOOKUPS:  # the one resolver is shared: this sandbox's part of its flights is used
            why = f"more than {limits.LOOKUPS} lookups of this sandbox in flight"
            if b.refusals is not None:
                b.refusals.refuse("lookups", kind, why)
            return verdict.unresolved(v, dest, why)
        b.lookups += 1
        try:
            addrs = await (self._names or resolver.shared()).addresses(dest, b.upstream())
        except resolver.LookupFailed as e:
            return verdict.unresolved(v, dest, e.why)
        except (OSError, dns.exception.DNSException) as e:
            return verdict.unresolved(v, dest, str(e) or type(e).__name__)
        finally:
            b.lookups -= 1
        return verdict.veto(b.rules, v, dest, addrs, port, self.local.table())  # every address judged, as ever

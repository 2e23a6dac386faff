"""One sandbox as the proxy and its DNS server see it: task id, compiled policy, audit log, approvals,
and for inspected hosts the run's CA, the extra upstream roots and the brokered credentials."""

from __future__ import annotations

from dataclasses import dataclass, field

import dns.asyncresolver
import dns.resolver

from netguard import rules, verdict
from netguard.asking import Approver
from netguard.audit import AuditLog
from netguard.credentials import Secret
from netguard.localaddrs import RESOLVE_TIMEOUT
from netguard.proxy.spec import CaPair
from netguard.rules import Inspection


@dataclass
class Binding:
    """One sandbox: its task id, compiled policy and audit log, and how its default-deny names are treated."""

    task: str
    rules: rules.Ruleset
    audit: AuditLog
    learn: bool = False  # default-deny names pass, recorded as would: deny (issue: learn a policy)
    ask_all: bool = False  # every default-deny name becomes a question
    approver: Approver | None = None  # where `ask` questions go; None: they are denied
    ca: CaPair | None = None  # signs the leaf certificates of inspected hosts; None: nothing is inspected
    upstream_ca: str | None = None  # PEM roots trusted for inspected upstreams besides the host's store
    secrets: tuple[Secret, ...] = ()  # brokered credentials: their hosts are inspected
    _resolver: dns.asyncresolver.Resolver | None = field(default=None, init=False, repr=False)
    _system_dns: tuple[str, int] | None = field(default=None, init=False, repr=False)

    def judge(self, host: str, port: int | None) -> verdict.Verdict:
        """The policy's verdict for `host:port` with this sandbox's learn and ask settings. Pure."""
        return verdict.judge(self.rules, host, port, learn=self.learn, ask_all=self.ask_all)

    async def verdict(
        self, host: str, port: int | None, ask: verdict.Asker, resolve: verdict.Resolver
    ) -> verdict.Verdict:
        """The whole pipeline: judge, ask (only with an approval channel: else an `ask` is refused), resolve."""
        return await verdict.run(
            self.rules,
            host,
            port,
            learn=self.learn,
            ask_all=self.ask_all,
            ask=ask if self.approver is not None else None,
            resolve=resolve,
        )

    def upstream_dns(self) -> tuple[str, int]:
        """Where allowed queries are forwarded: the policy's resolver, else the system's first nameserver
        (read from /etc/resolv.conf once, not on every query)."""
        if self.rules.policy.resolver is not None:
            return self.rules.policy.resolver
        if self._system_dns is None:
            system = dns.resolver.Resolver()
            self._system_dns = (str(system.nameservers[0]), int(system.port))
        return self._system_dns

    def resolver(self) -> dns.asyncresolver.Resolver | None:
        """A resolver pinned to the policy's `resolver:`; None means the system's (getaddrinfo)."""
        target = self.rules.policy.resolver
        if target is None:
            return None
        if self._resolver is None:
            r = dns.asyncresolver.Resolver(configure=False)
            r.nameservers = [target[0]]
            r.port = target[1]
            r.lifetime = RESOLVE_TIMEOUT
            self._resolver = r
        return self._resolver

    def inspection(self, host: str, port: int) -> Inspection | None:
        """How requests to `host:port` are judged; None: passthrough (the bytes are relayed untouched).

        A brokered credential's host is inspected on every port its allow rule covers, whatever
        the rule says: the proxy has to see the request to add the header. Without a CA nothing is
        inspected (the spec refuses a policy that would need one).
        """
        if self.ca is None:
            return None
        found = rules.inspection(self.rules, host, port)
        if found is None and any(s.host == host for s in self.secrets):
            return Inspection(None, False, next(s.origin for s in self.secrets if s.host == host))
        return found

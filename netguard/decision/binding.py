"""One sandbox as the proxy and its DNS server see it: task id, compiled policy, audit log, approvals,
and for inspected hosts the run's CA, the extra upstream roots and the brokered credentials."""

from __future__ import annotations

from dataclasses import dataclass, field

from netguard import rules, upstreamproxy, verdict
from netguard.asking import Approver
from netguard.audit import AuditLog, DecisionRecord, RequestRecord
from netguard.credentials import Secret
from netguard.decision import limits
from netguard.rules import Inspection
from netguard.spec import CaPair


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
    refusals: limits.Refusals | None = None  # what its limits of the shared daemon refused (netguard.decision.limits)
    upstream_proxy: upstreamproxy.Upstream | None = None  # its run's corporate proxy; None: dialled directly
    lookups: int = field(default=0, init=False)  # its connect-path lookups in flight (limits.LOOKUPS)
    denials: int = field(default=0, init=False)  # denial records written so far (limits.DENIALS_LOGGED)

    def write_decision(self, record: DecisionRecord | RequestRecord) -> None:
        """One decision (or judged request) record into this sandbox's log; past DENIALS_LOGGED denials, a count
        instead.

        Threat: a churn of denied connections or DNS queries fills the user's disk through the log."""
        if record["action"] == "deny" and self.refusals is not None:
            self.denials += 1
            if self.denials > limits.DENIALS_LOGGED:
                why = f"more than {limits.DENIALS_LOGGED} denials in this run: the rest are counted, not written"
                self.refusals.refuse("records", record["kind"], why)
                return
        self.audit.write(record)

    def judge(self, host: str, port: int | None) -> verdict.Verdict:
        """The policy's verdict for `host:port` with this sandbox's learn and ask settings. Pure."""
        return verdict.judge(self.rules, host, port, learn=self.learn, ask_all=self.ask_all)

    def allows_by_itself(self, host: str, port: int | None) -> bool:
        """The policy allows `host:port` outright (no question, no learning): what the front door's own paths
        may serve without mitmproxy. Pure."""
        v = self.judge(host, port)
        return v.decision.action == "allow" and v.by == "policy"

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

    def via(self, host: str, plain_http: bool = False) -> upstreamproxy.Proxy | None:
        """The corporate proxy an allowed connection to `host` is tunnelled through (its run's, NO_PROXY
        applied), or None: dialled directly. `plain_http`: a plain HTTP request (http_proxy)."""
        up = self.upstream_proxy
        return up.route(host, plain_http) if up is not None else None

    def upstream(self) -> tuple[str, int] | None:
        """Who answers this sandbox's lookups (netguard.decision.resolver): the policy's `resolver:`, or None
        for the system's (/etc/hosts, then /etc/resolv.conf's nameservers). Both its DNS queries and its
        connections ask the same one, so the two can never be told different things."""
        return self.rules.policy.resolver

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
            return Inspection(None, False, next(str(s.origin) for s in self.secrets if s.host == host))
        return found

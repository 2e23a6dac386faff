"""One decision pipeline for every kind of traffic: decide -> learn -> ask -> resolve + veto.

TCP, TLS, HTTP and DNS all go through `run`, so a name is judged the same way whichever
door a sandbox knocks on (a DNS answer and the connection after it can never disagree on
policy, learn mode or approvals). The steps that decide are plain functions (`judge`,
`answered`, `unasked`, `deferred`, `veto`, `refusal_text`): they do no I/O and the unit
tests hammer them. The two steps that wait on the world are injected by the caller:
  ask      who answers an `ask` (a human through netguard.asking for TCP/HTTP; DNS defers
           with a placeholder address instead, see `deferred`)
  resolve  what an allowed destination leads to (TCP/HTTP: the checked address to pin; DNS:
           its query-type filter)
The caller writes the one audit record: only it knows the record's kind-specific fields.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from netguard import hosts, rules
from netguard.approval import Answer

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: Who let a destination pass or stopped it: the policy's rules, learn mode, or the ask step.
By = Literal["policy", "learn", "approval"]


@dataclass(frozen=True)
class Verdict:
    """Where the pipeline came to: the decision, who made it, and the address to pin if any."""

    decision: rules.Decision
    by: By = "policy"
    would: str | None = None  # "deny" when learn mode let a default-deny pass (the audit's `would`)
    ip: str | None = None  # the checked address an allowed TCP/HTTP destination is pinned to

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


#: What a lookup that gave no address says (netguard.dnscache writes them, launcher.audit.denials reads them):
#: the name does not resolve...
NO_SUCH_NAME = "no such name (NXDOMAIN)"
NO_ADDRESS = "no address (NODATA)"
#: ...or the resolver is in trouble, which says nothing about the name (a 403 for a slow resolver misleads).
NO_ANSWER = "the resolver did not answer within {seconds:g} s"
FAILED = "the resolver failed ({rcode})"
UNREACHABLE = "the resolver could not be reached ({error})"


def resolver_trouble(why: str) -> bool:
    """Whether `why` (the part of a reason after "cannot resolve NAME: ") is a resolver's failure, not the name's."""
    return why.startswith(tuple(w.partition("{")[0] for w in (NO_ANSWER, FAILED, UNREACHABLE)))


#: The ask step: given the `ask` decision, the decision that replaces it.
Asker = Callable[[rules.Decision], Awaitable[rules.Decision]]
#: The resolve step: given an allowed verdict, the verdict to act on (it may turn into a deny).
Resolver = Callable[[Verdict], Awaitable[Verdict]]


async def run(
    rs: rules.Ruleset,
    host: str,
    port: int | None,
    *,
    learn: bool = False,
    ask_all: bool = False,
    ask: Asker | None = None,
    resolve: Resolver | None = None,
) -> Verdict:
    """The verdict for `host` (as the client named it) on `port` (None: a DNS name lookup).

    `ask` None means no approval channel: an `ask` is refused, never silently allowed.
    """
    v = judge(rs, host, port, learn=learn, ask_all=ask_all)
    if v.decision.action == "ask":
        if ask is None:
            return replace(v, decision=unasked(v.decision))
        v = Verdict(await ask(v.decision), by="approval")
    if v.allowed and resolve is not None:
        v = await resolve(v)
    return v


def judge(rs: rules.Ruleset, host: str, port: int | None, *, learn: bool = False, ask_all: bool = False) -> Verdict:
    """Decide, then learn mode and --ask: everything before a human or the network is involved. Pure."""
    d = rules.decide(rs, host, port)
    # Only the default deny of a *name* is learned or asked: an explicit deny rule always holds,
    # and raw addresses stay governed by cidr rules.
    default_deny = d.action == "deny" and d.rule is None and is_name(host)
    if default_deny and learn:
        return learned(d, d.reason)
    if default_deny and ask_all:
        return Verdict(rules.Decision("ask", None, f"{d.reason} (--ask)"))
    return Verdict(d)


def learned(d: rules.Decision, why: str) -> Verdict:
    """What learn mode makes of a denial: let it through, and record that the policy would deny it."""
    return Verdict(rules.Decision("allow", d.rule, f"learn mode: {why}"), by="learn", would="deny")


def is_name(host: str) -> bool:
    """Learn and ask apply to names; raw addresses stay governed by cidr rules."""
    try:
        return isinstance(rules.normalise(host), str)
    except hosts.HostError:
        return False


def unasked(d: rules.Decision) -> rules.Decision:
    """An `ask` with nobody to ask: fail closed."""
    return rules.Decision("deny", d.rule, d.reason + " (no approval channel; denied)")


def answered(d: rules.Decision, answer: Answer) -> rules.Decision:
    """The `ask` decision `d` after the human's answer (a timeout or a lost channel is a deny)."""
    if answer in ("once", "run", "always"):
        return rules.Decision("allow", d.rule, f"approved by a human ({answer})")
    why = "no answer in time" if answer == "timeout" else "denied by a human"
    return rules.Decision("deny", d.rule, f"{d.reason}: {why}")


def deferred(d: rules.Decision) -> rules.Decision:
    """DNS's ask step: the name gets a placeholder address and the question waits for the connection
    (the real name is not looked up upstream before someone said yes)."""
    return rules.Decision(
        "allow", d.rule, f"{d.reason}: needs approval; answered with a placeholder address, not looked up upstream"
    )


def veto(
    rs: rules.Ruleset,
    v: Verdict,
    name: str,
    addrs: Sequence[Address],
    port: int,
    own: rules.PrefixTable | None,
) -> Verdict:
    """`v` pinned to the first of `name`'s addresses that passes the special-address veto, else the first veto.

    Guards against rebinding and SSRF (rules.check_address): pinning the returned address means the
    name that was judged is the only thing that can be reached. Pure.
    """
    if not addrs:
        return unresolved(v, name, "no address")
    vetoes = []
    for a in addrs:
        vetoed = rules.check_address(rs, a, port, own)
        if vetoed is None:
            return replace(v, ip=str(a))
        vetoes.append(vetoed)
    return replace(v, decision=vetoes[0], would=None, ip=None)


def unresolved(v: Verdict, name: str, why: str) -> Verdict:
    """An allowed name that gave no address: denied, with the resolver's words (netguard.dnscache): "no such
    name (NXDOMAIN)" and "no address (NODATA)" say the name does not resolve; "the resolver did not answer
    within N s" and "the resolver failed (SERVFAIL)" say the lookup did not work, not that the name is bad."""
    return replace(
        v, decision=rules.Decision("deny", v.decision.rule, f"cannot resolve {name}: {why}"), would=None, ip=None
    )


def refusal_text(host: str | None, port: int | None, d: rules.Decision) -> str:
    """The one line a refused client is told (HTTP 403 body, DNS Extended Error text): what, why, which rule."""
    where = host or "?"
    if port is not None:
        where = f"{where}:{port}"
    rule = f" [{d.rule}]" if d.rule else ""
    return f"sandgate: blocked {where}: {d.reason}{rule}"

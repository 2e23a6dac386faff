"""A plan as a Smokescreen ACL (`version: v1`, stripe/smokescreen pkg/smokescreen/acl/v1). Pure.

Smokescreen's glob `*.x` matches every subdomain of x at any depth and never x itself (acl.go,
HostMatchesGlob): sandgate's meaning, so wildcards are written as they are. One service is written,
`action: enforce` (anything not allowed is denied) or, for a learn run, `report` (let through and
logged); no `default:` rule, so clients that are not this service are denied. Smokescreen checks a
service's `allowed_domains` before `global_deny_list`, so the deny list cannot take a name out of an
allowed one (the plan refuses that); it is written only for `report`, where it keeps sandgate's
explicit denies enforced, as learn mode does. The ACL has no ports and no addresses: both are gaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from netguard.export.plan import ANY_PORT, Gap, Plan, describe_ports


@dataclass(frozen=True)
class Target:
    """The Smokescreen service (the client's role, from its certificate or header) and its owner."""

    name: str = "sandgate-task"
    project: str = "sandgate"


def gaps(plan: Plan) -> list[Gap]:
    """What Smokescreen's ACL cannot say."""
    out: list[Gap] = []
    ports = sorted({describe_ports(n.ports) for n in plan.names if n.ports != ANY_PORT})
    if ports:
        out.append(
            Gap(
                "sandgate-only",
                "smokescreen",
                f"ports: the ACL has none, so Smokescreen lets allowed names through on any port it proxies; "
                f"sandgate allows only {'; '.join(ports)}",
            )
        )
    out += [
        Gap("narrowed", n.origin, f"cidr {n.cidr}: left out; Smokescreen's ACL allows host names only")
        for n in plan.networks
    ]
    out += [
        Gap(
            "sandgate-only",
            n.origin,
            f"deny cidr {n.cidr}: not in the ACL; start smokescreen with --deny-range {n.cidr}",
        )
        for n in plan.deny_networks
    ]
    if plan.learn:
        out += [
            Gap("narrowed", n.origin, f"deny {n.pattern} ({describe_ports(n.ports)}): on the deny list for every port")
            for n in plan.deny_names
            if n.ports != ANY_PORT
        ]
    return out


def document(plan: Plan, target: Target) -> tuple[dict[str, Any], list[Gap]]:
    """The ACL for `plan`, and the gaps this target adds."""
    service: dict[str, Any] = {
        "name": target.name,
        "project": target.project,
        "action": "report" if plan.learn else "enforce",
        "allowed_domains": list(dict.fromkeys(n.pattern for n in plan.names)),
    }
    doc: dict[str, Any] = {"version": "v1", "services": [service]}
    if plan.learn and plan.deny_names:
        doc["global_deny_list"] = list(dict.fromkeys(n.pattern for n in plan.deny_names))
    return doc, gaps(plan)

"""A plan as a `cilium.io/v2` CiliumNetworkPolicy: `toFQDNs` for names, `toCIDR` for networks. Pure.

Wildcards: sandgate's `*.x` is every strict subdomain of x at any depth; Cilium's `*.x` is exactly one
label. Cilium 1.19 added the `**.x` prefix (one or more labels, never x itself: cilium/cilium commit
4ef872ef), which is sandgate's meaning, so that is what is written for 1.19 and later. For an older
target `*.x` is written and reported as narrowed: never a pattern that matches more than sandgate's.

FQDN rules need Cilium's DNS proxy to see the pod's lookups, so the policy also allows DNS to kube-dns
with the same names in `rules.dns` (the proxy refuses other names, as sandgate's DNS answers do).
Ports are TCP only: sandgate lets no UDP out. `enableDefaultDeny.egress` is set so that a policy that
allows nothing still denies everything. Deny cidrs become `egressDeny`, which beats every allow (also
addresses learned through names), as sandgate's deny cidrs veto names that resolve into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from netguard.export.plan import ANY_PORT, Gap, NameRule, NetRule, Plan, Ports

#: The first Cilium release whose matchPattern reads `**.` as one or more labels.
MULTI_LABEL_VERSION = (1, 19)
#: A CRD limit: at most this many ports in one `toPorts` entry.
MAX_PORTS = 40
#: Where kube-dns answers in a standard cluster (the labels Cilium's own FQDN examples use).
KUBE_DNS = {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}


@dataclass(frozen=True)
class Target:
    """Where the policy goes: its name, namespace, the pods it selects, and the Cilium version it is for."""

    name: str = "sandgate-egress"
    namespace: str | None = None
    selector: tuple[tuple[str, str], ...] = ()
    version: tuple[int, int] = MULTI_LABEL_VERSION
    description: str = ""


def _port_entries(ports: Ports) -> list[dict[str, Any]]:
    if ports == ANY_PORT:
        return [{"port": "0", "protocol": "TCP"}]  # Cilium: port 0 is every port of the protocol
    out: list[dict[str, Any]] = []
    for lo, hi in ports:
        entry: dict[str, Any] = {"port": str(lo), "protocol": "TCP"}
        if hi > lo:
            entry["endPort"] = hi
        out.append(entry)
    return out


def to_ports(ports: Ports) -> list[dict[str, Any]]:
    """`toPorts` for these TCP ranges, split where the CRD caps the list (entries are OR-ed)."""
    entries = _port_entries(ports)
    return [{"ports": entries[i : i + MAX_PORTS]} for i in range(0, len(entries), MAX_PORTS)]


def selector(rule: NameRule, multi_label: bool) -> dict[str, str]:
    if not rule.wildcard:
        return {"matchName": rule.name}
    return {"matchPattern": f"{'**' if multi_label else '*'}.{rule.name}"}


def _grouped[R: (NameRule, NetRule)](rules: tuple[R, ...]) -> dict[Ports, list[R]]:
    groups: dict[Ports, list[R]] = {}
    for r in rules:
        groups.setdefault(r.ports, []).append(r)
    return groups


def _dns_rule(names: tuple[NameRule, ...], multi_label: bool) -> dict[str, Any]:
    dns = list({str(s): s for s in (selector(n, multi_label) for n in names)}.values())  # each name once
    return {
        "toEndpoints": [{"matchLabels": dict(KUBE_DNS)}],
        "toPorts": [
            {"ports": [{"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}], "rules": {"dns": dns}}
        ],
    }


def egress(plan: Plan, multi_label: bool) -> list[dict[str, Any]]:
    """The egress rules: DNS to kube-dns for the names, one rule per port set for names and for networks."""
    out: list[dict[str, Any]] = []
    if plan.names:
        out.append(_dns_rule(plan.names, multi_label))
    for ports, names in _grouped(plan.names).items():
        out.append({"toFQDNs": [selector(n, multi_label) for n in names], "toPorts": to_ports(ports)})
    for ports, nets in _grouped(plan.networks).items():
        out.append({"toCIDR": [n.cidr for n in nets], "toPorts": to_ports(ports)})
    return out


def egress_deny(plan: Plan) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ports, nets in _grouped(plan.deny_networks).items():
        rule: dict[str, Any] = {"toCIDR": [n.cidr for n in nets]}
        if ports != ANY_PORT:  # no toPorts: every port and protocol, at least what sandgate denies
            rule["toPorts"] = to_ports(ports)
        out.append(rule)
    return out


def gaps(plan: Plan, multi_label: bool) -> list[Gap]:
    """What this target adds to the plan's gaps."""
    out: list[Gap] = []
    if plan.learn:
        out.append(
            Gap(
                "refused",
                "cilium",
                "a CiliumNetworkPolicy has no learn mode; export without --learn "
                "(Cilium's policy-audit-mode records what a policy would drop)",
            )
        )
    if not multi_label:
        out += [
            Gap("narrowed", n.origin, f"{n.pattern}: written as '*.{n.name}', one label only (Cilium < 1.19)")
            for n in plan.names
            if n.wildcard
        ]
    if any(n.wildcard for n in plan.names):
        out.append(
            Gap(
                "sandgate-only",
                "cilium",
                "names under wildcards: Cilium's DNS proxy forwards every query type; "
                "sandgate in the pod answers only A/AAAA (and the types an entry lists)",
            )
        )
    return out


def document(plan: Plan, target: Target) -> tuple[dict[str, Any], list[Gap]]:
    """The CiliumNetworkPolicy for `plan`, and the gaps this target adds."""
    multi_label = target.version >= MULTI_LABEL_VERSION
    metadata: dict[str, Any] = {"name": target.name}
    if target.namespace:
        metadata["namespace"] = target.namespace
    metadata["labels"] = {"app.kubernetes.io/managed-by": "sandgate"}
    spec: dict[str, Any] = {}
    if target.description:
        spec["description"] = target.description
    spec["endpointSelector"] = {"matchLabels": dict(target.selector)} if target.selector else {}
    spec["enableDefaultDeny"] = {"egress": True, "ingress": False}
    spec["egress"] = egress(plan, multi_label)
    if plan.deny_networks:
        spec["egressDeny"] = egress_deny(plan)
    doc = {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": metadata, "spec": spec}
    return doc, gaps(plan, multi_label)

"""Windows Firewall rules scoped to the sandbox user's SID: the second layer behind WFP.

Threat answered: one layer misconfigured or removed (a WFP filter deleted by another tool, a
sublayer outweighed) must not open the network. Rules are scoped with LocalUserAuthorizedList
(an SDDL naming the SID), are all BLOCK (in the firewall a block always beats an allow, so no
other rule can reopen them), and leave exactly one hole: loopback TCP to the proxy's ports.
Applied in the order listed, removed in reverse; names are fixed so re-running setup replaces them.
The one ALLOW rule, for the real user's proxy in transparent mode only, is transparent_allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LOOPBACK_V4 = "127.0.0.0-127.255.255.255"
LOOPBACK_V6 = "::1"
#: Every address but loopback, as the firewall's RemoteAddresses ranges (it has no "not").
NOT_LOOPBACK = ("0.0.0.0-126.255.255.255", "128.0.0.0-255.255.255.255", "::", "::2-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")  # fmt: skip


@dataclass(frozen=True)
class FirewallRule:
    name: str  # INetFwRule.Name: fixed, so setup replaces its own rules and removal finds them
    direction: Literal["out", "in"]
    protocol: Literal["any", "tcp", "udp"]  # NET_FW_IP_PROTOCOL_ANY / _TCP / _UDP
    remote_addresses: tuple[str, ...]  # ("*",) = any
    remote_ports: tuple[str, ...]  # ("*",) = any; only with tcp/udp
    local_user_sddl: str  # INetFwRule3.LocalUserAuthorizedList
    action: Literal["block", "allow"] = "block"  # allow: only transparent_allow (the proxy's own port)
    profiles: Literal["all"] = "all"  # NET_FW_PROFILE2_ALL: domain, private and public alike
    local_ports: tuple[str, ...] = ("*",)
    program: str | None = None  # INetFwRule.ApplicationName


def port_complement(ports: tuple[int, ...]) -> tuple[str, ...]:
    """Every TCP port but `ports`, as firewall port ranges ("1-3127", "3130-65535")."""
    out: list[str] = []
    start = 1
    for p in sorted(set(ports)):
        if p > start:
            out.append(f"{start}-{p - 1}" if p - 1 > start else str(start))
        start = p + 1
    if start <= 65535:
        out.append(f"{start}-65535" if start < 65535 else "65535")
    return tuple(out)


def plan_rules(sid: str, proxy_ports: tuple[int, ...]) -> tuple[FirewallRule, ...]:
    """The rules in the order they are added: off-host first (the dangerous direction), then the
    loopback services that are not the proxy (host services on loopback: databases, debug ports;
    then all of loopback UDP: a local resolver), then inbound (a sandbox listener reachable from the network)."""
    sddl = f"O:LSD:(A;;CC;;;{sid})"
    return (
        FirewallRule(f"sandgate-{sid}-out-offhost", "out", "any", NOT_LOOPBACK, ("*",), sddl),
        FirewallRule(
            f"sandgate-{sid}-out-loopback",
            "out",
            "tcp",
            (LOOPBACK_V4, LOOPBACK_V6),
            port_complement(proxy_ports),
            sddl,
        ),
        FirewallRule(f"sandgate-{sid}-out-loopback-udp", "out", "udp", (LOOPBACK_V4, LOOPBACK_V6), ("*",), sddl),
        FirewallRule(f"sandgate-{sid}-in-all", "in", "any", ("*",), ("*",), sddl),
    )


def transparent_allow(owner_sid: str, program: str, port: int) -> FirewallRule:
    """The one ALLOW rule (transparent mode only): a reflected SYN arrives as an unsolicited inbound
    connection from the original destination's address, which the firewall's default inbound
    policy blocks. Scoped to the proxy's program, its transparent port, TCP and the real user (an
    inbound rule's LocalUser is the listener's); the sandbox user's own listeners stay blocked by
    WFP (hard, our sublayer) and by its `in-all` rule (a block beats an allow). Anyone on the network
    may reach that port while the proxy listens: the proxy serves only peers the redirect loop
    reflected (win32divert.TransparentPath.original_addr), and nobody listens outside transparent runs."""
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range")
    return FirewallRule(
        f"sandgate-{owner_sid}-in-transparent-{port}",
        "in",
        "tcp",
        ("*",),
        ("*",),
        f"O:LSD:(A;;CC;;;{owner_sid})",
        action="allow",
        local_ports=(str(port),),
        program=program,
    )


def _ps(text: str) -> str:
    """A PowerShell single-quoted literal: nothing inside is expanded ('' is the one escape)."""
    return "'" + text.replace("'", "''") + "'"


def _ps_list(items: tuple[str, ...]) -> str:
    return ",".join(_ps(i) for i in items)


def ps_add(rule: FirewallRule) -> str:
    """The New-NetFirewallRule command for one rule (the NetSecurity module: -LocalUser takes the
    SDDL that INetFwRule3.LocalUserAuthorizedList holds). Every value is quoted, never spliced."""
    parts = [
        "New-NetFirewallRule",
        f"-Name {_ps(rule.name)}",
        f"-DisplayName {_ps(rule.name)}",
        f"-Direction {'Outbound' if rule.direction == 'out' else 'Inbound'}",
        f"-Action {rule.action.capitalize()}",
        f"-Protocol {rule.protocol.upper() if rule.protocol != 'any' else 'Any'}",
        "-Profile Any",
        f"-LocalUser {_ps(rule.local_user_sddl)}",
    ]
    if rule.remote_addresses != ("*",):
        parts.append(f"-RemoteAddress {_ps_list(rule.remote_addresses)}")
    if rule.remote_ports != ("*",) and rule.protocol != "any":
        parts.append(f"-RemotePort {_ps_list(rule.remote_ports)}")
    if rule.local_ports != ("*",) and rule.protocol != "any":
        parts.append(f"-LocalPort {_ps_list(rule.local_ports)}")
    if rule.program is not None:
        parts.append(f"-Program {_ps(rule.program)}")
    return " ".join(parts) + " | Out-Null"


def ps_has(name: str) -> str:
    """Prints 1 when a rule of that name exists, 0 otherwise."""
    return f"if (Get-NetFirewallRule -Name {_ps(name)} -ErrorAction SilentlyContinue) {{ 1 }} else {{ 0 }}"


def ps_remove(name: str) -> str:
    return f"Remove-NetFirewallRule -Name {_ps(name)} -ErrorAction SilentlyContinue"

"""What Windows decides for one outbound connect at ALE_AUTH_CONNECT, from the filters as they go on the wire.

A model of WFP's documented arbitration (learn.microsoft.com/windows/win32/fwp/filter-arbitration), for tests:
- inside a sublayer, "the matching filters" are evaluated "from highest weight to lowest weight" until one
  returns Permit or Block: that filter decides the sublayer;
- sandgate's sublayer (weight 0xFFFF) comes first; the Windows Firewall's rules sit in a lower sublayer;
- a Permit without FWPS_RIGHT_ACTION_WRITE (FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT): "Only a callout Veto can
  block traffic in another sublayer. This is called a hard permit."; a soft Permit is overridden by a lower
  sublayer's Block; a Block is final.
Conditions are read from wfpwire.WireCondition: data type and match type (FWP_MATCH_EQUAL, or
FWP_MATCH_FLAGS_NONE_SET for FWPM_CONDITION_FLAGS, whose FWP_CONDITION_FLAG_IS_LOOPBACK the stack sets for
loopback traffic at ALE_AUTH_CONNECT: learn.microsoft.com/windows/win32/fwp/filtering-condition-flags-).
A match type or condition this model does not know fails the test (never silently "matches").
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

from netguard.windows import firewall, wfp, wfpwire

Action = Literal["permit", "block"]


@dataclass(frozen=True)
class Connect:
    sid: str
    protocol: int  # IPPROTO_*
    addr: str
    port: int

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        return ipaddress.ip_address(self.addr)


def _sd_grants(sddl: str, sid: str) -> bool:
    """FWP_ACTRL_MATCH_FILTER ("CC") by the first ACE naming `sid` or Everyone (an explicit deny comes first)."""
    for kind, rights, who in re.findall(r"\((A|D);;([A-Z]+);;;([^)]+)\)", sddl):
        if "CC" in rights and who in (sid, "WD"):
            return str(kind) == "A"
    return False


def _value(c: wfpwire.WireCondition, conn: Connect) -> int | bytes | str:
    fields = {str(v): k for k, v in wfp.FIELDS.items()}
    name = fields[c.field_key]
    if name == "protocol":
        return conn.protocol
    if name == "remote_port":
        return conn.port
    if name == "remote_addr":
        return int(conn.ip) if conn.ip.version == 4 else conn.ip.packed
    if name == "flags":
        return wfp.FLAG_IS_LOOPBACK if conn.ip.is_loopback else 0
    raise AssertionError(f"no model for condition {name} at ALE_AUTH_CONNECT")


def _matches(c: wfpwire.WireCondition, conn: Connect) -> bool:
    if c.data_type == wfpwire.FWP_SECURITY_DESCRIPTOR_TYPE:
        assert c.match_type == wfpwire.FWP_MATCH_EQUAL
        return _sd_grants(str(c.value), conn.sid)
    have = _value(c, conn)
    if c.match_type == wfpwire.FWP_MATCH_EQUAL:
        return have == c.value
    if c.match_type == wfpwire.FWP_MATCH_FLAGS_NONE_SET:
        assert c.data_type == wfpwire.FWP_UINT32, "FWPM_CONDITION_FLAGS is an FWP_UINT32"
        return int(have) & int(c.value) == 0
    raise AssertionError(f"no model for match type {c.match_type}")


def sandgate(filters: list[wfpwire.WireFilter], conn: Connect) -> tuple[Action, bool] | None:
    """sandgate's sublayer: (action, hard) of the highest-weight matching filter at this connect's layer."""
    layer = str(wfp.LAYERS["ALE_AUTH_CONNECT_V4" if conn.ip.version == 4 else "ALE_AUTH_CONNECT_V6"])
    for f in sorted((f for f in filters if f.layer_key == layer), key=lambda f: -f.weight):
        if all(_matches(c, conn) for c in f.conditions):
            hard = bool(f.flags & wfpwire.FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT)
            return ("block" if f.action == wfpwire.FWP_ACTION_BLOCK else "permit"), hard
    return None


def _in_ranges(value: int | ipaddress.IPv4Address | ipaddress.IPv6Address, ranges: tuple[str, ...]) -> bool:
    for r in ranges:
        if r == "*":
            return True
        lo, _, hi = r.partition("-")
        if isinstance(value, int):
            if int(lo) <= value <= int(hi or lo):
                return True
            continue
        a, b = ipaddress.ip_address(lo), ipaddress.ip_address(hi or lo)
        if a.version == value.version and a <= value <= b:  # type: ignore[operator]
            return True
    return False


def firewall_blocks(rules: tuple[firewall.FirewallRule, ...], conn: Connect) -> bool:
    """A Windows Firewall outbound block rule (LocalUserAuthorizedList naming the connecting user) matches."""
    for r in rules:
        if r.direction != "out" or r.action != "block" or not _sd_grants(r.local_user_sddl, conn.sid):
            continue
        proto = {"any": None, "tcp": wfp.IPPROTO_TCP, "udp": 17}[r.protocol]
        if proto is not None and proto != conn.protocol:
            continue
        if _in_ranges(conn.ip, r.remote_addresses) and (proto is None or _in_ranges(conn.port, r.remote_ports)):
            return True
    return False


def decide(filters: list[wfpwire.WireFilter], rules: tuple[firewall.FirewallRule, ...], conn: Connect) -> Action:
    """The layer's final action: sandgate's sublayer first, then the firewall's (default outbound: permit)."""
    ours = sandgate(filters, conn)
    if ours is not None and (ours[0] == "block" or ours[1]):
        return ours[0]  # a block is final; a hard permit only a callout veto could undo
    return "block" if firewall_blocks(rules, conn) else "permit"

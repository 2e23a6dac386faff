"""The WFP filter plan: which connections the sandbox user's token may make, decided by the kernel.

Threat answered: a program that ignores HTTP(S)_PROXY opens its own socket (direct IP, other
ports, UDP/QUIC, DNS 53/853 to any resolver, IPv6). Filters at ALE_AUTH_CONNECT v4/v6 match the
connecting token's user SID (FWPM_CONDITION_ALE_USER_ID), so every process of the sandbox user is
covered whatever its image, and persistent filters survive a reboot and a killed sandgate.
Keys are derived deterministically (uuid5), so `sandgate setup` is idempotent and removal finds
exactly what setup added, also after a crash. GUIDs of layers and conditions are fwpmu.h's.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Literal

#: sandgate's own namespace for derived WFP keys (fixed forever: changing it orphans installed filters).
NAMESPACE = uuid.UUID("5a6d8c1e-7f2b-5e34-9a41-3c0b2d6e8f17")

LayerName = Literal[
    "ALE_AUTH_CONNECT_V4",
    "ALE_AUTH_CONNECT_V6",
    "ALE_RESOURCE_ASSIGNMENT_V4",
    "ALE_RESOURCE_ASSIGNMENT_V6",
    "ALE_AUTH_LISTEN_V4",
    "ALE_AUTH_LISTEN_V6",
    "ALE_AUTH_RECV_ACCEPT_V4",
    "ALE_AUTH_RECV_ACCEPT_V6",
]
#: FWPM_LAYER_* keys (fwpmu.h).
LAYERS: dict[LayerName, uuid.UUID] = {
    "ALE_AUTH_CONNECT_V4": uuid.UUID("c38d57d1-05a7-4c33-904f-7fbceee60e82"),
    "ALE_AUTH_CONNECT_V6": uuid.UUID("4a72393b-319f-44bc-84c3-ba54dcb3b6b4"),
    "ALE_RESOURCE_ASSIGNMENT_V4": uuid.UUID("1247d66d-0b60-4a15-8d44-7155d0f53a0c"),
    "ALE_RESOURCE_ASSIGNMENT_V6": uuid.UUID("55a650e1-5f0a-4eca-a653-88f53b26aa8c"),
    "ALE_AUTH_LISTEN_V4": uuid.UUID("88bb5dad-76d7-4227-9c71-df0a3ed7be7e"),
    "ALE_AUTH_LISTEN_V6": uuid.UUID("7ac9de24-17dd-4814-b4bd-a9fbc95a321b"),
    "ALE_AUTH_RECV_ACCEPT_V4": uuid.UUID("e1cd9fe7-f4b5-4273-96c0-592e487b8650"),
    "ALE_AUTH_RECV_ACCEPT_V6": uuid.UUID("a3b42c97-9f04-4672-b87e-cee9c483257f"),
}
FieldName = Literal["user", "remote_addr", "remote_port", "protocol", "local_port", "flags"]
#: FWPM_CONDITION_* keys (fwpmu.h).
FIELDS: dict[FieldName, uuid.UUID] = {
    "user": uuid.UUID("af043a0a-b34d-4f86-979c-c90371af6e66"),  # ALE_USER_ID: an SD matched against the token
    "remote_addr": uuid.UUID("b235ae9a-1d64-49b8-a44c-5ff3d9095045"),
    "remote_port": uuid.UUID("c35a604d-d22b-4e1a-91b4-68f674ee674b"),
    "protocol": uuid.UUID("3971ef2b-623e-4f9a-8cb1-6e79b806b9a7"),
    "local_port": uuid.UUID("0c1ba1af-5765-453f-af22-a8f791ac775b"),
    "flags": uuid.UUID("632ce23b-5167-435c-86d7-e903684aa80c"),  # FWPM_CONDITION_FLAGS: FWP_UINT32 bit set
}
#: FWP_CONDITION_FLAG_IS_LOOPBACK (fwptypes.h), offered at ALE_AUTH_CONNECT_V4/V6
#: (learn.microsoft.com/windows/win32/fwp/filtering-condition-flags-).
FLAG_IS_LOOPBACK = 0x00000001
IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_ICMPV6 = 1, 6, 58
#: Ports that are DNS whatever the policy says: never reachable, not even on loopback (the proxy
#: resolves names itself; a DNS port in the permit set would be a resolver the sandbox talks to).
DNS_PORTS: tuple[int, ...] = (53, 853)
#: Weights inside sandgate's sublayer (FWP_UINT8, 0-15): DNS block > permits > catch-all block.
W_DNS, W_PERMIT, W_TRANSPARENT, W_BLOCK = 15, 12, 8, 0


class WfpPlanError(ValueError):
    """A plan that would weaken the boundary (a DNS port as a proxy port, no ports, a bad SID)."""


@dataclass(frozen=True)
class Condition:
    field: FieldName
    value: str | int  # user: an SDDL security descriptor; remote_addr: an address; else a number
    #: FWP_MATCH_EQUAL, or (flags only) FWP_MATCH_FLAGS_NONE_SET: none of the value's bits is set
    match: Literal["equal", "none_set"] = "equal"


@dataclass(frozen=True)
class WfpFilter:
    key: uuid.UUID
    name: str
    layer: LayerName
    action: Literal["block", "permit"]
    weight: int
    conditions: tuple[Condition, ...]
    persistent: bool = True  # FWPM_FILTER_FLAG_PERSISTENT; False: lives in the adding session only
    # FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT (filter arbitration): a hard block is final; a hard permit
    # cannot be overridden by a lower sublayer's block (only by a callout veto).
    hard: bool = False

    @property
    def layer_key(self) -> uuid.UUID:
        return LAYERS[self.layer]


@dataclass(frozen=True)
class WfpPlan:
    provider_key: uuid.UUID
    sublayer_key: uuid.UUID
    # FWPM_SUBLAYER0.weight (UINT16): sublayers are evaluated from the highest; ours is the highest,
    # so no other product's hard permit is seen before our hard blocks.
    sublayer_weight: int
    filters: tuple[WfpFilter, ...]
    # The real user's SID: granted FWPM_ACTRL_READ on every filter (filter_sddl), so that its
    # non-elevated runs can check the filters (W2: BFE's default security gives Everyone only
    # OPEN and CLASSIFY); None only in plans that are shown, never installed.
    reader_sid: str | None = None


def derived_key(*parts: str) -> uuid.UUID:
    """A key that is the same on every run and machine for the same names (idempotent setup, exact removal)."""
    return uuid.uuid5(NAMESPACE, "/".join(parts))


def user_condition(sid: str) -> Condition:
    """FWPM_CONDITION_ALE_USER_ID takes a security descriptor; the engine checks it for
    FWP_ACTRL_MATCH_FILTER (0x1, "CC" in SDDL): granted to the sandbox SID = the condition is true."""
    if not sid.startswith("S-1-5-21-") or not all(p.isdigit() for p in sid[2:].split("-")):
        raise WfpPlanError(f"{sid!r} is not a local account SID (S-1-5-21-...): filters must name one user")
    return Condition("user", f"O:LSD:(A;;CC;;;{sid})")


def real_user_sid(sid: str) -> str:
    """The real user's SID, checked before it is spliced into SDDL (the read grant, the port guard):
    a local or domain account (S-1-5-21-...) or an Entra ID account (S-1-12-1-...: an AzureAD\\ user
    of a cloud-joined machine is not a local account, and must still be able to run), digits only."""
    if not sid.startswith(("S-1-5-21-", "S-1-12-1-")) or not all(p.isdigit() for p in sid[2:].split("-")):
        raise WfpPlanError(f"{sid!r} is not a user account SID (S-1-5-21-... or S-1-12-1-...)")
    return sid


def _filter(
    sid: str,
    layer: LayerName,
    name: str,
    action: Literal["block", "permit"],
    weight: int,
    *more: Condition,
    persistent: bool = True,
    hard: bool = False,
) -> WfpFilter:
    return WfpFilter(
        derived_key(sid, layer, name),
        f"sandgate {name}",
        layer,
        action,
        weight,
        (user_condition(sid), *more),
        persistent,
        hard,
    )


#: FWPM_ACTRL_READ (fwpmu.h): what FwpmFilterGetByKey0 needs on a filter; READ_CONTROL: reading its
#: security descriptor (FwpmFilterGetSecurityInfoByKey0), so a run can tell a filter without the grant.
FWPM_ACTRL_READ, READ_CONTROL = 0x00000080, 0x00020000
#: SDDL access-right tokens (the ones a converted WFP descriptor can show), for reading grants back.
_TOKENS = {"CC": 0x1, "DC": 0x2, "LC": 0x4, "SW": 0x8, "RP": 0x10, "WP": 0x20, "DT": 0x40, "LO": 0x80}
_TOKENS |= {"CR": 0x100, "SD": 0x10000, "RC": 0x20000, "WD": 0x40000, "WO": 0x80000, "GA": 0x10000000}


def filter_sddl(reader_sid: str) -> str:
    """The security descriptor every persistent filter is added with: administrators and SYSTEM keep
    full control (setup, remove), the real user may read it (its runs check the filters unelevated)
    and nothing else: neither the real user nor the sandbox user may change or delete it."""
    real_user_sid(reader_sid)  # one account SID, nothing spliced into the SDDL
    return f"O:BAD:(A;;GA;;;BA)(A;;GA;;;SY)(A;;0x{FWPM_ACTRL_READ | READ_CONTROL:x};;;{reader_sid})"


#: Account aliases the conversion writes for the local account domain's built-in accounts
#: (https://learn.microsoft.com/en-us/windows/win32/secauthz/sid-strings: "LA", DOMAIN_USER_RID_ADMIN;
#: "LG", DOMAIN_USER_RID_GUEST): a real user that IS the built-in Administrator (an Azure VM's admin
#: account) comes back as `LA`, never as its S-1-5-21-...-500 text.
_ACCOUNT_ALIASES = {"LA": "500", "LG": "501"}


def _same_trustee(trustee: str, sid: str) -> bool:
    if trustee.upper() == sid.upper():
        return True
    rid = _ACCOUNT_ALIASES.get(trustee.upper())
    return rid is not None and sid.startswith("S-1-5-21-") and sid.rsplit("-", 1)[-1] == rid


def grants_read(sddl: str, sid: str) -> bool:
    """Whether a filter's descriptor (as ConvertSecurityDescriptorToStringSecurityDescriptorW
    writes it: hex or tokens, the trustee as SID text or alias) has an allow ACE for `sid` with
    FWPM_ACTRL_READ (or GENERIC_ALL)."""
    for rights, trustee in re.findall(r"\(A;[^;]*;([^;]*);[^;]*;[^;]*;([^)]*)\)", sddl):
        if not _same_trustee(trustee, sid):
            continue
        if rights.lower().startswith("0x"):
            mask = int(rights, 16)
        else:
            mask = sum(_TOKENS.get(rights[i : i + 2], 0) for i in range(0, len(rights), 2))
        if mask & (FWPM_ACTRL_READ | _TOKENS["GA"]):
            return True
    return False


def plan_filters(sid: str, proxy_ports: tuple[int, ...], owner: str | None = None) -> WfpPlan:
    """The persistent set for one sandbox user: only loopback to the proxy's ports, nothing else;
    no listening, nothing accepted. `owner` (the real user's SID) adds the proxy-port guard
    (_port_guard) and is granted read access to the filters."""
    ports = tuple(sorted(set(proxy_ports)))
    if not ports:
        raise WfpPlanError("no proxy ports: the sandbox user would have no network at all (say so instead)")
    if any(p in DNS_PORTS or not 0 < p < 65536 for p in ports):
        raise WfpPlanError(f"proxy ports {ports}: DNS ports {DNS_PORTS} and out-of-range ports cannot be permitted")
    out = _connect_filters(sid, ports) + _inbound_filters(sid)
    if owner is not None:
        out += _port_guard(sid, owner, ports)
    return WfpPlan(derived_key(sid, "provider"), derived_key(sid, "sublayer"), 0xFFFF, tuple(out), owner)


def _connect_filters(sid: str, ports: tuple[int, ...]) -> list[WfpFilter]:
    out: list[WfpFilter] = []
    for fam, loop in (("V4", "127.0.0.1"), ("V6", "::1")):
        connect: LayerName = "ALE_AUTH_CONNECT_V4" if fam == "V4" else "ALE_AUTH_CONNECT_V6"
        assign: LayerName = "ALE_RESOURCE_ASSIGNMENT_V4" if fam == "V4" else "ALE_RESOURCE_ASSIGNMENT_V6"
        for port in DNS_PORTS:  # DNS exfiltration through any resolver, loopback included
            out.append(
                _filter(
                    sid, connect, f"block dns {port} {fam}", "block", W_DNS, Condition("remote_port", port), hard=True
                )
            )
        for port in ports:  # the one way out: TCP to the proxy on loopback
            out.append(
                _filter(
                    sid,
                    connect,
                    f"permit proxy {port} {fam}",
                    "permit",
                    W_PERMIT,
                    Condition("protocol", IPPROTO_TCP),
                    Condition("remote_addr", loop),
                    Condition("remote_port", port),
                )
            )
        out.append(
            _filter(sid, connect, f"block all {fam}", "block", W_BLOCK, hard=True)
        )  # direct IP, UDP, other ports
        icmp = IPPROTO_ICMP if fam == "V4" else IPPROTO_ICMPV6  # ICMP sockets send without a connect
        out.append(_filter(sid, assign, f"block icmp {fam}", "block", W_BLOCK, Condition("protocol", icmp), hard=True))
    return out


def _inbound_filters(sid: str) -> list[WfpFilter]:
    """H5: nothing listens or accepts as the sandbox user (a listener reachable from the network or
    from another local user would be a way in and, answered, a way out). Hard blocks at
    ALE_AUTH_LISTEN (listen()) and ALE_AUTH_RECV_ACCEPT (an incoming connection or first datagram
    to one of its sockets); replies to its own connects are not classified there."""
    layers: tuple[LayerName, ...] = (
        "ALE_AUTH_LISTEN_V4",
        "ALE_AUTH_LISTEN_V6",
        "ALE_AUTH_RECV_ACCEPT_V4",
        "ALE_AUTH_RECV_ACCEPT_V6",
    )
    return [_filter(sid, layer, f"block inbound {layer[9:]}", "block", W_BLOCK, hard=True) for layer in layers]


def _port_guard(sid: str, owner: str, ports: tuple[int, ...]) -> list[WfpFilter]:
    """H6: the sandbox user's one way out is loopback TCP to the proxy's ports, whoever listens
    there. So a loopback connection to those ports is accepted only by a socket of the real user
    (the proxy child runs as it): a hard block at ALE_AUTH_RECV_ACCEPT whose ALE_USER_ID (the
    listener's token) is anyone else (deny ACE for the owner before Everyone's allow). Another user's
    service on 127.0.0.1:3128 then cannot become the way out when no policy (no proxy) is bound."""
    real_user_sid(owner)
    anyone_else = Condition("user", f"O:LSD:(D;;CC;;;{owner})(A;;CC;;;WD)")
    out: list[WfpFilter] = []
    for fam, loop in (("V4", "127.0.0.1"), ("V6", "::1")):
        layer: LayerName = "ALE_AUTH_RECV_ACCEPT_V4" if fam == "V4" else "ALE_AUTH_RECV_ACCEPT_V6"
        for port in ports:
            out.append(
                WfpFilter(
                    derived_key(sid, layer, f"guard proxy {port} {fam}"),
                    f"sandgate guard proxy {port} {fam}",
                    layer,
                    "block",
                    W_DNS,
                    (anyone_else, Condition("remote_addr", loop), Condition("local_port", port)),
                    hard=True,
                )
            )
    return out


def transparent_permits(sid: str) -> tuple[WfpFilter, ...]:
    """Optional transparent capture: the sandbox user's TCP connects may start, so that the
    redirect loop can reflect their SYNs into the proxy. Threat: the loop dies and the flows go
    out directly (WinDivert fails open). So these are NOT persistent: they live in the loop's own
    dynamic WFP session (FWPM_SESSION_FLAG_DYNAMIC) and vanish with its process; the persistent
    block then applies again. They are hard permits: the firewall's off-host block for the SID sits
    in a lower sublayer and would otherwise win, so in this mode the loop (reflect or drop), not
    the firewall, is TCP's second line. DNS stays blocked above them (W_DNS > W_TRANSPARENT), and
    loopback is excluded (FWP_CONDITION_FLAG_IS_LOOPBACK none set): there the persistent set decides."""
    return tuple(
        _filter(
            sid,
            layer,
            f"transparent tcp {layer[-2:]}",
            "permit",
            W_TRANSPARENT,
            Condition("protocol", IPPROTO_TCP),
            # Never loopback: this hard permit outweighs `block all`, the only filter keeping the
            # sandbox user off every loopback port but the proxy's, and loopback is never diverted
            # (divertfilter): without this, every local service would be reachable, unaudited (r4 T1).
            Condition("flags", FLAG_IS_LOOPBACK, "none_set"),
            persistent=False,
            hard=True,  # else the firewall's off-host block (a lower sublayer) would still win
        )
        for layer in ("ALE_AUTH_CONNECT_V4", "ALE_AUTH_CONNECT_V6")
    )

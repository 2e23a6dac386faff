"""The WFP plan in the API's own terms (fwptypes.h / fwpmtypes.h numbers), purely: what each
filter's flags, action, weight and condition values become before win32wfp.py lays them out.

Why apart from the layout: every number here decides what the kernel enforces (a wrong action
type permits what was meant to be blocked), so it is unit-tested on Linux; the ctypes structures
can only be checked on Windows.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from netguard.windows import wfp

# FWP_DATA_TYPE (fwptypes.h)
FWP_UINT8, FWP_UINT16, FWP_UINT32 = 1, 2, 3
FWP_BYTE_ARRAY16_TYPE = 11
FWP_SECURITY_DESCRIPTOR_TYPE = 14
# FWP_MATCH_TYPE (fwptypes.h)
FWP_MATCH_EQUAL, FWP_MATCH_FLAGS_NONE_SET = 0, 8
MATCH_TYPES = {"equal": FWP_MATCH_EQUAL, "none_set": FWP_MATCH_FLAGS_NONE_SET}
# FWP_ACTION_TYPE: the type | FWP_ACTION_FLAG_TERMINATING
FWP_ACTION_FLAG_TERMINATING = 0x00001000
FWP_ACTION_BLOCK = 0x00000001 | FWP_ACTION_FLAG_TERMINATING
FWP_ACTION_PERMIT = 0x00000002 | FWP_ACTION_FLAG_TERMINATING
# FWPM_FILTER0.flags, FWPM_SUBLAYER0.flags, FWPM_PROVIDER0.flags, FWPM_SESSION0.flags
FWPM_FILTER_FLAG_PERSISTENT = 0x00000001
FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT = 0x00000008
FWPM_SUBLAYER_FLAG_PERSISTENT = 0x00000001
FWPM_PROVIDER_FLAG_PERSISTENT = 0x00000001
FWPM_SESSION_FLAG_DYNAMIC = 0x00000001


@dataclass(frozen=True)
class WireCondition:
    field_key: str  # the FWPM_CONDITION_* GUID, as text
    data_type: int
    value: int | bytes | str  # UINT8/16/32: int; BYTE_ARRAY16: 16 bytes; SECURITY_DESCRIPTOR: SDDL
    match_type: int = FWP_MATCH_EQUAL  # FWPM_FILTER_CONDITION0.matchType


@dataclass(frozen=True)
class WireFilter:
    key: str
    name: str
    layer_key: str
    flags: int
    action: int
    weight: int  # FWP_UINT8 weight range (0-15)
    conditions: tuple[WireCondition, ...]
    sddl: str | None = None  # FwpmFilterAdd0's sd: who may read/delete the filter (None: inherited)


def condition(c: wfp.Condition) -> WireCondition:
    key = str(wfp.FIELDS[c.field])
    if c.field == "flags":  # FWPM_CONDITION_FLAGS is FWP_UINT32, matched by bits
        return WireCondition(key, FWP_UINT32, int(c.value), MATCH_TYPES[c.match])
    if c.match != "equal":
        raise wfp.WfpPlanError(f"{c.field}: only flags are matched by bits")
    if c.field == "user":
        return WireCondition(key, FWP_SECURITY_DESCRIPTOR_TYPE, str(c.value))
    if c.field == "protocol":
        return WireCondition(key, FWP_UINT8, int(c.value))
    if c.field in ("remote_port", "local_port"):
        return WireCondition(key, FWP_UINT16, int(c.value))
    ip = ipaddress.ip_address(str(c.value))
    if ip.version == 4:  # FWP_UINT32 in host order: the integer value of the address
        return WireCondition(key, FWP_UINT32, int(ip))
    return WireCondition(key, FWP_BYTE_ARRAY16_TYPE, ip.packed)


def wire(f: wfp.WfpFilter, reader_sid: str | None = None) -> WireFilter:
    """One filter in the API's numbers; a persistent one carries the plan's security descriptor
    (wfp.filter_sddl: the real user may read it, W2), a dynamic one its session's default."""
    flags = (FWPM_FILTER_FLAG_PERSISTENT if f.persistent else 0) | (
        FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT if f.hard else 0
    )
    if not 0 <= f.weight <= 15:
        raise wfp.WfpPlanError(f"{f.name}: weight {f.weight} is outside the FWP_UINT8 range 0-15")
    action = FWP_ACTION_BLOCK if f.action == "block" else FWP_ACTION_PERMIT
    sddl = wfp.filter_sddl(reader_sid) if reader_sid is not None and f.persistent else None
    return WireFilter(
        str(f.key), f.name, str(f.layer_key), flags, action, f.weight, tuple(condition(c) for c in f.conditions), sddl
    )

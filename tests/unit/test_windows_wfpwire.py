"""The WFP plan in the API's numbers (wfpwire.py), and the FWPM structures' 64-bit layout."""

from __future__ import annotations

import ctypes
import uuid

import pytest

from netguard.windows import wfp, wfpwire, win32wfp

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"


def _wired() -> dict[str, wfpwire.WireFilter]:
    return {f.name: wfpwire.wire(f) for f in wfp.plan_filters(SID, (3128,)).filters}


def test_actions_flags_and_weights() -> None:
    w = _wired()
    block, permit = w["sandgate block all V4"], w["sandgate permit proxy 3128 V4"]
    assert block.action == 0x1001 and permit.action == 0x1002  # BLOCK / PERMIT, terminating
    assert block.flags == 0x1 | 0x8  # persistent + clear action right (hard)
    assert permit.flags == 0x1  # persistent, soft
    (dyn,) = [wfpwire.wire(f) for f in wfp.transparent_permits(SID) if f.layer.endswith("V4")]
    assert dyn.flags == 0x8 and dyn.action == 0x1002  # not persistent: lives in the dynamic session


def test_condition_values() -> None:
    v4, v6 = _wired()["sandgate permit proxy 3128 V4"], _wired()["sandgate permit proxy 3128 V6"]
    by_key = {c.field_key: c for c in v4.conditions}
    assert by_key[str(wfp.FIELDS["remote_addr"])] == wfpwire.WireCondition(
        str(wfp.FIELDS["remote_addr"]), wfpwire.FWP_UINT32, 0x7F000001
    )
    assert by_key[str(wfp.FIELDS["remote_port"])].data_type == wfpwire.FWP_UINT16
    assert by_key[str(wfp.FIELDS["protocol"])] == wfpwire.WireCondition(
        str(wfp.FIELDS["protocol"]), wfpwire.FWP_UINT8, 6
    )
    assert by_key[str(wfp.FIELDS["user"])].data_type == wfpwire.FWP_SECURITY_DESCRIPTOR_TYPE
    addr6 = next(c for c in v6.conditions if c.field_key == str(wfp.FIELDS["remote_addr"]))
    assert addr6.data_type == wfpwire.FWP_BYTE_ARRAY16_TYPE and addr6.value == b"\0" * 15 + b"\1"


def test_weights_outside_the_uint8_range_are_refused() -> None:
    f = wfp.plan_filters(SID, (3128,)).filters[0]
    with pytest.raises(wfp.WfpPlanError):
        wfpwire.wire(wfp.WfpFilter(f.key, f.name, f.layer, f.action, 16, f.conditions))


def test_guid_layout_is_windows_byte_order() -> None:
    u = uuid.UUID("c38d57d1-05a7-4c33-904f-7fbceee60e82")
    g = win32wfp.GUID.of(u)
    assert (g.Data1, g.Data2, g.Data3, bytes(g.Data4)) == (
        0xC38D57D1,
        0x05A7,
        0x4C33,
        bytes.fromhex("904f7fbceee60e82"),
    )
    assert bytes(g) == u.bytes_le


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="layouts are those of 64-bit Windows")
def test_structure_sizes_follow_the_headers_field_order() -> None:
    # Computed from fwptypes.h / fwpmtypes.h field by field for x64 (the union after the action is
    # 8-byte aligned); Windows CI is where they meet the real headers.
    assert ctypes.sizeof(win32wfp.GUID) == 16
    assert ctypes.sizeof(win32wfp.FWP_VALUE0) == 16
    assert ctypes.sizeof(win32wfp.FWPM_FILTER_CONDITION0) == 40
    assert ctypes.sizeof(win32wfp.FWPM_ACTION0) == 20
    assert ctypes.sizeof(win32wfp.FWPM_FILTER0) == 200
    assert win32wfp.FWPM_FILTER0.context.offset == 152  # after the 20-byte action, padded to 8
    assert win32wfp.FWPM_FILTER0.filterId.offset == 176
    assert ctypes.sizeof(win32wfp.FWPM_SESSION0) == 72


def test_persistent_filters_carry_the_read_grant_and_local_ports_are_uint16() -> None:
    real = "S-1-5-21-1111111111-2222222222-3333333333-1000"
    plan = wfp.plan_filters(SID, (3128,), owner=real)
    for f in plan.filters:
        assert wfpwire.wire(f, plan.reader_sid).sddl == wfp.filter_sddl(real)  # W2
    dyn = wfpwire.wire(wfp.transparent_permits(SID)[0], real)
    assert dyn.sddl is None  # a dynamic filter keeps its session's default
    guard = next(f for f in plan.filters if f.name == "sandgate guard proxy 3128 V4")
    local = [c for c in wfpwire.wire(guard).conditions if c.field_key == str(wfp.FIELDS["local_port"])]
    assert local == [wfpwire.WireCondition(str(wfp.FIELDS["local_port"]), wfpwire.FWP_UINT16, 3128)]

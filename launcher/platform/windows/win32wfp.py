"""The WFP half of the Win32 calls: FWPM structures laid out with ctypes, filled from wfpwire.py.

Apart from win32.py only for the 400-line limit: same rules (no decision here, nothing runs at
import, each call listed in win32.CALLS with its documentation page). Layouts follow fwptypes.h
and fwpmtypes.h for 64-bit Windows; they are checked nowhere until .github/workflows/windows.yml
runs `sandgate setup` (issue 14).
"""

from __future__ import annotations

import ctypes
import uuid
from ctypes import POINTER, Structure, Union, c_int32, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p, c_wchar_p
from typing import Any

from launcher.platform.windows import wfp, wfpwire
from launcher.platform.windows.win32 import Win32Error, fn

RPC_C_AUTHN_DEFAULT = 0xFFFFFFFF


class GUID(Structure):
    _fields_ = [("Data1", c_uint32), ("Data2", c_uint16), ("Data3", c_uint16), ("Data4", c_uint8 * 8)]

    @classmethod
    def of(cls, u: uuid.UUID | str) -> GUID:
        return cls.from_buffer_copy(uuid.UUID(str(u)).bytes_le)  # Data1-3 little-endian, as Windows lays them


class FWPM_DISPLAY_DATA0(Structure):
    _fields_ = [("name", c_wchar_p), ("description", c_wchar_p)]


class FWP_BYTE_BLOB(Structure):
    _fields_ = [("size", c_uint32), ("data", POINTER(c_uint8))]


class _Value(Union):
    _fields_ = [("uint8", c_uint8), ("uint16", c_uint16), ("uint32", c_uint32), ("pointer", c_void_p)]


class FWP_VALUE0(Structure):  # also FWP_CONDITION_VALUE0: a type and an 8-byte union
    _fields_ = [("type", c_int32), ("u", _Value)]


class FWPM_FILTER_CONDITION0(Structure):
    _fields_ = [("fieldKey", GUID), ("matchType", c_int32), ("conditionValue", FWP_VALUE0)]


class FWPM_ACTION0(Structure):
    _fields_ = [("type", c_uint32), ("filterType", GUID)]


class _Context(Union):  # rawContext (UINT64) or providerContextKey: 8-byte aligned, as in fwpmtypes.h
    _fields_ = [("rawContext", c_uint64), ("providerContextKey", GUID)]


class FWPM_FILTER0(Structure):
    _fields_ = [
        ("filterKey", GUID),
        ("displayData", FWPM_DISPLAY_DATA0),
        ("flags", c_uint32),
        ("providerKey", POINTER(GUID)),
        ("providerData", FWP_BYTE_BLOB),
        ("layerKey", GUID),
        ("subLayerKey", GUID),
        ("weight", FWP_VALUE0),
        ("numFilterConditions", c_uint32),
        ("filterCondition", POINTER(FWPM_FILTER_CONDITION0)),
        ("action", FWPM_ACTION0),
        ("context", _Context),
        ("reserved", POINTER(GUID)),
        ("filterId", c_uint64),
        ("effectiveWeight", FWP_VALUE0),
    ]


class FWPM_SUBLAYER0(Structure):
    _fields_ = [
        ("subLayerKey", GUID),
        ("displayData", FWPM_DISPLAY_DATA0),
        ("flags", c_uint32),
        ("providerKey", POINTER(GUID)),
        ("providerData", FWP_BYTE_BLOB),
        ("weight", c_uint16),
    ]


class FWPM_PROVIDER0(Structure):
    _fields_ = [
        ("providerKey", GUID),
        ("displayData", FWPM_DISPLAY_DATA0),
        ("flags", c_uint32),
        ("providerData", FWP_BYTE_BLOB),
        ("serviceName", c_wchar_p),
    ]


class FWPM_SESSION0(Structure):
    _fields_ = [
        ("sessionKey", GUID),
        ("displayData", FWPM_DISPLAY_DATA0),
        ("flags", c_uint32),
        ("txnWaitTimeoutInMSec", c_uint32),
        ("processId", c_uint32),
        ("sid", c_void_p),
        ("username", c_wchar_p),
        ("kernelMode", c_int32),
    ]


def _ok(name: str, err: int) -> None:
    if err:
        raise Win32Error(err, f"{name} failed (0x{err & 0xFFFFFFFF:08x})")


def open_engine(*, dynamic: bool) -> int:
    """A BFE session; dynamic: every filter it adds is removed when it closes or its process dies."""
    session = FWPM_SESSION0()
    session.flags = wfpwire.FWPM_SESSION_FLAG_DYNAMIC if dynamic else 0
    engine = c_void_p()
    _ok(
        "FwpmEngineOpen0",
        fn("FwpmEngineOpen0")(None, RPC_C_AUTHN_DEFAULT, None, ctypes.byref(session), ctypes.byref(engine)),
    )
    return int(engine.value or 0)


def _condition(c: wfpwire.WireCondition, keep: list[Any]) -> FWPM_FILTER_CONDITION0:
    """One condition; `keep` holds the buffers its pointers name until the call returns."""
    out = FWPM_FILTER_CONDITION0(GUID.of(c.field_key), wfpwire.FWP_MATCH_EQUAL)
    out.conditionValue.type = c.data_type
    if c.data_type == wfpwire.FWP_SECURITY_DESCRIPTOR_TYPE:
        sd, size = c_void_p(), c_uint32()
        ok = fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(
            str(c.value), 1, ctypes.byref(sd), ctypes.byref(size)
        )
        if not ok:
            raise Win32Error(ctypes.get_last_error() if hasattr(ctypes, "get_last_error") else 0, "bad SD")
        blob = FWP_BYTE_BLOB(size.value, ctypes.cast(sd, POINTER(c_uint8)))
        keep += [sd, blob]
        out.conditionValue.u.pointer = ctypes.cast(ctypes.pointer(blob), c_void_p)
    elif c.data_type == wfpwire.FWP_BYTE_ARRAY16_TYPE:
        arr = (c_uint8 * 16).from_buffer_copy(bytes(c.value))  # type: ignore[arg-type]
        keep.append(arr)
        out.conditionValue.u.pointer = ctypes.cast(arr, c_void_p)
    elif c.data_type == wfpwire.FWP_UINT8:
        out.conditionValue.u.uint8 = int(c.value)
    elif c.data_type == wfpwire.FWP_UINT16:
        out.conditionValue.u.uint16 = int(c.value)
    else:
        out.conditionValue.u.uint32 = int(c.value)
    return out


def add_filter(engine: int, f: wfpwire.WireFilter, provider: uuid.UUID, sublayer: uuid.UUID) -> None:
    keep: list[Any] = []
    conds = (FWPM_FILTER_CONDITION0 * len(f.conditions))(*(_condition(c, keep) for c in f.conditions))
    flt = FWPM_FILTER0()
    flt.filterKey, flt.layerKey, flt.subLayerKey = GUID.of(f.key), GUID.of(f.layer_key), GUID.of(sublayer)
    flt.displayData = FWPM_DISPLAY_DATA0(f.name, "sandgate sandbox user boundary (issue 14)")
    flt.flags, flt.providerKey = f.flags, ctypes.pointer(GUID.of(provider))
    flt.weight.type, flt.weight.u.uint8 = wfpwire.FWP_UINT8, f.weight
    flt.numFilterConditions, flt.filterCondition = len(f.conditions), conds
    flt.action.type = f.action
    _ok("FwpmFilterAdd0", fn("FwpmFilterAdd0")(engine, ctypes.byref(flt), None, None))
    for item in keep:
        if isinstance(item, c_void_p):
            fn("LocalFree")(item)


def install(plan: wfp.WfpPlan) -> None:
    """`sandgate setup`: provider, sublayer and every filter, in one transaction (all or nothing)."""
    engine = open_engine(dynamic=False)
    try:
        _ok("FwpmTransactionBegin0", fn("FwpmTransactionBegin0")(engine, 0))
        try:
            prov = FWPM_PROVIDER0(
                GUID.of(plan.provider_key), FWPM_DISPLAY_DATA0("sandgate", None), wfpwire.FWPM_PROVIDER_FLAG_PERSISTENT
            )
            _ok("FwpmProviderAdd0", fn("FwpmProviderAdd0")(engine, ctypes.byref(prov), None))
            sub = FWPM_SUBLAYER0(
                GUID.of(plan.sublayer_key), FWPM_DISPLAY_DATA0("sandgate", None), wfpwire.FWPM_SUBLAYER_FLAG_PERSISTENT
            )
            sub.providerKey, sub.weight = ctypes.pointer(GUID.of(plan.provider_key)), plan.sublayer_weight
            _ok("FwpmSubLayerAdd0", fn("FwpmSubLayerAdd0")(engine, ctypes.byref(sub), None))
            for f in plan.filters:
                add_filter(engine, wfpwire.wire(f), plan.provider_key, plan.sublayer_key)
            _ok("FwpmTransactionCommit0", fn("FwpmTransactionCommit0")(engine))
        except BaseException:
            fn("FwpmTransactionAbort0")(engine)
            raise
    finally:
        fn("FwpmEngineClose0")(engine)


def remove(plan: wfp.WfpPlan) -> None:
    """`sandgate setup --remove`: the derived keys find exactly what install added (missing is fine)."""
    engine = open_engine(dynamic=False)
    try:
        for f in plan.filters:
            fn("FwpmFilterDeleteByKey0")(engine, ctypes.byref(GUID.of(f.key)))
        fn("FwpmSubLayerDeleteByKey0")(engine, ctypes.byref(GUID.of(plan.sublayer_key)))
        fn("FwpmProviderDeleteByKey0")(engine, ctypes.byref(GUID.of(plan.provider_key)))
    finally:
        fn("FwpmEngineClose0")(engine)


def open_dynamic(plan: wfp.WfpPlan, filters: tuple[wfp.WfpFilter, ...]) -> int:
    """The redirect loop's session with its transparent permits (wfp.transparent_permits): the
    caller keeps the handle open for as long as the loop runs; closing it, or the process dying,
    removes the permits and the persistent block applies again (fail closed)."""
    if any(f.persistent for f in filters):
        raise wfp.WfpPlanError("only non-persistent filters belong in the dynamic session")
    engine = open_engine(dynamic=True)
    try:
        for f in filters:
            add_filter(engine, wfpwire.wire(f), plan.provider_key, plan.sublayer_key)
    except BaseException:
        fn("FwpmEngineClose0")(engine)
        raise
    return engine


def installed(plan: wfp.WfpPlan) -> bool:
    """Every persistent filter of the plan is in the engine (FwpmFilterGetByKey0 finds its key)."""
    engine = open_engine(dynamic=False)
    try:
        for f in plan.filters:
            found = c_void_p()
            if fn("FwpmFilterGetByKey0")(engine, ctypes.byref(GUID.of(f.key)), ctypes.byref(found)):
                return False
            fn("FwpmFreeMemory0")(ctypes.byref(found))
        return True
    finally:
        fn("FwpmEngineClose0")(engine)

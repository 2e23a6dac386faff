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

from netguard.windows import wfp, wfpwire
from sgbase.windows.win32 import Win32Error, fn

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


# WFP error codes (winerror.h, https://learn.microsoft.com/en-us/windows/win32/fwp/wfp-error-codes)
FWP_E_FILTER_NOT_FOUND, FWP_E_PROVIDER_NOT_FOUND, FWP_E_SUBLAYER_NOT_FOUND = 0x80320003, 0x80320005, 0x80320007
FWP_E_ALREADY_EXISTS, FWP_E_IN_USE = 0x80320009, 0x8032000A
ERROR_ACCESS_DENIED = 5
DACL_SECURITY_INFORMATION = 0x4
NOT_FOUND = {
    "FwpmFilterDeleteByKey0": FWP_E_FILTER_NOT_FOUND,
    "FwpmSubLayerDeleteByKey0": FWP_E_SUBLAYER_NOT_FOUND,
    "FwpmProviderDeleteByKey0": FWP_E_PROVIDER_NOT_FOUND,
}


def _ok(name: str, err: int) -> None:
    if err:
        raise Win32Error(err, f"{name} failed (0x{err & 0xFFFFFFFF:08x})")


def denied(err: int) -> bool:
    """ERROR_ACCESS_DENIED, as a Win32 code or as the HRESULT BFE's RPC layer may return."""
    return err & 0xFFFFFFFF in (ERROR_ACCESS_DENIED, 0x80070005)


def _sd(sddl: str, keep: list[Any]) -> c_void_p:
    """A self-relative security descriptor from SDDL (LocalAlloc'd: `keep` gets it, the caller frees)."""
    sd, size = c_void_p(), c_uint32()
    if not fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(sddl, 1, ctypes.byref(sd), ctypes.byref(size)):
        raise Win32Error(ctypes.get_last_error() if hasattr(ctypes, "get_last_error") else 0, "bad SD")
    keep += [sd, size]
    return sd


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
    out = FWPM_FILTER_CONDITION0(GUID.of(c.field_key), c.match_type)
    out.conditionValue.type = c.data_type
    if c.data_type == wfpwire.FWP_SECURITY_DESCRIPTOR_TYPE:
        sd = _sd(str(c.value), keep)
        blob = FWP_BYTE_BLOB(keep[-1].value, ctypes.cast(sd, POINTER(c_uint8)))
        keep.append(blob)
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
    """One FwpmFilterAdd0, with the filter's own security descriptor (wfpwire: the real user may read
    it, W2). Every descriptor made for it is freed whether the add succeeds or not (M8)."""
    keep: list[Any] = []
    try:
        conds = (FWPM_FILTER_CONDITION0 * len(f.conditions))(*(_condition(c, keep) for c in f.conditions))
        flt = FWPM_FILTER0()
        flt.filterKey, flt.layerKey, flt.subLayerKey = GUID.of(f.key), GUID.of(f.layer_key), GUID.of(sublayer)
        flt.displayData = FWPM_DISPLAY_DATA0(f.name, "sandgate sandbox user boundary (issue 14)")
        flt.flags, flt.providerKey = f.flags, ctypes.pointer(GUID.of(provider))
        flt.weight.type, flt.weight.u.uint8 = wfpwire.FWP_UINT8, f.weight
        flt.numFilterConditions, flt.filterCondition = len(f.conditions), conds
        flt.action.type = f.action
        own = _sd(f.sddl, keep) if f.sddl is not None else None
        _ok("FwpmFilterAdd0", fn("FwpmFilterAdd0")(engine, ctypes.byref(flt), own, None))
    finally:
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
                add_filter(engine, wfpwire.wire(f, plan.reader_sid), plan.provider_key, plan.sublayer_key)
            _ok("FwpmTransactionCommit0", fn("FwpmTransactionCommit0")(engine))
        except BaseException:
            fn("FwpmTransactionAbort0")(engine)
            raise
    finally:
        fn("FwpmEngineClose0")(engine)


def _delete(name: str, engine: int, key: uuid.UUID) -> None:
    """One delete by key: gone or never there is fine; anything else (access denied, in use) is an
    error, so that setup never reports a removal that left filters behind (M7: the next setup's
    transaction would fail with FWP_E_ALREADY_EXISTS)."""
    err = int(fn(name)(engine, ctypes.byref(GUID.of(key)))) & 0xFFFFFFFF
    if err and err != NOT_FOUND[name]:
        _ok(name, err)


def remove(plan: wfp.WfpPlan) -> None:
    """`sandgate setup --remove`: the derived keys find exactly what install added (missing is fine)."""
    engine = open_engine(dynamic=False)
    try:
        for f in plan.filters:
            _delete("FwpmFilterDeleteByKey0", engine, f.key)
        _delete("FwpmSubLayerDeleteByKey0", engine, plan.sublayer_key)
        _delete("FwpmProviderDeleteByKey0", engine, plan.provider_key)
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


class ReadDenied(Win32Error):
    """FwpmFilterGetByKey0 refused for want of FWPM_ACTRL_READ: the filters may well be there."""


def installed(plan: wfp.WfpPlan) -> bool:
    """Every persistent filter of the plan is in the engine (FwpmFilterGetByKey0 finds its key).
    Only FWP_E_FILTER_NOT_FOUND means missing; access denied (a setup that did not grant this user
    FWPM_ACTRL_READ, W2) and any other error raise, never pass for "not installed"."""
    engine = open_engine(dynamic=False)
    try:
        for f in plan.filters:
            found = c_void_p()
            err = int(fn("FwpmFilterGetByKey0")(engine, ctypes.byref(GUID.of(f.key)), ctypes.byref(found)))
            err &= 0xFFFFFFFF
            if err == FWP_E_FILTER_NOT_FOUND:
                return False
            if denied(err):
                raise ReadDenied(err, "this user may not read sandgate's WFP filters (FWPM_ACTRL_READ)")
            _ok("FwpmFilterGetByKey0", err)
            fn("FwpmFreeMemory0")(ctypes.byref(found))  # void (M1): nothing to check
            if plan.reader_sid is not None and not wfp.grants_read(_sddl_of(engine, f.key), plan.reader_sid):
                return False  # an older setup's filter, unreadable unelevated: setup re-installs it
        return True

    finally:
        fn("FwpmEngineClose0")(engine)


def _sddl_of(engine: int, key: uuid.UUID) -> str:
    """A filter's DACL as SDDL (READ_CONTROL on it: setup's grant gives the real user that too)."""
    sd, text, size = c_void_p(), c_wchar_p(), c_uint32()
    nothing = [c_void_p() for _ in range(4)]
    err = int(
        fn("FwpmFilterGetSecurityInfoByKey0")(
            engine, ctypes.byref(GUID.of(key)), DACL_SECURITY_INFORMATION, *map(ctypes.byref, nothing), ctypes.byref(sd)
        )
    )
    if denied(err):
        raise ReadDenied(err, "this user may not read sandgate's WFP filters (READ_CONTROL)")
    _ok("FwpmFilterGetSecurityInfoByKey0", err)
    try:
        conv = fn("ConvertSecurityDescriptorToStringSecurityDescriptorW")
        if not conv(sd, 1, DACL_SECURITY_INFORMATION, ctypes.byref(text), ctypes.byref(size)):
            raise Win32Error(getattr(ctypes, "get_last_error", lambda: 0)(), "cannot read a filter's security")
        try:
            return text.value or ""
        finally:
            fn("LocalFree")(ctypes.cast(text, c_void_p))
    finally:
        fn("FwpmFreeMemory0")(ctypes.byref(sd))


def close_dynamic(engine: int) -> None:
    """End the redirect loop's session: BFE deletes every filter it added (the transparent permits)."""
    _ok("FwpmEngineClose0", fn("FwpmEngineClose0")(engine))

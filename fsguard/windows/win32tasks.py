r"""Task Scheduler 2.0 (`Schedule.Service`, taskschd.dll) through its COM vtables, for the sweep.

Only calls: which task is the sandbox user's is sweep.py's decision. Run on a thread that
impersonates the sandbox user (win32sweep.as_user): ITaskService::Connect with no user "uses the
current token", and the service then shows only tasks that user may read and deletes only what it
may delete ([MS-TSCH] SchRpcEnumTasks, SchRpcDelete). In-process, not PowerShell's ScheduledTasks
module: that goes through WMI, which setup denies the sandbox user (servicedeny.py).

Every method is called by its vtable slot from METHODS (one record per method, also what
tests/support/winsdk.py checks against mingw-w64's taskschd.h C vtables: slot offset, arity, each
argument's size and kind). Collections are 1-based (VT_I4 index).
https://learn.microsoft.com/en-us/windows/win32/api/taskschd/nn-taskschd-itaskservice
https://learn.microsoft.com/en-us/windows/win32/api/taskschd/nf-taskschd-itaskfolder-gettasks
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from ctypes import POINTER, Structure, c_int32, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any

from sgbase.windows.win32 import Win32Error, account_sid, fn

COINIT_MULTITHREADED, CLSCTX_INPROC_SERVER = 0x0, 0x1
TASK_ENUM_HIDDEN = 0x1
OWNER_SECURITY_INFORMATION = 0x1
VT_I4 = 3
E_ACCESSDENIED = 0x80070005
HRESULT, LONG, BSTR, OUT = c_int32, c_int32, c_void_p, POINTER(c_void_p)


class GUID(Structure):
    _fields_ = [("Data1", c_uint32), ("Data2", c_uint16), ("Data3", c_uint16), ("Data4", c_uint8 * 8)]


class VARIANT(Structure):
    """oaidl.h's VARIANT on x64 (24 bytes): the type tag, then the value union (llVal, the record pair)."""

    _fields_ = [
        ("vt", c_uint16),
        ("wReserved1", c_uint16),
        ("wReserved2", c_uint16),
        ("wReserved3", c_uint16),
        ("llVal", c_uint64),
        ("pRecInfo", c_void_p),
    ]


def _guid(d1: int, d2: int, d3: int, tail: bytes) -> GUID:
    return GUID(d1, d2, d3, (c_uint8 * 8)(*tail))


CLSID_TASK_SCHEDULER = _guid(0x0F87369F, 0xA4E5, 0x4CFC, bytes.fromhex("bd3e73e6154572dd"))
IID_TASK_SERVICE = _guid(0x2FABA4C7, 0x4DA9, 0x4013, bytes.fromhex("969720cc3fd40f85"))


@dataclass(frozen=True)
class Method:
    iface: str  # the interface, as taskschd.h names it (its C vtable: <iface>Vtbl)
    name: str
    slot: int  # index in the vtable (IUnknown 0-2, IDispatch 3-6)
    argtypes: tuple[Any, ...]  # after `this`
    restype: Any = HRESULT


METHODS: tuple[Method, ...] = (
    *(Method(i, "Release", 2, (), c_uint32) for i in ("ITaskService", "ITaskFolder", "IRegisteredTask")),
    *(Method(i, "Release", 2, (), c_uint32) for i in ("ITaskFolderCollection", "IRegisteredTaskCollection")),
    *(Method(i, "Release", 2, (), c_uint32) for i in ("ITaskDefinition", "IPrincipal")),
    Method("ITaskService", "GetFolder", 7, (BSTR, OUT)),
    Method("ITaskService", "Connect", 10, (VARIANT, VARIANT, VARIANT, VARIANT)),
    Method("ITaskFolder", "GetFolder", 9, (BSTR, OUT)),
    Method("ITaskFolder", "GetFolders", 10, (LONG, OUT)),
    Method("ITaskFolder", "GetTasks", 14, (LONG, OUT)),
    Method("ITaskFolder", "DeleteTask", 15, (BSTR, LONG)),
    Method("ITaskFolderCollection", "get_Count", 7, (POINTER(LONG),)),
    Method("ITaskFolderCollection", "get_Item", 8, (VARIANT, OUT)),
    Method("IRegisteredTaskCollection", "get_Count", 7, (POINTER(LONG),)),
    Method("IRegisteredTaskCollection", "get_Item", 8, (VARIANT, OUT)),
    Method("IRegisteredTask", "get_Path", 8, (OUT,)),
    Method("IRegisteredTask", "get_Definition", 19, (OUT,)),
    Method("IRegisteredTask", "GetSecurityDescriptor", 21, (LONG, OUT)),
    Method("ITaskDefinition", "get_Principal", 15, (OUT,)),
    Method("IPrincipal", "get_UserId", 11, (OUT,)),
)
_BY = {(m.iface, m.name): m for m in METHODS}


class _Com:
    """One interface pointer; `call` by the METHODS record, `release` once."""

    def __init__(self, iface: str, ptr: int) -> None:
        self.iface, self.ptr = iface, ptr

    def call(self, name: str, *args: object) -> None:
        m = _BY[(self.iface, name)]
        proto = getattr(ctypes, "WINFUNCTYPE", ctypes.CFUNCTYPE)(m.restype, c_void_p, *m.argtypes)
        vtbl = ctypes.cast(c_void_p(self.ptr), POINTER(POINTER(c_void_p))).contents
        hr = proto(vtbl[m.slot])(self.ptr, *args)
        if hr < 0:
            raise Win32Error(hr & 0xFFFFFFFF, f"{self.iface}::{name} failed (0x{hr & 0xFFFFFFFF:08x})")

    def get(self, iface: str, name: str, *args: object) -> _Com:
        out = c_void_p()
        self.call(name, *args, ctypes.byref(out))
        return _Com(iface, int(out.value or 0))

    def text(self, name: str, *args: object) -> str:
        out = c_void_p()
        self.call(name, *args, ctypes.byref(out))
        try:
            return ctypes.wstring_at(out.value) if out.value else ""
        finally:
            fn("SysFreeString")(out)

    def release(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            _Com(self.iface, ptr).call("Release")


def _bstr(text: str) -> c_void_p:
    return c_void_p(fn("SysAllocString")(text))


def _index(i: int) -> VARIANT:
    v = VARIANT()
    v.vt, v.llVal = VT_I4, i
    return v


def _items(coll: _Com, iface: str) -> Iterator[_Com]:
    count = c_int32()
    coll.call("get_Count", ctypes.byref(count))
    for i in range(1, count.value + 1):
        yield coll.get(iface, "get_Item", _index(i))


def _service() -> _Com:
    out = c_void_p()
    hr = fn("CoCreateInstance")(
        ctypes.byref(CLSID_TASK_SCHEDULER),
        None,
        CLSCTX_INPROC_SERVER,
        ctypes.byref(IID_TASK_SERVICE),
        ctypes.byref(out),
    )
    if hr < 0:
        raise Win32Error(hr & 0xFFFFFFFF, f"CoCreateInstance(Schedule.Service) failed (0x{hr & 0xFFFFFFFF:08x})")
    svc = _Com("ITaskService", int(out.value or 0))
    svc.call("Connect", VARIANT(), VARIANT(), VARIANT(), VARIANT())  # VT_EMPTY: this machine, the current token
    return svc


def _com(work: Any) -> Any:
    hr = fn("CoInitializeEx")(None, COINIT_MULTITHREADED)
    if hr < 0:
        raise Win32Error(hr & 0xFFFFFFFF, f"CoInitializeEx failed (0x{hr & 0xFFFFFFFF:08x})")
    try:
        svc = _service()
        try:
            return work(svc)
        finally:
            svc.release()
    finally:
        fn("CoUninitialize")()


def _folder(svc: _Com, path: str) -> _Com:
    b = _bstr(path)
    try:
        return svc.get("ITaskFolder", "GetFolder", b)
    finally:
        fn("SysFreeString")(b)


def _principal_sid(task: _Com) -> str:
    definition = task.get("ITaskDefinition", "get_Definition")
    try:
        principal = definition.get("IPrincipal", "get_Principal")
        try:
            user = principal.text("get_UserId")
        finally:
            principal.release()
    finally:
        definition.release()
    return resolve(user)


def resolve(user: str) -> str:
    """A principal's UserId as a SID; "" when it names nobody this machine can resolve now. A lookup
    that fails (a domain account with no domain controller in reach) must not abort the sweep: the
    sandbox user's own name resolves locally, and its tasks also match by owner (win-acl A6)."""
    if not user or user.upper().startswith("S-1-"):
        return user
    try:
        return account_sid(user) or ""
    except Win32Error:
        return ""


def _owner(task: _Com) -> str:
    sddl = task.text("GetSecurityDescriptor", OWNER_SECURITY_INFORMATION)
    head = sddl.partition("O:")[2]
    return head.split("G:")[0].split("D:")[0]


def _walk(folder: _Com, out: list[tuple[str, str, str]]) -> None:
    try:
        tasks = folder.get("IRegisteredTaskCollection", "GetTasks", TASK_ENUM_HIDDEN)
    except Win32Error as e:
        if e.errno == E_ACCESSDENIED:
            return  # a folder this user may not read holds nothing it registered
        raise
    try:
        for task in _items(tasks, "IRegisteredTask"):
            try:
                out.append((task.text("get_Path"), _principal_sid(task), _owner(task)))
            finally:
                task.release()
    finally:
        tasks.release()
    subs = folder.get("ITaskFolderCollection", "GetFolders", 0)
    try:
        for sub in _items(subs, "ITaskFolder"):
            try:
                _walk(sub, out)
            finally:
                sub.release()
    finally:
        subs.release()


def tasks() -> list[tuple[str, str, str]]:
    """(path, principal SID, owner SID) of every task the calling thread's user can read."""

    def work(svc: _Com) -> list[tuple[str, str, str]]:
        root = _folder(svc, "\\")
        try:
            found: list[tuple[str, str, str]] = []
            _walk(root, found)
            return found
        finally:
            root.release()

    out: list[tuple[str, str, str]] = _com(work)
    return out


def delete(path: str) -> None:
    """Delete one task by its full path (E_ACCESSDENIED unless this user may delete it)."""
    parent, _, name = path.rpartition("\\")

    def work(svc: _Com) -> None:
        folder = _folder(svc, parent or "\\")
        b = _bstr(name)
        try:
            folder.call("DeleteTask", b, 0)
        finally:
            fn("SysFreeString")(b)
            folder.release()

    _com(work)

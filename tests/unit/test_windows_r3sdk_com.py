"""win32tasks' COM calls through real vtables (r3-sdk): each method the sweep calls by slot lands in a
C function pointer built from that slot's METHODS prototype (ctypes callbacks), so ctypes marshals
`this`, the BSTRs, the VARIANTs by value and the out-pointers exactly as it would into taskschd.dll;
the fake checks what arrives (flags, the VT_I4 index, 1-based), answers through the out-pointers,
and counts Release against every interface it handed out. The Win32 calls around it (CoInitializeEx,
CoCreateInstance, SysAllocString/SysFreeString) go through tests/support/winmarshal.py.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import c_void_p
from typing import Any

import pytest

from fsguard.windows import win32tasks
from tests.support import winmarshal

SID = winmarshal.SID
E_ACCESSDENIED = winmarshal.E_ACCESSDENIED


class Vtables:
    """Fake Task Scheduler objects: one vtable per interface, each slot a callback of its METHODS prototype."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.keep: list[Any] = []  # callbacks, vtables, objects, strings: alive while the test runs
        self.objects: set[int] = set()
        self.handed: list[int] = []  # every interface given out (out-pointers, CoCreateInstance)
        self.released: list[int] = []
        self.deleted: list[str] = []

    def make(self, iface: str, impl: dict[str, Callable[..., int]]) -> int:
        methods = [m for m in win32tasks.METHODS if m.iface == iface]
        vtbl = (c_void_p * (max(m.slot for m in methods) + 1))()
        for m in methods:
            body = impl.get(m.name) or (lambda *a: 0)
            cb = ctypes.CFUNCTYPE(m.restype, c_void_p, *m.argtypes)(self._wrap(iface, m.name, body))
            vtbl[m.slot] = ctypes.cast(cb, c_void_p).value
            self.keep.append(cb)
        obj = (c_void_p * 1)(ctypes.addressof(vtbl))
        self.keep += [vtbl, obj]
        self.objects.add(ctypes.addressof(obj))
        return ctypes.addressof(obj)

    def _wrap(self, iface: str, name: str, body: Callable[..., int]) -> Callable[..., int]:
        def call(this: int, *args: Any) -> int:
            if name == "Release":
                self.released.append(this)
                return 0
            if f"{iface}::{name}" == self.fail:
                return E_ACCESSDENIED
            return body(*args)

        return call

    def out(self, p: Any, value: int) -> int:
        if value in self.objects:
            self.handed.append(value)
        p[0] = value
        return 0

    def bstr(self, p: Any, text: str) -> int:
        buf = ctypes.create_unicode_buffer(text)
        self.keep.append(buf)
        return self.out(p, ctypes.addressof(buf))

    def service(self) -> int:
        def collection(iface: str, items: list[int]) -> int:
            def item(index: win32tasks.VARIANT, p: Any) -> int:
                assert index.vt == win32tasks.VT_I4 and 1 <= index.llVal <= len(items)  # 1-based, VT_I4
                return self.out(p, items[index.llVal - 1])

            return self.make(iface, {"get_Count": lambda p: self.out(p, len(items)), "get_Item": item})

        principal = self.make("IPrincipal", {"get_UserId": lambda p: self.bstr(p, SID)})
        definition = self.make("ITaskDefinition", {"get_Principal": lambda p: self.out(p, principal)})

        def security(info: int, p: Any) -> int:
            assert info == win32tasks.OWNER_SECURITY_INFORMATION
            return self.bstr(p, f"O:{SID}G:SYD:(A;;FA;;;SY)")

        task = self.make(
            "IRegisteredTask",
            {
                "get_Path": lambda p: self.bstr(p, "\\sandgate-task"),
                "get_Definition": lambda p: self.out(p, definition),
                "GetSecurityDescriptor": security,
            },
        )

        def get_tasks(flags: int, p: Any) -> int:
            assert flags == win32tasks.TASK_ENUM_HIDDEN
            return self.out(p, collection("IRegisteredTaskCollection", [task]))

        def delete(name: int, flags: int) -> int:
            self.deleted.append(ctypes.wstring_at(name))
            return 0

        folder = self.make(
            "ITaskFolder",
            {
                "GetTasks": get_tasks,
                "GetFolders": lambda flags, p: self.out(p, collection("ITaskFolderCollection", [])),
                "DeleteTask": delete,
            },
        )
        return self.make(
            "ITaskService",
            {
                "Connect": lambda *v: 0 if all(x.vt == 0 for x in v) else 1,
                "GetFolder": lambda b, p: self.out(p, folder),
            },
        )


def _install(monkeypatch: pytest.MonkeyPatch, v: Vtables) -> winmarshal.Dlls:
    """winmarshal's DLLs, with CoCreateInstance answering the fake service and SysAllocString a real string."""
    dlls = winmarshal.Dlls()

    def fn(name: str) -> Callable[..., Any]:
        call = dlls.fn(name)
        if name == "CoCreateInstance":

            def create(*a: Any) -> int:
                hr = int(call(*a))
                if hr == 0:
                    service = v.service()
                    v.handed.append(service)
                    a[4]._obj.value = service  # byref(out)
                return hr

            return create
        if name == "SysAllocString":

            def alloc(text: str) -> int:
                call(text)
                buf = ctypes.create_unicode_buffer(text)
                v.keep.append(buf)
                return ctypes.addressof(buf)

            return alloc
        return call

    monkeypatch.setattr(win32tasks, "fn", fn)
    monkeypatch.setattr(ctypes, "get_last_error", dlls.get_last_error, raising=False)
    return dlls


def test_the_sweeps_com_calls_marshal_through_each_slot_and_release_all(monkeypatch: pytest.MonkeyPatch) -> None:
    v = Vtables()
    dlls = _install(monkeypatch, v)
    assert win32tasks.tasks() == [("\\sandgate-task", SID, SID)]
    assert sorted(v.released) == sorted(v.handed) and len(v.handed) == 7  # each interface released once
    assert dlls.calls.count("SysFreeString") == dlls.calls.count("SysAllocString") + 3  # + the three out-BSTRs
    assert dlls.calls[0] == "CoInitializeEx" and dlls.calls[-1] == "CoUninitialize"
    win32tasks.delete("\\sandgate-task")
    assert v.deleted == ["sandgate-task"]


@pytest.mark.parametrize(
    "fail", ["ITaskService::Connect", "ITaskService::GetFolder", "IRegisteredTask::get_Path", "IPrincipal::get_UserId"]
)
def test_a_failing_method_raises_its_hresult(monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    v = Vtables(fail=fail)
    _install(monkeypatch, v)
    with pytest.raises(OSError) as e:
        win32tasks.tasks()
    assert e.value.errno == 0x80070005 and fail in str(e.value)
    if fail != "ITaskService::Connect":  # r3-sdk S4: _service() does not release the service Connect refused
        assert sorted(v.released) == sorted(v.handed)


def test_a_folder_the_user_may_not_read_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, Vtables(fail="ITaskFolder::GetTasks"))
    assert win32tasks.tasks() == []


def test_index_variant_is_vt_i4_with_the_value_in_the_low_half() -> None:
    v = win32tasks._index(3)
    raw = bytes(v)
    assert len(raw) == 24 and raw[:2] == b"\x03\x00" and int.from_bytes(raw[8:12], "little") == 3

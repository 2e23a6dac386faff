"""The transparent loop's Windows marshalling (win32owner.py, win32debug.py) through a fake `fn`:
what each call is given and how its answers (and failures) are read. Linux only: the real calls are
checked against the SDK headers by test_win_sdk.py; Windows itself has not run these."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest

from launcher.run.windows import win32debug, win32owner
from netguard.windows.owners import Opened
from sgbase.windows import win32
from sgbase.windows.win32 import Win32Error


def _table(monkeypatch: pytest.MonkeyPatch, module: Any, table: dict[str, Callable[..., Any]]) -> list[int]:
    """`fn` answering from `table`; CloseHandle recorded (returned list)."""
    closed: list[int] = []
    table = {"CloseHandle": closed.append, **table}
    monkeypatch.setattr(module, "fn", lambda name: table[name])
    monkeypatch.setattr(win32, "fn", lambda name: table[name])
    return closed


def test_the_owner_is_read_through_one_handle_kept_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """TokenUser through the process handle, which stays open (it pins the pid) until released; a
    process that cannot be opened, or whose token refuses TOKEN_QUERY, is said so, never guessed."""
    from fsguard.windows import win32sweep

    def open_process(access: int, inherit: bool, pid: int) -> int | None:
        assert access == win32owner.PROCESS_QUERY_LIMITED_INFORMATION == 0x1000 and not inherit
        return None if pid == 999 else pid + 10_000

    def token_user(h: int) -> str:
        if h == 10_303:
            raise Win32Error(5, "Access is denied")  # OpenProcessToken: the token's DACL refuses
        return f"S-1-5-21-{h}"

    closed = _table(monkeypatch, win32owner, {"OpenProcess": open_process})
    monkeypatch.setattr(win32sweep, "token_user", token_user)
    assert win32owner.open_owner(202) == Opened(10_202, "S-1-5-21-10202")
    assert win32owner.open_owner(303) == Opened(10_303, None)
    assert win32owner.open_owner(999) == Opened()  # nothing kept
    assert closed == []  # every handle stays open until the loop releases it
    win32owner.release(10_202)
    assert closed == [10_202]


def test_the_jobs_pid_list_is_read_whole_growing_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """JOBOBJECT_BASIC_PROCESS_ID_LIST: a buffer too small (ERROR_MORE_DATA, or fewer ids in the list
    than assigned) is grown until every id fits; any other failure is an error, not an empty job."""
    members = list(range(1000, 1000 + 150))  # more than the first guess holds
    last = {"error": 0}
    seen: list[int] = []

    def query(job: int, cls: int, buf: Any, size: int, ret: object) -> int:
        assert (job, cls, ret) == (77, 3, None) and size == ctypes.sizeof(buf)
        seen.append(size)
        head = win32owner.JOBOBJECT_BASIC_PROCESS_ID_LIST.from_buffer(buf)
        room = (size - 8) // 8
        head.NumberOfAssignedProcesses = len(members)
        head.NumberOfProcessIdsInList = min(room, len(members))
        ids = (ctypes.c_uint64 * head.NumberOfProcessIdsInList).from_buffer(buf, 8)
        ids[:] = members[: head.NumberOfProcessIdsInList]
        if room < len(members):
            last["error"] = win32owner.ERROR_MORE_DATA
            return 0
        return 1

    _table(monkeypatch, win32owner, {"QueryInformationJobObject": query})
    monkeypatch.setattr(ctypes, "get_last_error", lambda: last["error"], raising=False)
    assert win32owner.job_pids(77) == frozenset(members)
    assert len(seen) == 2 and win32owner.JOBOBJECT_BASIC_PROCESS_ID_LIST.ProcessIdList.offset == 8

    def denied(job: int, cls: int, buf: Any, size: int, ret: object) -> int:
        last["error"] = 5
        return 0

    _table(monkeypatch, win32owner, {"QueryInformationJobObject": denied})
    with pytest.raises(Win32Error, match="QueryInformationJobObject"):
        win32owner.job_pids(77)


class _Token:
    """A process token as AdjustTokenPrivileges sees it (SeDebugPrivilege's LUID: 20)."""

    def __init__(self, held: bool, enabled: bool) -> None:
        self.held, self.enabled, self.error, self.closed = held, enabled, 0, list[int]()

    def table(self) -> dict[str, Callable[..., Any]]:
        def lookup(system: None, name: str, luid: Any) -> int:
            assert system is None and name == "SeDebugPrivilege"
            luid._obj.LowPart = 20
            return 1

        def open_token(process: int, access: int, out: Any) -> int:
            assert process == -1 and access == 0x0020 | 0x0008  # our own: TOKEN_ADJUST_PRIVILEGES | QUERY
            out._obj.value = 555
            return 1

        def adjust(token: Any, disable_all: bool, new: Any, size: int, old: Any, ret: Any) -> int:
            assert token.value == 555 and not disable_all and size == ctypes.sizeof(old._obj)
            asked = new._obj
            assert asked.PrivilegeCount == 1 and asked.Privileges[0].Luid.LowPart == 20
            want = asked.Privileges[0].Attributes == win32debug.SE_PRIVILEGE_ENABLED
            self.error = 0 if self.held else win32debug.ERROR_NOT_ALL_ASSIGNED
            changed = self.held and want != self.enabled
            old._obj.PrivilegeCount = int(changed)  # only the privileges the call changed
            if self.held:
                self.enabled = want
            return 1  # "succeeds" even when the token does not hold it

        return {
            "LookupPrivilegeValueW": lookup,
            "GetCurrentProcess": lambda: -1,
            "OpenProcessToken": open_token,
            "AdjustTokenPrivileges": adjust,
            "CloseHandle": lambda h: self.closed.append(h),
        }


@pytest.mark.parametrize("before", [False, True])
def test_debug_privilege_is_enabled_and_says_what_it_was(monkeypatch: pytest.MonkeyPatch, before: bool) -> None:
    token = _Token(held=True, enabled=before)
    _table(monkeypatch, win32debug, token.table())
    monkeypatch.setattr(ctypes, "get_last_error", lambda: token.error, raising=False)
    steps = [win32debug.set_debug(True), token.enabled, win32debug.set_debug(False), token.enabled]
    assert steps == [before, True, True, False]  # what it was before each call, and what it is after
    assert token.closed == [555, 555]  # the token handle closed after each call


def test_a_token_without_debug_privilege_is_an_error_not_a_success(monkeypatch: pytest.MonkeyPatch) -> None:
    """AdjustTokenPrivileges returns TRUE with ERROR_NOT_ALL_ASSIGNED when the token lacks it."""
    token = _Token(held=False, enabled=False)
    _table(monkeypatch, win32debug, token.table())
    monkeypatch.setattr(ctypes, "get_last_error", lambda: token.error, raising=False)
    with pytest.raises(Win32Error, match="does not hold SeDebugPrivilege") as e:
        win32debug.set_debug(True)
    assert e.value.errno == 1300 and token.closed == [555]

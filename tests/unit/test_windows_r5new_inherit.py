"""r5-new: uninherit_all refuses the run only for a handle that really stays inheritable.

sandgate has threads of its own while the scan runs (the proxy's stdout drain, realapi.py; the
transparent resolver's accept loop, win32divert.py): a handle one of them closes between
os.get_handle_inheritable and os.set_handle_inheritable makes SetHandleInformation fail with
ERROR_INVALID_HANDLE (6). That handle can no longer reach CMD, so the run must not be refused for it;
a handle that is still there and still inheritable still refuses it.
"""

from __future__ import annotations

import pytest

from fsguard.windows import win32proc
from sgbase.windows.win32 import Win32Error


class Table:
    """A handle table whose entries another thread may close in between (`closes_on_put`)."""

    def __init__(self, inheritable: set[int], closes_on_put: set[int], stuck: frozenset[int] = frozenset()) -> None:
        self.inheritable, self.closes, self.stuck = set(inheritable), closes_on_put, stuck
        self.open = set(inheritable)

    def get(self, h: int) -> bool:
        if h not in self.open:
            raise OSError(6, "The handle is invalid")
        return h in self.inheritable

    def put(self, h: int, inheritable: bool) -> None:
        if h in self.closes:  # the other thread closed it just before this call
            self.open.discard(h)
            self.inheritable.discard(h)
            raise OSError(6, "The handle is invalid")
        if h in self.stuck:
            raise OSError(5, "Access is denied")
        if not inheritable:
            self.inheritable.discard(h)


def _install(monkeypatch: pytest.MonkeyPatch, table: Table) -> None:
    monkeypatch.setattr("os.get_handle_inheritable", table.get, raising=False)
    monkeypatch.setattr("os.set_handle_inheritable", table.put, raising=False)


def test_a_handle_closed_by_another_thread_during_the_scan_does_not_refuse_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = Table({8, 12, 0x1F4}, closes_on_put={0x1F4})
    _install(monkeypatch, table)
    assert win32proc.uninherit_all() == 2  # the console's two handles; the closed one skipped
    assert not table.inheritable


def test_a_handle_still_inheritable_after_a_refused_change_still_refuses_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = Table({8, 12}, closes_on_put=set(), stuck=frozenset({12}))
    _install(monkeypatch, table)
    with pytest.raises(Win32Error, match="handle 12"):
        win32proc.uninherit_all()

"""r4-run N3: CMD inherits its three pipe ends and no other handle of sandgate's.

CreateProcessWithLogonW, lpStartupInfo: "If the dwFlags member of the STARTUPINFO structure specifies
STARTF_USESTDHANDLES, the standard handle fields are copied unchanged to the child process without
validation" (learn.microsoft.com/windows/win32/api/winbase/nf-winbase-createprocesswithlogonw): the values
are valid in CMD only because CMD inherits from sandgate, and inheritance takes every inheritable handle.
pip's console-script launcher (sandgate.exe) gives python.exe inheritable copies of its std handles: in a
terminal, the real user's console, into whose input buffer CMD could type (WriteConsoleInputW). The fake
kernel (winkernel.py) records what CPWL's child inherits.
"""

from __future__ import annotations

import pytest

from fsguard.windows import desktop, win32proc
from fsguard.windows.launch import Launch
from tests.support import winfake, winkernel
from tests.support.winfake import WS

CONSOLE = (8, 12, 16)  # sandgate's std handles as pip's launcher passed them: inheritable


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> winkernel.FakeKernel:
    k = winkernel.FakeKernel((r"C:\Tools\tool.exe",))
    winkernel.install(monkeypatch, k)
    for h in CONSOLE:
        k.open.add(h)
        k.pipes[h] = True
    return k


def _launch() -> Launch:
    how = desktop.plan_desktop("t1", winfake.REAL_SID, "S-1-5-21-1-2-3-1001")
    return Launch("u", "pw", r"C:\Tools\tool.exe", "tool.exe", ("tool.exe",), WS, {"PATH": r"C:\W"}, how.lp_desktop)


def test_cmd_inherits_its_three_pipe_ends_and_not_the_real_users_console(kernel: winkernel.FakeKernel) -> None:
    got = win32proc.create_suspended(_launch())
    (started,) = kernel.started
    assert not set(CONSOLE) & set(started["inherited"])  # the console stays sandgate's
    assert len(started["inherited"]) == 3  # CMD's stdin, stdout, stderr: nothing more
    assert got.stdout and not kernel.pipes[got.stdout]  # sandgate's ends are not inherited either


def test_a_handle_that_cannot_be_made_private_refuses_the_start(
    kernel: winkernel.FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stuck(h: int, inheritable: bool) -> None:
        raise OSError(5, "Access is denied")

    monkeypatch.setattr("os.set_handle_inheritable", stuck, raising=False)
    with pytest.raises(OSError, match="non-inheritable"):
        win32proc.create_suspended(_launch())
    assert not kernel.started


def test_the_scan_reaches_inherited_values_far_above_a_fresh_process(kernel: winkernel.FakeKernel) -> None:
    kernel.open.add(0x2F3C)  # a value a shell chain passed down (inherited handles keep their values)
    kernel.pipes[0x2F3C] = True
    assert win32proc.uninherit_all() == 4
    assert not any(kernel.pipes[h] for h in (*CONSOLE, 0x2F3C))

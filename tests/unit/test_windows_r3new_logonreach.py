"""r3-new: logonreach's deny ACEs cover every right of their object, as the SDK defines them.

Round two's tests checked the deny against the few rights its probe asks for (WINSTA_ENUMDESKTOPS,
DESKTOP_HOOKCONTROL, PROCESS_VM_READ): a station mask of 0x1 passed them all, and left CMD the
clipboard (WINSTA_ACCESSCLIPBOARD) and the global atoms. Here every right of winuser.h/winnt.h counts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsguard.windows import logonreach, sddl

INCLUDE = Path("/usr/share/mingw-w64/include")
#: winuser.h:817-825 (WINSTA_*), :774-782 (DESKTOP_*); winnt.h: PROCESS_ALL_ACCESS (STANDARD_RIGHTS_REQUIRED | SYNCHRONIZE | 0xffff)
STATION = {
    "WINSTA_ENUMDESKTOPS": 0x1, "WINSTA_READATTRIBUTES": 0x2, "WINSTA_ACCESSCLIPBOARD": 0x4,
    "WINSTA_CREATEDESKTOP": 0x8, "WINSTA_WRITEATTRIBUTES": 0x10, "WINSTA_ACCESSGLOBALATOMS": 0x20,
    "WINSTA_EXITWINDOWS": 0x40, "WINSTA_ENUMERATE": 0x100, "WINSTA_READSCREEN": 0x200,
}  # fmt: skip
DESKTOP = {
    "DESKTOP_READOBJECTS": 0x1, "DESKTOP_CREATEWINDOW": 0x2, "DESKTOP_CREATEMENU": 0x4, "DESKTOP_HOOKCONTROL": 0x8,
    "DESKTOP_JOURNALRECORD": 0x10, "DESKTOP_JOURNALPLAYBACK": 0x20, "DESKTOP_ENUMERATE": 0x40,
    "DESKTOP_WRITEOBJECTS": 0x80, "DESKTOP_SWITCHDESKTOP": 0x100,
}  # fmt: skip
STANDARD_RIGHTS_REQUIRED, SYNCHRONIZE = 0x000F0000, 0x00100000
SANDBOX = "S-1-5-21-1-2-3-1001"


def test_the_constants_are_the_sdks() -> None:
    """Checked against mingw-w64's winuser.h where it is installed (the project's CI has it)."""
    text = (INCLUDE / "winuser.h").read_text(errors="replace")
    for name, value in {**STATION, **DESKTOP}.items():
        m = re.search(rf"#define {name} __MSABI_LONG\((0x[0-9A-Fa-f]+)\)", text)
        assert m is not None and int(m.group(1), 16) == value, name


@pytest.mark.parametrize(
    ("ace", "rights"),
    [
        ("station", sum(STATION.values()) | STANDARD_RIGHTS_REQUIRED),
        ("desktop", sum(DESKTOP.values()) | STANDARD_RIGHTS_REQUIRED),
        ("process", 0xFFFF | STANDARD_RIGHTS_REQUIRED | SYNCHRONIZE),
    ],
)
def test_each_deny_names_every_right_of_its_object_for_the_sandbox_sid_only(ace: str, rights: int) -> None:
    got = sddl.parse_ace(getattr(logonreach.ReachDenial(SANDBOX), ace))
    assert got.kind == "D" and sddl.sid_of(got.sid) == SANDBOX
    assert got.mask & rights == rights, f"{ace}: {rights & ~got.mask:#x} not denied"
    assert not got.flags  # the object itself: not inherited by what is created in it

"""Constants the SDK names otherwise, compared with the SDK's own expression (r3-sdk).

test_win_sdk.py compares a constant whose name the SDK also has; one named otherwise (INFO_TOKEN_USER
for TokenUser, a mixed-case enum value, a mask composed of several SDK flags, a literal in a verify
body) was taken as "ours" and never compared. Each is listed here with the SDK expression it stands for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fsguard.windows import acl, desktop, logonreach, servicedeny, win32dcom, win32job, win32session, win32sweep
from launcher.run.windows import win32owner
from selftest.windows import probedesktop, probelogon, probenet
from sgbase.windows import win32
from tests.support import winscript, winsdkcalls

#: mingw-w64's SDK and compiler are the Linux suite's; on Windows the real DLLs are loaded instead
pytestmark = pytest.mark.skipif(os.name == "nt", reason="the SDK check runs where mingw-w64 is (Linux)")

ALIASES = {
    (win32owner, "INFO_PROCESS_ID_LIST"): "JobObjectBasicProcessIdList",
    (win32sweep, "INFO_TOKEN_USER"): "TokenUser",
    (win32job, "JobObjectExtendedLimitInformation"): "JobObjectExtendedLimitInformation",
    (win32session, "WTSUserName"): "WTSUserName",
    (win32session, "WTSDomainName"): "WTSDomainName",
    (win32session, "WTS_CURRENT_SESSION"): "WTS_CURRENT_SESSION",
    (win32, "UF_FLAGS"): "UF_SCRIPT | UF_PASSWD_CANT_CHANGE | UF_DONT_EXPIRE_PASSWD",
    (
        win32dcom,
        "OWNER_GROUP_DACL",
    ): "OWNER_SECURITY_INFORMATION | GROUP_SECURITY_INFORMATION | DACL_SECURITY_INFORMATION",
    (probenet, "ACCESS_DENIED"): "ERROR_ACCESS_DENIED",
    (desktop, "DESKTOP_ALL_ACCESS"): "DESKTOP_READOBJECTS | DESKTOP_CREATEWINDOW | DESKTOP_CREATEMENU | "
    "DESKTOP_HOOKCONTROL | DESKTOP_JOURNALRECORD | DESKTOP_JOURNALPLAYBACK | DESKTOP_ENUMERATE | "
    "DESKTOP_WRITEOBJECTS | DESKTOP_SWITCHDESKTOP",
    (logonreach, "DENY_PROCESS"): "PROCESS_ALL_ACCESS",
    (logonreach, "DENY_STATION"): "WINSTA_ALL_ACCESS | STANDARD_RIGHTS_REQUIRED",
    (acl, "READ_EXECUTE"): "FILE_GENERIC_READ | FILE_GENERIC_EXECUTE",
    (acl, "MODIFY"): "FILE_GENERIC_READ | FILE_GENERIC_WRITE | FILE_GENERIC_EXECUTE | DELETE",
    (acl, "WRITE_DAC_OWNER"): "WRITE_DAC | WRITE_OWNER",
    (servicedeny, "COM_ACCESS_DENIED"): "COM_RIGHTS_EXECUTE | COM_RIGHTS_EXECUTE_LOCAL | COM_RIGHTS_EXECUTE_REMOTE",
    (servicedeny, "COM_LAUNCH_DENIED"): "COM_RIGHTS_EXECUTE | COM_RIGHTS_EXECUTE_LOCAL | COM_RIGHTS_EXECUTE_REMOTE"
    " | COM_RIGHTS_ACTIVATE_LOCAL | COM_RIGHTS_ACTIVATE_REMOTE",
}
#: the verify bodies' masks (their globals after a recorded run)
SCRIPT_ALIASES = {
    "READ": "PROCESS_VM_READ | PROCESS_QUERY_INFORMATION",
    "STATION": "WINSTA_ENUMDESKTOPS | WINSTA_READATTRIBUTES",
    "DESK": "DESKTOP_READOBJECTS | DESKTOP_CREATEWINDOW | DESKTOP_HOOKCONTROL",
}
#: literals the bodies pass undeclared: (call, argument index) -> the SDK's name for it
SCRIPT_ARGUMENTS = {
    ("GetUserObjectInformationW", 1): "UOI_NAME",
    ("QueryInformationJobObject", 1): "JobObjectBasicProcessIdList",
    ("OpenProcess", 0): "PROCESS_QUERY_LIMITED_INFORMATION | PROCESS_TERMINATE",  # probenet; probelogon's:
    ("OpenProcess", 0, "logon"): "PROCESS_VM_READ | PROCESS_QUERY_INFORMATION",
    ("OpenWindowStationW", 2): "WINSTA_ENUMDESKTOPS",  # probedesktop; probelogon's:
    ("OpenWindowStationW", 2, "logon"): "WINSTA_ENUMDESKTOPS | WINSTA_READATTRIBUTES",
    ("TerminateProcess", 1): "1",
    ("SendInput", 0): "2",
}
EXTRA = "#include <objbase.h>\n#include <wbemcli.h>\n"


def _assert(value: int, expr: str, what: str) -> str:
    return f'static_assert((unsigned long long)(DWORD)({expr}) == {value & 0xFFFFFFFF}ull, "{what} = {value:#x}");'


@pytest.fixture
def bodies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[winscript.Recording]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / probelogon.PID_FILE).write_text(json.dumps({"pid": 42}))
    return [winscript.run_script(s, lambda n: 0x44) for s in (probelogon.SCRIPT, probedesktop.SCRIPT, probenet.WMI)]


def test_aliased_constants_are_the_sdks(bodies: list[winscript.Recording], tmp_path: Path) -> None:
    body = [_assert(getattr(m, n), e, f"{m.__name__}.{n}") for (m, n), e in ALIASES.items()]
    scope = {k: v for r in bodies for k, v in r.scope.items()}
    body += [_assert(scope[n], e, f"body {n}") for n, e in SCRIPT_ALIASES.items()]
    seen = 0
    for c in (c for r in bodies for c in r.calls):
        for i, v in enumerate(c.args):
            if (c.name, i) in SCRIPT_ARGUMENTS and isinstance(v, int):
                exprs = [e for k, e in SCRIPT_ARGUMENTS.items() if k[:2] == (c.name, i)]
                either = " || ".join(f"(DWORD)({e}) == {v & 0xFFFFFFFF}u" for e in exprs)
                body.append(f'static_assert({either}, "{c.name} argument {i + 1} = {v:#x}");')
                seen += 1
    assert seen >= len(SCRIPT_ARGUMENTS) - 2
    assert winsdkcalls.failures(body, tmp_path, EXTRA) == []


def test_a_wrong_alias_fails(tmp_path: Path) -> None:
    body = [_assert(2, "TokenUser", "INFO_TOKEN_USER"), _assert(0x1F, "COM_RIGHTS_EXECUTE", "x")]
    assert len(winsdkcalls.failures(body, tmp_path, EXTRA)) == 2

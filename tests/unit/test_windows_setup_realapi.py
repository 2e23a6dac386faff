"""The real WinApi's setup effects that Linux can still drive (session 38, win-setup findings S2, S3,
S5, S6): who the real user is (the token, not a name), the transparent allow's program (the process
image, not a venv's redirector), PowerShell failures as one line. Not Windows evidence."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from fsguard.windows import win32sweep
from launcher.run.windows import setup
from launcher.run.windows.realapi import RealWinApi
from netguard.windows import firewall
from sgbase.windows import win32
from sgbase.windows.api import WinApiError
from sgbase.windows.win32 import Win32Error

TOKEN_SID = "S-1-12-1-1111111111-2222222222-3333333333-4444444444"  # an Entra ID (AzureAD\) user
PSEUDO = 0xFFFFFFFFFFFFFFFF  # GetCurrentProcess()'s (HANDLE)-1 as ctypes returns it


def test_the_real_user_is_the_token_user_not_a_name_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """S2: LookupAccountNameW(USERNAME) misses AzureAD\\name and can name a same-named local account
    on a domain member; setup would bind the filters' read grant and the port guard to it."""
    opened: list[int] = []

    def fn(name: str) -> Any:
        assert name == "GetCurrentProcess", f"{name}: the SID must come from the token, not a name lookup"
        return lambda: PSEUDO

    def token_user(process: int) -> str:
        opened.append(process)
        return TOKEN_SID

    monkeypatch.setattr(win32, "fn", fn)
    monkeypatch.setattr(win32sweep, "token_user", token_user)
    monkeypatch.setenv("USERNAME", "JohnDoe")
    assert RealWinApi().current_user_sid() == TOKEN_SID and opened == [PSEUDO]

    def refused(process: int) -> str:
        raise Win32Error(5, "OpenProcessToken failed (error 5)")

    monkeypatch.setattr(win32sweep, "token_user", refused)
    with pytest.raises(WinApiError, match="TokenUser") as e:
        RealWinApi().current_user_sid()
    assert "\n" not in str(e.value)


def test_the_transparent_allow_names_the_interpreter_image_in_a_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    """S3: a venv's python.exe starts the base interpreter as a child (bpo-35797); the proxy listens
    in that child, so a rule naming the redirector never matches the reflected SYNs."""
    venv, base = r"C:\work\.venv\Scripts\python.exe", r"C:\Program Files\Python312\python.exe"
    monkeypatch.setattr(sys, "executable", venv)
    monkeypatch.setattr(sys, "_base_executable", base, raising=False)
    sent: list[str] = []

    def powershell(self: RealWinApi, command: str) -> str:
        sent.append(command)
        return ""

    monkeypatch.setattr(RealWinApi, "_powershell", powershell)
    api = RealWinApi()
    allow = firewall.transparent_allow("S-1-5-21-1-2-3-1000", api.python(), setup.TRANSPARENT_PORT)
    api.firewall_add(allow)
    assert f"-Program '{base}'" in sent[0] and venv not in sent[0]
    assert f"-Name '{allow.name}'" in sent[0]  # the name is unchanged: firewall_has still finds it
    block = firewall.plan_rules("S-1-5-21-1-2-3-1001", (3128,))[0]
    api.firewall_add(block)
    assert sent[1] == firewall.ps_add(block)  # rules without a program are passed as planned


def _failing_child(real_run: Any, argv_seen: list[list[str]]) -> Any:
    """subprocess.run, but the child is a Python that fails with a byte no locale decodes (cp850's
    'ü' = 0x81, as Windows PowerShell writes a German error to a pipe)."""

    def run(argv: list[str], **kw: Any) -> Any:
        argv_seen.append(argv)
        script = "import sys; sys.stderr.buffer.write(b'Zugriff verweigert: \\x81\\n'); sys.exit(1)"
        child = [sys.executable, "-c", script]
        return real_run(child, **kw)

    return run


def test_a_failing_powershell_is_one_line_whatever_its_code_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """S5: decoded strictly, an OEM-code-page message raised UnicodeDecodeError (a traceback);
    S6: New-NetFirewallRule's non-terminating errors are made terminating."""
    seen: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _failing_child(subprocess.run, seen))  # realapi's and win32wmi's
    rule = firewall.plan_rules("S-1-5-21-1-2-3-1001", (3128,))[0]
    with pytest.raises(WinApiError, match="Zugriff verweigert") as e:
        RealWinApi().firewall_add(rule)
    assert "\n" not in str(e.value)
    assert seen[0][-1].startswith("$ErrorActionPreference='Stop'; New-NetFirewallRule")


def test_a_failing_wmi_call_is_one_line_whatever_its_code_page(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _failing_child(subprocess.run, seen))
    with pytest.raises(WinApiError, match="Zugriff verweigert") as e:
        RealWinApi().wmi_namespace_sd("root")
    assert "\n" not in str(e.value) and "GetSD" in seen[0][-1]

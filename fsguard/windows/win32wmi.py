r"""WMI namespace security descriptors through __SystemSecurity GetSD/SetSD (issue 28, H3).

Only the calls: which ACE is servicedeny.py's decision. Through Windows PowerShell 5.1
(`Invoke-WmiMethod`, always present): the binary SD converted by Win32_SecurityDescriptorHelper.
SetSD needs WRITE_DAC on the namespace (administrators: setup is elevated) and keeps only the
non-inherited ACEs of the DACL. https://learn.microsoft.com/en-us/windows/win32/wmisdk/--systemsecurity-setsd
https://learn.microsoft.com/en-us/windows/win32/wmihelper/win32-securitydescriptorhelper
"""

from __future__ import annotations

import os
import subprocess

from sgbase.windows import systools
from sgbase.windows.win32 import Win32Error

_HELPER = "([wmiclass]'root\\cimv2:Win32_SecurityDescriptorHelper')"


def _ps(script: str) -> str:
    script = "$ErrorActionPreference='Stop'; " + script
    # absolute: a bare name is looked for in the current directory first (r5-attack A5)
    argv = [systools.powershell(os.environ), "-NoProfile", "-NonInteractive", "-Command", script]
    # errors="replace": a localized message in the OEM code page must not become a traceback
    r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120, check=False)
    if r.returncode != 0:
        raise Win32Error(r.returncode, (r.stderr.strip().splitlines() or ["PowerShell failed"])[-1])
    return r.stdout.strip()


def _quoted(text: str) -> str:
    if "'" in text or "\n" in text:  # SDDL and namespace names never have them: refuse, never inject
        raise Win32Error(87, f"unexpected character in {text!r}")
    return f"'{text}'"


def get_sd(namespace: str) -> str:
    """The namespace's security descriptor as SDDL (owner, group, DACL)."""
    return _ps(
        f"$r = Invoke-WmiMethod -Namespace {_quoted(namespace)} -Path '__SystemSecurity=@' -Name GetSD; "
        f'if ($r.ReturnValue -ne 0) {{ throw "GetSD returned $($r.ReturnValue)" }}; '
        f"{_HELPER}.BinarySDToSDDL($r.SD).SDDL"
    )


def set_sd(namespace: str, sddl_text: str) -> None:
    """Replace the namespace's security descriptor (the caller edited only its own ACE)."""
    _ps(
        f"$b = {_HELPER}.SDDLToBinarySD({_quoted(sddl_text)}).BinarySD; "
        f"$r = Invoke-WmiMethod -Namespace {_quoted(namespace)} -Path '__SystemSecurity=@' -Name SetSD "
        f'-ArgumentList @(,$b); if ($r.ReturnValue -ne 0) {{ throw "SetSD returned $($r.ReturnValue)" }}'
    )

r"""Absolute paths of the Windows tools sandgate starts as you: never a bare name (r5-attack A5).

CreateProcess without an application name (what CPython's subprocess passes) looks for a bare name in
"the current directory for the parent process" before the system folders and PATH
(https://learn.microsoft.com/en-us/windows/win32/api/processthreadsapi/nf-processthreadsapi-createprocessw).
`sandgate setup` runs elevated from wherever you stand, often a workspace where an earlier run's command
wrote a `powershell.exe`: started by its bare name it would run as an administrator.
"""

from __future__ import annotations

import ntpath
from collections.abc import Mapping

_DEFAULT_ROOT = "C:\\Windows"


def system_root(environ: Mapping[str, str]) -> str:
    """%SystemRoot% from your own environment (`os.environ`; names compared by casefold), if absolute."""
    root = next((v for k, v in environ.items() if k.casefold() == "systemroot"), "")
    return root if ntpath.isabs(root) and not root.startswith("\\\\") else _DEFAULT_ROOT


def powershell(environ: Mapping[str, str]) -> str:
    """Windows PowerShell 5.1, present on every Windows 10/11: `%SystemRoot%\\System32\\WindowsPowerShell\\v1.0`."""
    return ntpath.join(system_root(environ), "System32", "WindowsPowerShell", "v1.0", "powershell.exe")

"""A pytest plugin: every test's call as on the Windows runner, recording what would touch that machine.

Loaded by tests/unit/test_windows_r2ci_unitstep.py into a child pytest (`-p tests.support.winreach`) over
the workflow's unit-step modules. During each test's call sys.platform is "win32", as it is there, and every
call that on Windows would reach the machine itself is recorded: a Win32 binding through `win32.fn` that the
test did not replace with a fake (tests replace the module-level `fn` they need), or a Windows tool started
as a child (powershell, netsh, schtasks...). On Linux those calls fail harmlessly; on the runner, elevated,
they happen: a test that relied on Linux's refusal ran a real `sandgate setup` there (r2-ci C10).
Records go to the JSON-lines file named by SANDGATE_WINREACH_LOG: {"test": nodeid, "reached": [...]}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Generator
from typing import Any

import pytest

from sgbase.windows import win32  # before any module that binds `fn` by name, so they bind the recorder

LOG_VARIABLE = "SANDGATE_WINREACH_LOG"
WINDOWS_TOOLS = frozenset({"powershell", "pwsh", "netsh", "schtasks", "sc", "icacls", "cmd", "net", "wmic", "reg"})
_reached: list[str] = []
_real_fn = win32.fn
_real_popen_init = subprocess.Popen.__init__


def _fn(name: str) -> Any:
    _reached.append(f"win32.fn {name}")
    return _real_fn(name)


def _tool(args: Any) -> str:
    first = args.split()[0] if isinstance(args, str) and args.strip() else args[0] if args else ""
    base = os.path.basename(str(first).replace("\\", "/")).lower()  # a Windows absolute path too (r5-attack A5)
    return base[:-4] if base.endswith(".exe") else base


def _popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
    if _tool(args) in WINDOWS_TOOLS:
        _reached.append(f"subprocess {_tool(args)}")
    _real_popen_init(self, args, *rest, **kw)


win32.fn = _fn
subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    _reached.clear()
    platform = sys.platform
    sys.platform = "win32"
    try:
        yield
    finally:
        sys.platform = platform
    if _reached and os.environ.get(LOG_VARIABLE):
        with open(os.environ[LOG_VARIABLE], "a", encoding="utf-8") as log:
            log.write(json.dumps({"test": item.nodeid, "reached": sorted(set(_reached))}) + "\n")

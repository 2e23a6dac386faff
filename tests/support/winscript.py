"""The verify bodies' own ctypes, run on Linux so their declarations can be compiled against the SDK.

A probe body (selftest/windows/probe*.py SCRIPT) declares its Win32 functions itself, in a string that
runs only inside a real sandbox on Windows: no test reached those declarations, nor the structures
(INPUT, JOBOBJECT_BASIC_PROCESS_ID_LIST) they lay out. `run_script` executes a body here with:
`ctypes.WinDLL` a recorder (each function keeps the argtypes/restype the body set, converts each call's
arguments through ctypes as the real one would, and logs what was passed), `ctypes.wintypes` with
Windows' widths (DWORD and LONG are 4 bytes there, 8 in Linux's wintypes), and `subprocess` answering
without running anything. tests/unit/test_windows_r3sdk_probes.py compiles what was recorded.
"""

from __future__ import annotations

import builtins
import ctypes
import subprocess
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WINTYPES = {
    "BOOL": ctypes.c_int32, "BYTE": ctypes.c_uint8, "WORD": ctypes.c_uint16, "DWORD": ctypes.c_uint32,
    "LONG": ctypes.c_int32, "ULONG": ctypes.c_uint32, "UINT": ctypes.c_uint32, "INT": ctypes.c_int32,
    "HANDLE": ctypes.c_void_p, "HWND": ctypes.c_void_p, "LPVOID": ctypes.c_void_p, "LPCWSTR": ctypes.c_wchar_p,
    "LPWSTR": ctypes.c_wchar_p, "LPCSTR": ctypes.c_char_p, "WPARAM": ctypes.c_uint64, "LPARAM": ctypes.c_int64,
}  # fmt: skip


@dataclass
class Called:
    dll: str
    name: str
    argtypes: tuple[Any, ...] | None  # None: the body declared none (ctypes' default conversion)
    restype: Any
    args: tuple[Any, ...]


@dataclass
class Recording:
    calls: list[Called] = field(default_factory=list)
    structs: dict[str, type] = field(default_factory=dict)
    scope: dict[str, Any] = field(default_factory=dict)  # the body's globals after it ran (its constants)


class _Function:
    def __init__(self, dll: str, name: str, log: Recording, answer: Callable[[str], Any]) -> None:
        self.dll, self.name, self.log, self.answer = dll, name, log, answer
        self.argtypes: Any = None
        self.restype: Any = ctypes.c_int

    def __call__(self, *args: Any) -> Any:
        if self.argtypes is not None:  # ctypes' own conversion, as the real call does (wrong type: ArgumentError)
            proto = ctypes.CFUNCTYPE(self.restype, *self.argtypes)
            proto(lambda *_: None if self.restype is None else 0)(*args)
        argtypes = None if self.argtypes is None else tuple(self.argtypes)
        self.log.calls.append(Called(self.dll, self.name, argtypes, self.restype, args))
        return self.answer(self.name)


class _Dll:
    def __init__(self, name: str, log: Recording, answer: Callable[[str], Any]) -> None:
        self._name, self._log, self._answer = name, log, answer
        self._fns: dict[str, _Function] = {}

    def __getattr__(self, name: str) -> _Function:
        if name.startswith("_"):
            raise AttributeError(name)
        fns: dict[str, _Function] = self.__dict__["_fns"]
        return fns.setdefault(name, _Function(self._name, name, self._log, self._answer))


def _ctypes(log: Recording, answer: Callable[[str], Any]) -> types.ModuleType:
    shim = types.ModuleType("ctypes")
    shim.__dict__.update({k: v for k, v in vars(ctypes).items() if not k.startswith("__")})
    wintypes = types.ModuleType("ctypes.wintypes")
    wintypes.__dict__.update(WINTYPES)
    shim.__dict__.update(
        WinDLL=lambda name, use_last_error=False: _Dll(name, log, answer),
        get_last_error=lambda: 5,
        wintypes=wintypes,
    )
    return shim


def _subprocess() -> types.ModuleType:
    fake = types.ModuleType("subprocess")

    class Popen:
        pid = 4711

        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def kill(self) -> None:
            pass

    fake.__dict__.update(
        run=lambda a, **k: subprocess.CompletedProcess(a, 0, "0 4712\n", ""),
        Popen=Popen,
        TimeoutExpired=subprocess.TimeoutExpired,
    )
    return fake


def run_script(source: str, answer: Callable[[str], Any]) -> Recording:
    """Execute `source` (in the caller's working directory) with the recording ctypes; what it called."""
    log = Recording()
    fakes = {"ctypes": _ctypes(log, answer), "subprocess": _subprocess()}
    real_import = builtins.__import__

    def importer(name: str, *a: Any, **k: Any) -> Any:
        if name in fakes:
            return fakes[name]
        if name == "ctypes.wintypes":
            return fakes["ctypes"]
        return real_import(name, *a, **k)

    scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": {**vars(builtins), "__import__": importer}}
    exec(compile(source, "<probe body>", "exec"), scope)
    log.structs = {
        k: v
        for k, v in scope.items()
        if isinstance(v, type) and issubclass(v, ctypes.Structure) and v is not ctypes.Structure
    }
    log.scope = scope
    return log

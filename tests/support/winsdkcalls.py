"""The call table's deeper contract against mingw-w64's SDK (round three of issue 28's static verification).

winsdk.py compares each argument's and result's size and kind. Same size is not the same thing: a
`c_wchar_p` for an ANSI `LPCSTR` (an A function named for a W one), a `POINTER(DWORD)` for a `PHANDLE`,
a status-returning function declared and checked as BOOL (success read as failure), a function the
named DLL does not export, all pass a size check and fail the first real call. So, also compiled:

- each pointer argument's pointee: `c_wchar_p` must point at WCHAR, `c_char_p` at CHAR, `POINTER(T)` at
  something of T's Windows size (or void: an untyped buffer);
- each result's typedef against the failure convention the product checks it with (`CONVENTIONS`);
- each argument a wrapper really passed (recorded while ctypes converted it): a `byref(x)` or an
  array must be the size the SDK's pointee is, an integer must fit its declared width;
- each name in the named DLL's mingw-w64 import library (its .def: the DLL's exports).
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from tests.support import winsdk

PRELUDE = """
template <class T> using pointee = std::remove_cv_t<std::remove_pointer_t<std::remove_reference_t<T>>>;
// 0: void (an untyped buffer), 1: incomplete (nothing to compare), else sizeof + 2
template <class P> constexpr std::size_t pointee_size() {
  using T = pointee<P>;
  if constexpr (std::is_void_v<T> || std::is_function_v<T>) return 0;
  else if constexpr (requires { sizeof(T); }) return sizeof(T) + 2;
  else return 1;
}
template <class P> constexpr bool points_at(std::size_t n) {
  constexpr std::size_t s = pointee_size<P>();
  return s == 0 || s == 1 || s == 3 || s == n + 2;  // void, incomplete, a BYTE buffer (LPBYTE), or n bytes
}
template <class P> constexpr bool wide() { return std::is_same_v<pointee<P>, wchar_t>; }
template <class P> constexpr bool narrow() { return std::is_same_v<pointee<P>, char>; }
"""

#: How the product reads a call's result -> the SDK result type that convention needs. BOOL: 0 is failure,
#: GetLastError says why. HANDLE: NULL (or INVALID_HANDLE_VALUE where documented) is failure, GetLastError
#: says why. STATUS: the result is the error code itself (0 success; DWORD, LSTATUS, NET_API_STATUS).
#: HRESULT: negative is failure. NTSTATUS: non-zero, through LsaNtStatusToWinError. VALUE: a DWORD with
#: its own failure value ((DWORD)-1, WAIT_FAILED) or none. FREED: LocalFree's HLOCAL (NULL: freed). VOID:
#: nothing to read.
TYPES = {
    "BOOL": "std::is_same_v<@, BOOL>",
    "HANDLE": "std::is_pointer_v<@>",
    "STATUS": "std::is_same_v<@, DWORD> || std::is_same_v<@, LSTATUS>",
    "HRESULT": "std::is_same_v<@, HRESULT>",
    "NTSTATUS": "std::is_same_v<@, NTSTATUS>",
    "VALUE": "std::is_same_v<@, DWORD> || std::is_same_v<@, ULONG>",
    "FREED": "std::is_pointer_v<@>",
    "VOID": "std::is_void_v<@>",
}


def _is_ptr(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, ctypes._Pointer)


def pointee_checks(calls: Iterable[Any], skip: set[str]) -> list[str]:
    out = []
    for c in calls:
        if c.name in skip:
            continue
        for i, t in enumerate(c.argtypes):
            a = f"fn<decltype(&{c.name})>::arg<{i}>"
            where = f"{c.name}: argument {i + 1}"
            if t is ctypes.c_wchar_p:
                out.append(f'static_assert(wide<{a}>(), "{where} is a wide (W) string");')
            elif t is ctypes.c_char_p:
                out.append(f'static_assert(narrow<{a}>(), "{where} is a narrow (A) string");')
            elif _is_ptr(t):
                size = winsdk.layout(t._type_).size
                out.append(f'static_assert(points_at<{a}>({size}), "{where} points at {size} bytes");')
                if t._type_ is ctypes.c_wchar_p:
                    out.append(f'static_assert(wide<pointee<{a}>>(), "{where} points at a wide (W) string");')
    return out


def result_checks(calls: Iterable[Any], conventions: dict[str, str], skip: set[str]) -> list[str]:
    out = []
    for c in calls:
        if c.name in skip or c.name not in conventions:
            continue
        conv = conventions[c.name]
        test = TYPES[conv].replace("@", f"fn<decltype(&{c.name})>::ret")
        out.append(f'static_assert({test}, "{c.name}: the result is read as {conv}");')
    return out


@dataclass(frozen=True)
class Passed:
    """One argument a wrapper passed, as ctypes' conversion saw it."""

    call: str
    index: int
    pointee: Any  # the ctypes type a byref/array/pointer points at (None: not a pointer)
    elements: bool  # pointee is an array's element: the SDK's pointee may be one of them


def passed(call: str, args: Sequence[Any]) -> list[Passed]:
    out = []
    for i, a in enumerate(args):
        if type(a).__name__ == "CArgObject":  # byref(x)
            x = a._obj
            if isinstance(x, ctypes.Array):
                out.append(Passed(call, i, type(x)._type_, True))
            else:
                out.append(Passed(call, i, type(x), False))
        elif isinstance(a, ctypes.Array):
            out.append(Passed(call, i, type(a)._type_, True))
    return out


def recorded_checks(seen: Iterable[Passed]) -> list[str]:
    out = []
    for p in sorted(set(seen), key=lambda p: (p.call, p.index, str(p.pointee))):
        size = winsdk.layout(p.pointee).size
        a = f"fn<decltype(&{p.call})>::arg<{p.index}>"
        what = "an array of" if p.elements else "a"
        msg = f"{p.call}: argument {p.index + 1} was passed {what} {p.pointee.__name__} ({size} bytes)"
        if p.elements:  # a buffer: the SDK's pointee is one element, or a byte/char buffer of any length
            cond = f"points_at<{a}>({size}) || points_at<{a}>(1) || points_at<{a}>(2)"
        else:
            cond = f"points_at<{a}>({size})"
        out.append(f'static_assert({cond}, "{msg}");')
    return out


def int_fits(t: Any, value: int) -> bool:
    """ctypes truncates an int silently to the declared width (a 64-bit HANDLE through c_int32)."""
    lay = winsdk.layout(t)
    bits = 8 * lay.size
    return -(1 << (bits - 1)) <= value < (1 << bits)


@cache
def exports(dll: str) -> frozenset[str]:
    """The names mingw-w64's import library for `dll` defines (from the DLL's .def: its exports)."""
    nm = shutil.which("x86_64-w64-mingw32-nm")
    assert nm, "x86_64-w64-mingw32-nm is missing: run `.ci/setup --test` (binutils-mingw-w64-x86-64)"
    lib = f"/usr/x86_64-w64-mingw32/lib/lib{dll.lower()}.a"
    r = subprocess.run([nm, lib], capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"{lib}: {r.stderr.strip()}"
    return frozenset(re.findall(r"^[0-9a-f]+ I __imp_(\w+)$", r.stdout, re.M))


def translation_unit(body: list[str]) -> str:
    head = winsdk.HEAD + "".join(f"#include <{h}>\n" for h in winsdk.HEADERS)
    return head + winsdk.PRELUDE + PRELUDE + "\n".join(body) + "\n"


@dataclass(frozen=True)
class _Declared:
    name: str
    argtypes: tuple[Any, ...]
    restype: Any


def script_checks(called: Iterable[Any]) -> list[str]:
    """A probe body's calls (winscript.Called): declared prototypes as the call table's are checked;
    undeclared ones by what ctypes' default conversion makes of each value (int -> a 4-byte int,
    None -> NULL, str -> a wide string, a ctypes instance -> its own type), and the default c_int
    result (a HANDLE read through it would lose its upper half)."""
    out: list[str] = []
    done: set[tuple[str, int]] = set()
    for c in called:
        if (c.name, len(c.args)) in done:
            continue
        done.add((c.name, len(c.args)))
        f = f"fn<decltype(&{c.name})>"
        if c.argtypes is not None:
            d = _Declared(c.name, c.argtypes, c.restype)
            out += winsdk.call_checks(winsdk.Bindings(calls=[d]), set()) + pointee_checks([d], set())
            out += recorded_checks(passed(c.name, c.args))
            continue
        out.append(f'static_assert({f}::arity == {len(c.args)}, "{c.name}: called with {len(c.args)} arguments");')
        out += winsdk._signature(f, c.name, (), c.restype, 0)
        for i, v in enumerate(c.args):
            a, where = f"{f}::arg<{i}>", f"{c.name}: argument {i + 1}"
            if isinstance(v, int):  # bool too: ctypes passes a C int
                cond, what = f"kind<{a}>() == 0 && size<{a}>() <= 4", "a Python int (passed as a 4-byte int)"
            elif v is None:
                cond, what = f"kind<{a}>() == 1", "None (NULL)"
            elif isinstance(v, str):
                cond, what = f"wide<{a}>()", "a str (a wide string)"
            elif isinstance(v, ctypes._SimpleCData):
                lay = winsdk.layout(type(v))
                cond, what = f"kind<{a}>() == {lay.kind} && size<{a}>() == {lay.size}", type(v).__name__
            else:
                continue  # byref and arrays: recorded_checks below
            out.append(f'static_assert({cond}, "{where} is {what}");')
        out += recorded_checks(passed(c.name, c.args))
    return out


def failures(body: list[str], tmp: Any, extra: str = "") -> list[str]:
    """Compile `body` against the SDK; the failed asserts (any other compiler error fails the caller)."""
    gxx = shutil.which("x86_64-w64-mingw32-g++")
    assert gxx, "x86_64-w64-mingw32-g++ is missing: run `.ci/setup --test` (it installs g++-mingw-w64-x86-64)"
    src = tmp / "sdkcalls.cpp"
    src.write_text(extra + translation_unit(body))
    cmd = [gxx, *winsdk.DEFINES, "-std=c++20", "-fsyntax-only", "-fmax-errors=0", "-Wno-invalid-offsetof", str(src)]
    err = subprocess.run(cmd, capture_output=True, text=True, env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}).stderr
    other = [line for line in err.splitlines() if " error: " in line and "static assertion failed" not in line]
    assert not other, "the generated checks do not compile:\n" + "\n".join(other[:20])
    return winsdk.failed_asserts(err)

"""A static check of the Windows bindings against the real SDK headers (mingw-w64), from Linux.

The Windows backend has never run where it is tested: its ctypes declarations are the one place a
slip (a field too narrow, an argument missing, a constant mistyped, a GUID off by a digit) reaches
Windows unseen, and such a slip fails the first real run or, worse, passes wrong values to the
firewall. So this module turns what the bindings declare into one C++ translation unit of
`static_assert`s over the SDK's own declarations, which x86_64-w64-mingw32-g++ checks:

- every structure: its size and alignment as Windows lays it out (computed here, LLP64, from the
  ctypes fields: ctypes on Linux would lay out c_wchar and c_long differently), and the offset of every
  field whose name the SDK's structure also has;
- every function of the call table: its arity, and each argument's and the result's size and kind
  (pointer, integer, floating, aggregate, void);
- every UPPER_CASE integer constant of the binding modules that the SDK also names: its value.

Not here: WFP's layer and condition GUIDs and its FWPM_*_FLAG_* values, which mingw-w64's headers
do not carry (the test names them).

Names the SDK does not know are ours (derived masks, our own limits): a first compile finds them and
they are left out; `Report` lists what was checked, so a test can tell a check from a vacuous pass.

Deeper (round three, r3-sdk): winsdkcalls.py compiles what a size cannot show (pointees, W vs A,
result typedefs against the failure convention, DLL exports, what wrappers really passed);
winscript.py runs the verify bodies' own ctypes; winmarshal.py drives every wrapper through ctypes'
conversion and each documented failure. Tests: tests/unit/test_windows_r3sdk_*.py.
"""

from __future__ import annotations

import ctypes
import importlib
import pkgutil
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

#: Windows 10 (the oldest the backend supports): mingw's default target is older and hides WFP's flags.
DEFINES = ("-D_WIN32_WINNT=0x0A00", "-DWINVER=0x0A00", "-DNTDDI_VERSION=0x0A000000")
#: ntstatus.h's STATUS_* beside windows.h's subset: the documented WIN32_NO_STATUS dance. CINTERFACE: COM
#: interfaces as C vtables (`<iface>Vtbl`), what method_checks compares the slots with.
HEAD = (
    "#define CINTERFACE\n#define WIN32_NO_STATUS\n#include <windows.h>\n#undef WIN32_NO_STATUS\n#include <ntstatus.h>\n"
)
HEADERS = (
    "winsock2.h",
    "windows.h",
    "fwpmu.h",
    "ntsecapi.h",
    "lm.h",
    "userenv.h",
    "sddl.h",
    "aclapi.h",
    "wtsapi32.h",
    "shlobj.h",
    "wincrypt.h",
    "dpapi.h",
    "tlhelp32.h",
    "taskschd.h",
)
PRELUDE = """
#include <cstddef>
#include <tuple>
#include <type_traits>
template <class F> struct fn;
template <class R, class... A> struct fn<R (*)(A...)> {
  using ret = R;
  static constexpr std::size_t arity = sizeof...(A);
  template <std::size_t i> using arg = std::tuple_element_t<i, std::tuple<A...>>;
};
// 0 integer (or enum), 1 pointer, 2 floating, 3 aggregate, 9 void; a C++ reference (REFCLSID) is passed as a pointer
template <class T> constexpr int kind() {
  if constexpr (std::is_void_v<T>) return 9;
  else if constexpr (std::is_pointer_v<T> || std::is_reference_v<T>) return 1;
  else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) return 0;
  else if constexpr (std::is_floating_point_v<T>) return 2;
  else return 3;
}
template <class T> constexpr std::size_t size() {
  if constexpr (std::is_void_v<T>) return 0;
  else if constexpr (std::is_reference_v<T>) return sizeof(void*);
  else return sizeof(T);
}
"""
KINDS = {0: "integer", 1: "pointer", 2: "floating", 3: "aggregate", 9: "void"}
#: ctypes type codes -> (size, alignment, kind) on Windows x64. 'l'/'L' are c_long/c_ulong on Linux, which
#: is also what c_ssize_t/c_size_t are there: read as size_t; `ambiguous_types` refuses modules that
#: name c_long/c_ulong/wintypes themselves (4 bytes on Windows, 8 here: no layout computed on Linux is right).
_SIMPLE = {
    "c": (1, 1, 0), "b": (1, 1, 0), "B": (1, 1, 0), "?": (1, 1, 0),
    "h": (2, 2, 0), "H": (2, 2, 0), "u": (2, 2, 0),
    "i": (4, 4, 0), "I": (4, 4, 0), "f": (4, 4, 2),
    "l": (8, 8, 0), "L": (8, 8, 0), "q": (8, 8, 0), "Q": (8, 8, 0), "d": (8, 8, 2),
    "z": (8, 8, 1), "Z": (8, 8, 1), "P": (8, 8, 1),
}  # fmt: skip
_CONST = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")


@dataclass(frozen=True)
class Layout:
    size: int
    align: int
    kind: int
    offsets: tuple[tuple[str, int], ...] = ()


@dataclass
class Bindings:
    """What the binding modules declare, collected by importing them."""

    modules: list[ModuleType] = field(default_factory=list)
    structs: dict[str, type] = field(default_factory=dict)  # SDK-style name -> ctypes class
    calls: list[Any] = field(default_factory=list)  # the Call records of the call table
    methods: list[Any] = field(default_factory=list)  # COM vtable Method records (win32tasks.METHODS)
    constants: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (value, module)


def windows_modules(packages: tuple[str, ...]) -> list[ModuleType]:
    """Every module of the Windows backend, wherever the layout puts it (a `windows` package)."""
    found: list[ModuleType] = []
    for name in packages:
        pkg = importlib.import_module(name)
        for info in pkgutil.walk_packages(pkg.__path__, name + "."):
            if ".windows" in info.name and not info.ispkg:
                found.append(importlib.import_module(info.name))
    return found


def collect(modules: list[ModuleType]) -> Bindings:
    b = Bindings(modules=modules)
    for mod in modules:
        for name, v in vars(mod).items():
            if isinstance(v, type) and issubclass(v, (ctypes.Structure, ctypes.Union)) and v.__module__ == mod.__name__:
                if not name.startswith("_"):  # _Value, _Context: anonymous unions, checked through their parent
                    b.structs[name] = v
            elif name == "CALLS" and isinstance(v, tuple):
                b.calls.extend(v)
            elif name == "METHODS" and isinstance(v, tuple):
                b.methods.extend(v)
            elif _CONST.match(name) and type(v) is int:
                b.constants.setdefault(name, (v, mod.__name__))
    return b


def ambiguous_types(modules: list[ModuleType]) -> list[str]:
    """Binding modules that name a ctypes type whose width differs between Linux and Windows."""
    bad = []
    for mod in modules:
        src = Path(mod.__file__ or "").read_text(encoding="utf-8")
        if (
            vars(mod).get("CALLS")
            or any(isinstance(v, type) and issubclass(v, ctypes.Structure) for v in vars(mod).values())
        ) and re.search(r"\bc_u?long\b|\bwintypes\b", src):
            bad.append(mod.__name__)
    return bad


def layout(t: Any) -> Layout:
    """The size, alignment and kind of a ctypes type as Windows x64 (LLP64, MSVC packing) lays it out."""
    if t is None:
        return Layout(0, 1, 9)
    if isinstance(t, type) and issubclass(t, ctypes.Array):
        el = layout(t._type_)
        n = int(t._length_)  # type: ignore[call-overload]
        return Layout(el.size * n, el.align, 3)
    if isinstance(t, type) and issubclass(t, (ctypes._Pointer, ctypes._CFuncPtr)):  # type: ignore[attr-defined]
        return Layout(8, 8, 1)
    if isinstance(t, type) and issubclass(t, (ctypes.Structure, ctypes.Union)):
        return _aggregate(t)
    code = getattr(t, "_type_", None)
    if isinstance(code, str) and code in _SIMPLE:
        size, align, kind = _SIMPLE[code]
        return Layout(size, align, kind)
    raise TypeError(f"no Windows layout known for {t!r}")


def _aggregate(t: type) -> Layout:
    union = issubclass(t, ctypes.Union)
    pack = getattr(t, "_pack_", 8) or 8
    off = size = 0
    align = 1
    offsets = []
    for f in t._fields_:  # type: ignore[attr-defined]
        if len(f) != 2:
            raise TypeError(f"{t.__name__}.{f[0]}: bit fields are not laid out here")
        el = layout(f[1])
        a = min(el.align, pack)
        align = max(align, a)
        start = 0 if union else (off + a - 1) // a * a
        offsets.append((f[0], start))
        off = start + el.size
        size = max(size, off)
    return Layout((size + align - 1) // align * align, align, 3, tuple(offsets))


def _cname(s: str) -> str:
    return re.sub(r"\W", "_", s)


def struct_checks(b: Bindings, skip: set[str], coverage: bool = False) -> list[str]:
    """Size, alignment, offsets; with `coverage`, also one failing assert per field the SDK names otherwise."""
    out = []
    for name, cls in sorted(b.structs.items()):
        if name in skip:
            continue
        lay = layout(cls)
        out.append(f'static_assert(sizeof({name}) == {lay.size}, "struct {name}: size {lay.size}");')
        out.append(f'static_assert(alignof({name}) == {lay.align}, "struct {name}: alignment {lay.align}");')
        for fname, off in lay.offsets:
            fn = f"chk_{name}_{_cname(fname)}"
            out.append(
                f"template <class T> constexpr int {fn}() {{ if constexpr (requires(T t) {{ t.{fname}; }}) "
                f"return offsetof(T, {fname}) == {off} ? 1 : 0; else return 2; }}"
            )
            out.append(f'static_assert({fn}<{name}>() != 0, "struct {name}: field {fname} at offset {off}");')
            if coverage:
                out.append(f'static_assert({fn}<{name}>() != 2, "unnamed:{name}.{fname}");')
    return out


def call_checks(b: Bindings, skip: set[str]) -> list[str]:
    out = []
    for c in b.calls:
        if c.name in skip:
            continue
        f = f"fn<decltype(&{c.name})>"
        out.append(f'static_assert({f}::arity == {len(c.argtypes)}, "{c.name}: {len(c.argtypes)} arguments");')
        out += _signature(f, c.name, c.argtypes, c.restype, 0)
    return out


def _signature(f: str, where: str, argtypes: Sequence[Any], restype: Any, first: int) -> list[str]:
    """Each argument's (from index `first` of `f`'s) and the result's size and kind."""
    out = []
    for i, t in enumerate(argtypes, start=first):
        lay = layout(t)
        what = f"{where}: argument {i + 1 - first} is {lay.size} bytes, {KINDS[lay.kind]}"
        out.append(f'static_assert(size<{f}::arg<{i}>>() == {lay.size}, "{what}");')
        out.append(f'static_assert(kind<{f}::arg<{i}>>() == {lay.kind}, "{what}");')
    r = layout(restype)
    what = f"{where}: result is {r.size} bytes, {KINDS[r.kind]}"
    out.append(f'static_assert(size<{f}::ret>() == {r.size} && kind<{f}::ret>() == {r.kind}, "{what}");')
    return out


def method_checks(b: Bindings) -> list[str]:
    """COM methods called by vtable slot: the slot's offset in the SDK's C vtable (`<iface>Vtbl`,
    declared under CINTERFACE), the arity with `this`, each argument's and the result's size and kind."""
    out = []
    for m in b.methods:
        vt, f = f"{m.iface}Vtbl", f"fn<decltype({m.iface}Vtbl::{m.name})>"
        where = f"{m.iface}::{m.name}"
        out.append(f'static_assert(offsetof({vt}, {m.name}) == {8 * m.slot}, "{where}: vtable slot {m.slot}");')
        out.append(f'static_assert({f}::arity == {len(m.argtypes) + 1}, "{where}: {len(m.argtypes)} arguments");')
        out += _signature(f, where, m.argtypes, m.restype, 1)  # argument 0 is `this`
    return out


#: Our names for constants the SDK spells in mixed case.
SDK_SPELLING = {"NERR_SUCCESS": "NERR_Success", "NERR_USER_NOT_FOUND": "NERR_UserNotFound"}


def constant_checks(b: Bindings, skip: set[str]) -> list[str]:
    """Compared at the SDK constant's own width: an HRESULT macro is a negative 32-bit int, our value its bits."""
    return [
        f"static_assert(((unsigned long long)({c}) & (sizeof({c}) <= 4 ? 0xFFFFFFFFull : ~0ull)) == "
        f'{v & (2**64 - 1)}ull, "constant {n} = {v:#x} ({m})");'
        for n, (v, m) in sorted(b.constants.items())
        for c in (SDK_SPELLING.get(n, n),)
        if n not in skip
    ]


def translation_unit(b: Bindings, skip: set[str], coverage: bool = False) -> str:
    head = HEAD + "".join(f"#include <{h}>\n" for h in HEADERS)
    body = struct_checks(b, skip, coverage) + call_checks(b, skip) + method_checks(b) + constant_checks(b, skip)
    return head + PRELUDE + "\n".join(body) + "\n"


def undeclared(stderr: str) -> set[str]:
    """Names the SDK does not declare (ours), from g++'s errors."""
    q = "['\u2018\u2019]"  # g++ quotes with \u2018...\u2019 under a UTF-8 locale
    pats = (rf"{q}(\w+){q} was not declared in this scope", rf"{q}(\w+){q} does not name a type")
    return {m for p in pats for m in re.findall(p, stderr)}


def failed_asserts(stderr: str) -> list[str]:
    return re.findall(r"static assertion failed: (.*)", stderr)

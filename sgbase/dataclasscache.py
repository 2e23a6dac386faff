"""The code `dataclasses` generates, compiled once per installation instead of at every start.

Every `@dataclass` compiles its generated methods from source text at import (`exec(txt, ...)`
in the stdlib module, once per method): on CPython 3.12 that is ~0.6 ms per class, about 40 % of
what `sandgate run` spends importing its ~40 records. `install()` gives the dataclasses module a
private `exec` that looks the text up in a table of code objects (marshal, like a .pyc) kept in
the launcher's own __pycache__, and compiles only what the table lacks.

Why it is still exact: the key is the whole source text and the value is what `compile` makes of
that text (no inherited flags, the filename `exec` uses), so the function a class gets is the one
the stdlib would have made. Why it is safe: the table sits beside the .pyc files Python already
executes from the same directory, is written only where those are (not under
PYTHONDONTWRITEBYTECODE, not where the directory is not ours to write), is tagged with the
interpreter's bytecode magic number, and a damaged or foreign table is ignored, never trusted in part.

The stdlib module also imports `inspect` (and with it ast, dis, tokenize: ~8 ms) for the one call
it makes per class, `inspect.get_annotations(cls)`. `install()` first puts a stand-in under that
name: it answers that call for a class as inspect does (the class's own `__annotations__`, copied)
and loads the real module on any other use, by anyone, forwarding to it from then on.
"""

from __future__ import annotations

import _frozen_importlib_external as _bootstrap
import marshal
import os
import sys
from types import CodeType, GetSetDescriptorType, ModuleType
from typing import Any

_MAGIC = _bootstrap.MAGIC_NUMBER
_PATH = ""  # set by install()


def table_path(program: str) -> str:
    """One table per program (the launcher's, the daemon's): each start loads only the classes it makes,
    not mitmproxy's hundreds in every `sandgate run`."""
    return os.path.join(
        os.path.dirname(__file__), "__pycache__", f"dataclasses-{program}.{sys.implementation.cache_tag}.marshal"
    )


_table: dict[str, CodeType] = {}
_used: dict[str, CodeType] = {}
_missed = False
MAX_ENTRIES = 4096  # ~6 per class; past this the table is mostly methods of classes since edited


def _exec(source: Any, globals: dict[str, Any] | None = None, locals: dict[str, Any] | None = None, /) -> None:
    """`exec` as dataclasses calls it: the source text's code from the table, compiled on a miss."""
    global _missed
    if not isinstance(source, str):
        exec(source, globals, locals)
        return
    code = _table.get(source)
    if code is None:
        code = compile(source, "<string>", "exec", dont_inherit=True)
        _missed = True
    _used[source] = code
    exec(code, globals, locals)


def _load(path: str) -> dict[str, CodeType]:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[: len(_MAGIC)] != _MAGIC:
            return {}
        table = marshal.loads(data[len(_MAGIC) :])
    except (OSError, ValueError, EOFError, TypeError):
        return {}  # missing, damaged or another interpreter's: compile as the stdlib would
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, CodeType) for k, v in table.items()):
        return {}
    return table


class _Inspect(ModuleType):
    """`inspect` until something needs more than a class's annotations; then the real one, forwarded to."""

    def get_annotations(self, obj: object, **kwargs: Any) -> dict[str, Any]:
        if kwargs or not isinstance(obj, type):
            return dict(_real_inspect().get_annotations(obj, **kwargs))
        ann = obj.__dict__.get("__annotations__", None)  # noqa: RUF063  (this is inspect.get_annotations, for a class)
        if ann is None or isinstance(ann, GetSetDescriptorType):
            return {}
        if not isinstance(ann, dict):
            raise ValueError(f"{obj!r}.__annotations__ is neither a dict nor None")
        return dict(ann)

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_inspect(), name)


_STAND_IN = _Inspect("inspect")


def _real_inspect() -> ModuleType:
    if sys.modules.get("inspect") is _STAND_IN:
        del sys.modules["inspect"]
        try:
            import inspect
        except BaseException:
            sys.modules.setdefault("inspect", _STAND_IN)
            raise
        return inspect
    return sys.modules["inspect"]


def install(path: str) -> None:
    """Route the dataclasses module's `exec` through the table at `path` (before any dataclass is made)."""
    if "dataclasses" not in sys.modules and "inspect" not in sys.modules and sys.version_info[:2] in ((3, 12), (3, 13)):
        sys.modules["inspect"] = _STAND_IN  # the versions whose dataclasses only call get_annotations per class
    import dataclasses

    global _PATH
    _PATH = path
    _table.update(_load(path))
    dataclasses.exec = _exec  # type: ignore[attr-defined]  # a module global shadows the builtin for that module only


def _kept() -> dict[str, CodeType]:
    """What this process used, with what other commands used before (unless the table grew stale: edited code)."""
    merged = {**_table, **_used}
    return merged if len(merged) <= MAX_ENTRIES else dict(_used)


def save() -> None:
    """Write the table of what this process used, if something had to be compiled (atomic, beside the .pyc files)."""
    global _missed
    if not _missed or sys.dont_write_bytecode or not _PATH:
        return
    _missed = False
    tmp = f"{_PATH}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(_PATH), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(_MAGIC + marshal.dumps(_kept()))
        os.replace(tmp, _PATH)  # readers see the old table or the new one, never half of one
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # not ours to write (a root-owned installation run by a user): compile each time, as before

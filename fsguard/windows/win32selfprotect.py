r"""The effects of selfprotect.py: which folders this interpreter loads sandgate's code from, and
the deny ACEs put on them at `sandgate setup`, taken out at `setup --remove`, checked by each run.

Why the folders are read from this interpreter (sys and the packages' own files): setup runs
the same `sandgate` the runs will, and a run of another interpreter finds its folders missing from
the record and is refused (selfprotect.missing). Only local drive paths are real here: on Linux (the
tests) every POSIX path is skipped by selfprotect.plan.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping

from fsguard.windows import sddl, selfprotect
from fsguard.windows.sddl import SddlError
from sgbase.windows.api import FileApi, WinApiError

#: sandgate's top-level packages (pyproject's [tool.setuptools] packages): their parent folder is
#: the package source of an editable install (`pip install -e`: the checkout itself).
PACKAGES = ("launcher", "fsguard", "netguard", "sgbase", "selftest")


def sources() -> tuple[str, ...]:
    """The existing folders this interpreter loads code from: sys.base_prefix, sys.prefix, every
    sys.path directory (not a leading working-directory entry of `python -m`/`-c`: that is wherever
    the user stood), the Scripts folder (CPython's fixed Windows layout, sysconfig's "nt" scheme:
    {prefix}\\Scripts) and the one holding the running `sandgate.exe`, and the folder holding
    sandgate's packages (an editable install's checkout)."""
    path = list(sys.path)
    if path and (path[0] in ("", ".") or _same(path[0], os.getcwd())):
        path = path[1:]
    wanted = [sys.base_prefix, sys.prefix, *path, os.path.join(sys.prefix, "Scripts")]
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            wanted.append(os.path.dirname(os.path.dirname(spec.origin)))
    out = [os.path.abspath(p) for p in wanted if p and os.path.isdir(p)]
    if sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0]):
        here = os.path.dirname(os.path.abspath(sys.argv[0]))
        # r4-setup R2: `python -m launcher.cli` names launcher\cli.py; a folder inside one already listed
        # carries that one's inherited deny, and setup (run as sandgate.exe) never recorded it: never refuse for it
        if not any(_inside(here, d) for d in out):
            out.append(here)
    return tuple(dict.fromkeys(out))


def _inside(path: str, folder: str) -> bool:
    a, b = os.path.normcase(path), os.path.normcase(folder).rstrip("\\/")
    return a == b or a.startswith(b + os.sep)


def _same(a: str, b: str) -> bool:
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def system_dirs(environ: Mapping[str, str]) -> tuple[str, str, str]:
    """%SystemRoot%, %ProgramFiles%, %ProgramFiles(x86)% from the real user's environment (casefold names)."""
    env = {k.casefold(): v for k, v in environ.items()}
    return env.get("systemroot", ""), env.get("programfiles", ""), env.get("programfiles(x86)", "")


def make_plan(api: FileApi) -> selfprotect.SelfPlan:
    """The plan for the interpreter running sandgate (api.code_dirs: RealCodeDirs below, or a fake's)."""
    shared = {k.casefold(): v for k, v in api.environ().items()}.get("programdata", "")
    return selfprotect.plan(api.code_dirs(), api.home(), (*system_dirs(api.environ()), shared))


class RealCodeDirs:
    """The real WinApi's `code_dirs` (a mixin of realapi.RealWinApi)."""

    def code_dirs(self) -> tuple[str, ...]:
        return sources()


def apply(api: FileApi, sid: str, edits: tuple[selfprotect.Edit, ...]) -> int:
    """Each edit's ACE where it is missing (idempotent); returns how many were added.
    SetNamedSecurityInfo propagates a code folder's inherited ACE to the existing tree once, here."""
    added = 0
    for edit in edits:
        current = api.dacl(edit.path)
        if current is None:  # found a moment ago: never record a deny that is not there (fail closed)
            raise WinApiError(f"{edit.path} disappeared while setup ran; run 'sandgate setup' again")
        if not _has(current, edit, sid):
            _write(api, edit.path, current, _edited(selfprotect.applied, current, edit, sid))
            added += 1
    return added


def remove(api: FileApi, sid: str, edits: tuple[selfprotect.Edit, ...]) -> None:
    """Exactly our ACEs out again (reverse order); a folder that is gone is fine."""
    for edit in reversed(edits):
        current = api.dacl(edit.path)
        if current is not None and _has(current, edit, sid):
            _write(api, edit.path, current, _edited(selfprotect.undone, current, edit, sid))


def absent(api: FileApi, sid: str, edits: tuple[selfprotect.Edit, ...]) -> str | None:
    """The first edit whose ACE is not there (one DACL read per folder, no walk); None: all present."""
    for edit in edits:
        current = api.dacl(edit.path)
        if current is None or not _has(current, edit, sid):
            return edit.path
    return None


def _write(api: FileApi, path: str, before: str, after: str) -> None:
    """A guard (this folder only) is written without the walk: SetNamedSecurityInfo would rewrite every
    object below C:\\hostedtoolcache for an ACE none of them inherits (r4-setup R3). A code folder's
    inherited deny needs the walk, once, to reach the files already there."""
    api.set_dacl(path, after, walk=not sddl.same_inheritable(before, after))


def _has(dacl: str, edit: selfprotect.Edit, sid: str) -> bool:
    try:
        return selfprotect.has(dacl, edit, sid)
    except SddlError as e:
        raise WinApiError(f"{edit.path}: {e}") from None


def _edited(how: Callable[[str, selfprotect.Edit, str], str], dacl: str, edit: selfprotect.Edit, sid: str) -> str:
    try:
        return how(dacl, edit, sid)
    except SddlError as e:
        raise WinApiError(f"{edit.path}: {e}") from None

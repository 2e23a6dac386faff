r"""`sandgate verify` on Windows: can the sandbox user plant code where sandgate loads its own
(issue 28, r2-ci C3)? One body, `self_code`, run inside a real sandbox.

Blocked: creating a file in each folder `sandgate setup` denied (selfprotect.py: the interpreter,
site-packages, an editable checkout, Scripts): access denied, or the row fails. Permitted, in the
same run: a file in its own workspace. And the wider gap, shown, never passed: a scratch folder
verify makes directly under the system drive root (as any installer would) inherits the root's
default "Authenticated Users: Modify"; when the sandbox user can write there the row is GAP with
what it saw (docs/windows.md, "Known gaps"): anything else installed that way is as writable.
"""

from __future__ import annotations

import json
import ntpath
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from selftest.windows.probebody import RESULT, ProbeBody, Verdict
from sgbase.windows import state
from sgbase.windows.api import WinApiError

if TYPE_CHECKING:
    from launcher.run.windows.winapi import WinApi

TARGETS = "sandgate-probe-targets.json"  # what prepare found, read by the script from its workspace
MARK = "sandgate-probe-"  # the files the script tries to make (removed by it, or by prepare's undo)

SCRIPT = f"""
import json, os, sys, uuid
# The threat: a file the next `sandgate` (the real user, often elevated) would load. Two ways in:
# a new file (a .pth in site-packages, sitecustomize.py: FILE_ADD_FILE) and a new folder (a package
# shadowing a module: FILE_ADD_SUBDIRECTORY). Either one working counts as "wrote".
def make_file(folder):
    path = os.path.join(folder, {MARK!r} + uuid.uuid4().hex[:8] + ".pth")
    open(path, "xb").close()
    os.remove(path)
    return path
def make_dir(folder):
    path = os.path.join(folder, {MARK!r} + uuid.uuid4().hex[:8])
    os.mkdir(path)
    os.rmdir(path)
    return path
def attempt(folder):
    seen = []
    for how in (make_file, make_dir):
        try:
            return ["wrote", how(folder)]
        except PermissionError as e:  # ERROR_ACCESS_DENIED: the refusal asked for; a sharing or lock
            # violation maps to PermissionError too (CPython PC/errmap.h): os.mkdir keeps its code
            seen.append(["denied" if getattr(e, "winerror", None) in (None, 5) else "error", str(e)[-200:]])
        except OSError as e:  # missing folder, full disk...: proves nothing
            seen.append(["error", str(e)[-200:]])
    return seen[0] if all(s[0] == "denied" for s in seen) else next(s for s in seen if s[0] != "denied")
targets = json.load(open({TARGETS!r}))
result = {{"control": attempt(os.getcwd())[0] == "wrote",
          "protected": {{d: attempt(d) for d in targets["protected"]}},
          "scratch": [targets["scratch"], attempt(targets["scratch"]) if targets["scratch"] else None]}}
json.dump(result, open({RESULT!r}, "w"))
"""


def prepare(api: WinApi, workdir: str) -> Callable[[], None]:
    """As the real user, before the run: the folders setup recorded, and a scratch folder made right
    under the system drive root (inheriting its defaults); returns what removes both."""
    drive = next((v for k, v in api.environ().items() if k.casefold() == "systemdrive"), "C:")
    scratch: str | None = ntpath.join(drive + "\\", f"sandgate-verify-{uuid.uuid4().hex[:8]}")
    try:
        api.make_dir(str(scratch))
    except WinApiError:
        scratch = None  # the row then fails: the gap could not be looked at
    targets = ntpath.join(workdir, TARGETS)
    api.write_file(targets, json.dumps({"protected": _protected(api), "scratch": scratch}).encode())

    def undo() -> None:
        api.remove_file(targets)
        if scratch is not None:
            for name in api.list_dir(scratch):  # left by a killed probe: its file or folder
                if name.startswith(MARK):
                    _remove(api, ntpath.join(scratch, name))
            api.remove_empty_dir(scratch)

    return undo


def _remove(api: WinApi, path: str) -> None:
    try:
        api.remove_file(path)
    except WinApiError:  # a folder (DeleteFile refuses one): the probe's empty package folder
        api.remove_empty_dir(path)


def _protected(api: WinApi) -> list[str]:
    """The code folders setup denied; none without a (readable) setup, whose run is refused anyway."""
    try:
        record = state.decode(api.read_file(state.setup_record(api.local_appdata())) or b"")
    except state.StateError:
        return []
    return [path for path, kind in record.protected if kind == "code"]


def judge(code: int, got: dict[str, Any] | None) -> Verdict:
    if got is None:
        return Verdict(False, f"the probe wrote no result (exit {code}): it did not run")
    if not got.get("control"):
        return Verdict(False, "could not make a file in its own workspace: the probe proves nothing")
    seen = got.get("protected") or {}
    wrote = [d for d, r in seen.items() if r[0] == "wrote"]
    if wrote:
        return Verdict(False, f"the sandbox user made a file in sandgate's own folder {wrote[0]}: run 'sandgate setup'")
    other = [f"{d}: {r[1]}" for d, r in seen.items() if r[0] != "denied"]
    if other:
        return Verdict(False, f"not refused with access denied, proves nothing: {other[0]}")
    scratch, there = (got.get("scratch") or [None, None])[:2]
    if not there:
        return Verdict(False, "verify could not make its scratch folder under the drive root")
    done = f"{len(seen)} of sandgate's own folders refused (access denied); own workspace written"
    if there[0] == "wrote":
        return Verdict(
            False,
            f"{done}; known gap (docs/windows.md): {scratch}, made under the drive root, was writable by the "
            "sandbox user (the root's default Authenticated Users: Modify): so is any tool installed that way",
            gap=True,
        )
    if there[0] != "denied":
        return Verdict(False, f"{done}; the write under the drive root failed for another reason: {there[1]}")
    return Verdict(True, f"{done}; a new folder under the drive root was refused too")


BODIES = (ProbeBody("self_code", "filesystem", SCRIPT, judge, prepare),)

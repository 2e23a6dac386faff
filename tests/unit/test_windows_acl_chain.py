"""win-acl A2: a protected path deeper than one level below a writable root cannot be moved out of
its place by renaming a directory on the way (`.git\\objects\\info` above `alternates`, `src\\conf`
above a user's `src/conf/secrets.yaml`). "To delete or rename a file, you must have either delete
permission on the file, or delete child permission in the parent directory"
(https://learn.microsoft.com/en-us/windows/win32/api/fileapi/nf-fileapi-deletefilea): the root's
Modify grant gives DELETE on every such directory, so the plan must deny it there. Judged by the
NTFS model (tests/support/ntfsmodel.py) as the sandbox user; the matching renames of directories
off those ways work in the same run. Fake evidence only.
"""

from __future__ import annotations

import pytest

from fsguard import policy as fspolicy
from fsguard.windows import acl, aclapply, winpath
from tests.support import ntfsmodel
from tests.support.winfake import APPDATA, BASE_DACL, HOME, WS, FakeWinApi, workspace

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"


def _applied(fs: fspolicy.FsPolicy, api: FakeWinApi) -> ntfsmodel.Ntfs:
    found = acl.candidates(fs, cwd=WS, home=HOME)
    existing = frozenset(winpath.key(p) for p in found if api.exists(p))
    plan = acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=existing)
    aclapply.apply(api, plan, SID, aclapply.Applied(APPDATA + r"\sandgate-chain.jsonl"))
    return ntfsmodel.Ntfs(api.m, SID)


def test_the_folders_above_alternates_cannot_be_renamed_and_a_new_alternates_planted() -> None:
    api = FakeWinApi(workspace())
    box = _applied(fspolicy.FsPolicy(), api)
    info, objects = WS + r"\.git\objects\info", WS + r"\.git\objects"
    assert api.m.files[info + r"\alternates"] == b""  # the placeholder the plan made
    for folder in (info, objects):
        with pytest.raises(ntfsmodel.Denied):
            box.rename(folder, folder + ".old")  # else: mkdir a new info\, write alternates -> elsewhere
    # what git does there in the same run still works: loose objects, their fan-out folders, info\packs
    box.mkdir(objects + r"\ab")
    box.write(objects + r"\ab\cdef", b"blob")
    box.rename(objects + r"\ab", objects + r"\ac")
    box.write(info + r"\packs", b"P pack-1.pack\n")
    assert api.m.files[objects + r"\ac\cdef"] == b"blob" and info + r"\packs" in api.m.files
    with pytest.raises(ntfsmodel.Denied):
        box.write(info + r"\alternates", b"C:\\evil\\objects\n")


def test_a_users_deep_protected_file_keeps_its_folders_in_place() -> None:
    m = workspace()
    for folder in (WS + r"\src", WS + r"\src\conf", WS + r"\src\other"):
        m.dirs.add(folder)
        m.dacls[folder] = BASE_DACL
    m.files[WS + r"\src\conf\secrets.yaml"] = b"token: x\n"
    m.dacls[WS + r"\src\conf\secrets.yaml"] = BASE_DACL
    api = FakeWinApi(m)
    box = _applied(fspolicy.FsPolicy(protect=("src/conf/secrets.yaml",)), api)
    for folder in (WS + r"\src\conf", WS + r"\src"):
        with pytest.raises(ntfsmodel.Denied):
            box.rename(folder, folder + "2")
    with pytest.raises(ntfsmodel.Denied):
        box.write(WS + r"\src\conf\secrets.yaml", b"token: planted\n")
    box.rename(WS + r"\src\other", WS + r"\src\moved")  # a folder off the way: renamed as before
    box.write(WS + r"\src\conf\new.yaml", b"ok\n")  # and the guarded folders stay writable inside
    assert WS + r"\src\moved" in api.m.dirs and api.m.files[WS + r"\src\conf\new.yaml"] == b"ok\n"

"""Issue 28 W8/H2/M6 through the fake WinApi and the NTFS model: placeholders keep their kind, `.git`
itself cannot be renamed away (nor through `.GiT`, `GIT~1`, `::$INDEX_ALLOCATION` or a stream),
and the toolchain on the real user's PATH is readable by the sandbox user."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from fsguard import policy as fspolicy
from fsguard.windows import acl, aclapply, winpath
from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import runner
from selftest.windows import aclprobes, allbodies, probebody
from sgbase.windows import state
from tests.support import ntfsmodel, winprobefakes
from tests.support.winfake import APPDATA, BASE_DACL, HOME, WS, FakeWinApi, Machine, workspace

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"
JOURNAL = APPDATA + r"\sandgate-test.jsonl"
PY = HOME + r"\AppData\Local\Programs\Python\Python312"


def _plan(api: FakeWinApi, reads: tuple[str, ...] = ()) -> acl.AclPlan:
    fs = fspolicy.FsPolicy()
    found = acl.candidates(fs, cwd=WS, home=HOME, read_grants=reads)
    existing = frozenset(winpath.key(p) for p in found if api.exists(p))
    return acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=existing, read_grants=reads)


def _apply(api: FakeWinApi, plan: acl.AclPlan) -> aclapply.Applied:
    applied = aclapply.Applied(JOURNAL)
    aclapply.apply(api, plan, SID, applied)
    return applied


def _machine(*, everyone_full: bool = False) -> Machine:
    """The fake's workspace; `everyone_full`: Authenticated Users hold Full Control there (FILE_DELETE_CHILD
    included), as on folders made under a permissive root: the guards must not depend on Modify alone."""
    m = workspace()
    if everyone_full:
        for path in list(m.dacls):
            if winpath.key(path).startswith(winpath.key(WS)):
                m.dacls[path] = BASE_DACL + "(A;OICIID;FA;;;AU)"
    return m


# W8 ------------------------------------------------------------------------------------------


def test_missing_protected_files_get_file_placeholders_and_git_keeps_working() -> None:
    api = FakeWinApi(_machine())
    before = api.snapshot()
    plan = _plan(api)
    kinds = {s.path: (s.kind, s.text) for s in plan.steps if s.placeholder}
    assert kinds[WS + r"\.git\commondir"] == ("file", ".\n")  # git dies on an empty commondir
    assert kinds[WS + r"\.git\config.worktree"] == ("file", "")
    assert kinds[WS + r"\.git\objects\info\alternates"] == ("file", "")
    assert kinds[WS + r"\.git\info"] == ("dir", "") and kinds[WS + r"\.idea"] == ("dir", "")
    applied = _apply(api, plan)
    assert api.violations == []  # git's layout holds while the run is active
    assert api.m.files[WS + r"\.git\commondir"] == b".\n"
    assert WS + r"\.git\objects\info" in api.m.dirs and WS + r"\.git\commondir" not in api.m.dirs
    aclapply.finish(api, applied, pytest.fail)
    assert api.m.dirs == before.dirs and api.m.files == before.files and api.m.dacls == before.dacls


def test_the_fake_refuses_a_directory_where_git_reads_a_file() -> None:
    """The contract the fake enforces (gitrepository-layout): the old plan's slip fails here."""
    api = FakeWinApi(_machine())
    plan = _plan(api)
    all_dirs = dataclasses.replace(plan, steps=tuple(dataclasses.replace(s, kind="dir") for s in plan.steps))
    _apply(api, all_dirs)
    assert any("commondir is a directory" in v for v in api.violations)


def test_a_file_placeholder_the_real_user_filled_is_kept() -> None:
    api = FakeWinApi(_machine())
    applied = _apply(api, _plan(api))
    api.m.files[WS + r"\.git\config.worktree"] = b"[core]\n"  # the real user's own change meanwhile
    aclapply.finish(api, applied, pytest.fail)
    assert api.m.files[WS + r"\.git\config.worktree"] == b"[core]\n"
    assert WS + r"\.git\commondir" not in api.m.files


# H2 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("everyone_full", [False, True])
def test_git_cannot_be_renamed_away_and_ordinary_work_goes_on(everyone_full: bool) -> None:
    api = FakeWinApi(_machine(everyone_full=everyone_full))
    _apply(api, _plan(api))
    box = ntfsmodel.Ntfs(api.m, SID)
    box.write(WS + r"\new.txt", b"x")  # the permitted counterparts, in the same run
    box.rename(WS + r"\new.txt", WS + r"\renamed.txt")
    box.mkdir(WS + r"\src")
    box.write(WS + r"\.git\index.lock", b"x")
    box.rename(WS + r"\.git\index.lock", WS + r"\.git\index")  # git commit's own rename
    box.write(WS + r"\.git\objects\ab", b"x")
    box.delete(WS + r"\renamed.txt")
    attacks: list[Callable[[], None]] = [
        lambda: box.rename(WS + r"\.git", WS + r"\old-git"),
        lambda: box.rename(WS + r"\.GiT", WS + r"\old-git"),
        lambda: box.rename(WS + r"\GIT~1", WS + r"\old-git"),
        lambda: box.rename(WS + r"\.git::$INDEX_ALLOCATION", WS + r"\old-git"),
        lambda: box.delete(WS + r"\.git\config"),
        lambda: box.rename(WS + r"\.git\hooks", WS + r"\.git\old-hooks"),
        lambda: box.write(WS + r"\.GIT\HOOKS\pre-commit", b"evil"),
        lambda: box.write(WS + r"\.git\config:evil", b"evil"),
        lambda: box.write(WS + r"\GIT~1\config", b"evil"),
        lambda: box.mkdir(WS + r"\.git\hooks\x::$INDEX_ALLOCATION"),
        lambda: box.rename(WS + r"\.vscode", WS + r"\old-vscode"),
        lambda: box.rename(WS, WS + "-old"),  # the workspace itself, then a new one with a .git
    ]
    for attack in attacks:
        with pytest.raises(ntfsmodel.Denied):
            attack()
    assert WS + r"\.git\config" in api.m.dacls and WS + r"\.git" in api.m.dirs


def test_without_the_guards_git_is_renamed_away() -> None:
    """What H2 found: the plan before issue 28 let the sandbox user move `.git` (DELETE from the
    inherited Modify, add-subdirectory on the workspace) and plant a new one."""
    api = FakeWinApi(_machine())
    plan = _plan(api)
    _apply(api, dataclasses.replace(plan, steps=tuple(s for s in plan.steps if s.why != "guard")))
    box = ntfsmodel.Ntfs(api.m, SID)
    box.rename(WS + r"\.git", WS + r"\old-git")
    box.mkdir(WS + r"\.git")
    box.mkdir(WS + r"\.git\hooks")
    box.write(WS + r"\.git\hooks\post-checkout", b"evil")
    assert WS + r"\.git\hooks\post-checkout" in api.m.files


def test_the_verify_probe_bodies_pass_on_the_plan_and_catch_the_old_one() -> None:
    api = FakeWinApi(_machine())
    _apply(api, _plan(api))
    ops = ntfsmodel.ModelFsOps(ntfsmodel.Ntfs(api.m, SID))
    results = aclprobes.probe_all(WS, ops)
    assert [r.name for r in results] == ["git_rename", "alternate_data_stream", "case_variant", "short_name"]
    assert all(r.ok for r in results), [r.lines for r in results]
    assert sum(len(r.lines) for r in results) == 19  # every check ran (short names: modelled as on)
    assert not any(p.startswith(WS + "\\" + aclprobes.PROBE) for p in (*api.m.files, *api.m.dirs))

    old = FakeWinApi(_machine())
    plan = _plan(old)
    _apply(old, dataclasses.replace(plan, steps=tuple(s for s in plan.steps if s.why != "guard")))
    found = {r.name: r for r in aclprobes.probe_all(WS, ntfsmodel.ModelFsOps(ntfsmodel.Ntfs(old.m, SID)))}
    assert not found["git_rename"].ok and not found["case_variant"].ok and not found["short_name"].ok
    assert any("IT WORKED" in line for line in found["git_rename"].lines)
    assert WS + r"\.git" in old.m.dirs  # every rename that worked was undone at once
    assert not any(p.startswith(WS + "\\" + aclprobes.PROBE) for p in (*old.m.files, *old.m.dirs))


def test_short_name_probe_without_aliases_says_so() -> None:
    api = FakeWinApi(_machine())
    _apply(api, _plan(api))
    ops = ntfsmodel.ModelFsOps(ntfsmodel.Ntfs(api.m, SID, short_names=False))
    short = aclprobes.probe_all(WS, ops)[-1]
    assert short.ok and short.lines == ["no 8.3 aliases here"]


def test_a_probe_that_fails_for_another_reason_is_not_a_pass() -> None:
    def missing(_: aclprobes.FsOps) -> None:
        raise FileNotFoundError("gone")

    res = aclprobes.run("x", [aclprobes.Check("attack", "blocked", missing)], ntfsmodel.ModelFsOps(None))  # type: ignore[arg-type]
    assert not res.ok and "another reason" in res.lines[0]


# M6 ------------------------------------------------------------------------------------------


def test_toolchain_dirs_on_the_path_are_read_granted_and_nothing_broader() -> None:
    env = {
        "Path": ";".join(
            [
                r"C:\Windows\system32",
                PY,
                HOME + r"\AppData\Local",
                HOME,
                HOME + r"\.ssh\bin",
                HOME + r"\missing\bin",
                "relative",
                "",
            ]
        )
    }
    reads = acl.toolchain_dirs(env, HOME)
    assert reads == (PY, HOME + r"\.ssh\bin", HOME + r"\missing\bin")
    m = _machine()
    for p in (HOME + r"\AppData", HOME + r"\AppData\Local\Programs", HOME + r"\AppData\Local\Programs\Python", PY):
        m.dirs.add(p)
        m.dacls[p] = BASE_DACL
    m.dirs.add(HOME + r"\.ssh\bin")
    m.dacls[HOME + r"\.ssh\bin"] = BASE_DACL
    m.files[PY + r"\python.exe"], m.dacls[PY + r"\python.exe"] = b"MZ", BASE_DACL
    api = FakeWinApi(m)
    plan = _plan(api, reads)
    assert [s.path for s in plan.steps if s.why == "read"] == [PY]  # not under a denied path, not missing
    _apply(api, plan)
    box = ntfsmodel.Ntfs(api.m, SID)
    assert box.allowed(PY + r"\python.exe", acl.READ_EXECUTE)
    assert not box.allowed(HOME + r"\.ssh\bin", 0x1)  # still denied: the grant was dropped
    assert not box.allowed(HOME + r"\AppData\Local\other", 0x1)


def test_a_gitdir_file_is_protected_itself_and_nothing_is_planted_under_it() -> None:
    """A linked worktree's or submodule's `.git` is a file naming the git directory: rewritten, it
    sends the real user's git to planted hooks; as a parent it cannot hold placeholders."""
    m = workspace()
    for p in [p for p in m.dacls if p.startswith(WS + r"\.git")]:
        del m.dacls[p]
    m.dirs -= {WS + r"\.git", WS + r"\.git\hooks"}
    m.files[WS + r"\.git"], m.dacls[WS + r"\.git"] = b"gitdir: C:/src/main/.git/worktrees/proj\n", BASE_DACL
    api = FakeWinApi(m)
    plan = _plan(api)
    assert not any(s.path.startswith(WS + "\\.git\\") for s in plan.steps)
    step = next(s for s in plan.steps if s.path == WS + r"\.git")
    assert (step.ace.mask, step.ace.inherit, step.placeholder) == (acl.DENY_WRITE, "", False)
    _apply(api, plan)
    assert api.violations == []
    box = ntfsmodel.Ntfs(api.m, SID)
    box.write(WS + r"\other.txt", b"x")  # permitted, same run
    attacks: list[Callable[[], None]] = [
        lambda: box.write(WS + r"\.git", b"gitdir: C:/evil\n"),
        lambda: box.write(WS + r"\.GIT:evil", b"x"),
        lambda: box.rename(WS + r"\.git", WS + r"\old-git"),
        lambda: box.delete(WS + r"\GIT~1"),
    ]
    for attack in attacks:
        with pytest.raises(ntfsmodel.Denied):
            attack()


def test_the_real_file_operations_undo_every_attack_that_worked(tmp_path: Path) -> None:
    """On a plain Linux folder nothing is protected: the probes must say so, and leave the
    repository as they found it (each attack that worked undone at once)."""
    from selftest.windows import win32probefs

    class NoAliases(win32probefs.OsFsOps):
        def short_alias(self, path: str) -> str | None:
            return None  # GetShortPathNameW is Windows'

    ws = str(tmp_path)
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / ".git" / "config").write_text("[core]\n")
    found = {r.name: r for r in aclprobes.probe_all(ws.replace("/", "\\"), _Posix(NoAliases()))}
    assert not found["git_rename"].ok and any("IT WORKED" in line for line in found["git_rename"].lines)
    assert (tmp_path / ".git" / "config").read_text() == "[core]\n" and (tmp_path / ".git" / "hooks").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".git"]


class _Posix:
    """Backslash paths of the probes onto a POSIX folder (the probes build paths with ntpath)."""

    def __init__(self, ops: aclprobes.FsOps) -> None:
        self.ops = ops

    def read(self, path: str) -> bytes:
        return self.ops.read(path.replace("\\", "/"))

    def write(self, path: str, data: bytes) -> None:
        self.ops.write(path.replace("\\", "/"), data)

    def mkdir(self, path: str) -> None:
        self.ops.mkdir(path.replace("\\", "/"))

    def rename(self, src: str, dst: str) -> None:
        self.ops.rename(src.replace("\\", "/"), dst.replace("\\", "/"))

    def delete(self, path: str) -> None:
        self.ops.delete(path.replace("\\", "/"))

    def short_alias(self, path: str) -> str | None:
        return self.ops.short_alias(path.replace("\\", "/"))

    def is_dir(self, path: str) -> bool:
        return self.ops.is_dir(path.replace("\\", "/"))


# the verify rows end to end: `sandgate verify` through launcher.cli, the backend and the fake


@pytest.fixture
def verify_machine(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    fake = FakeWinApi()
    fake.program = winprobefakes.program
    fake.m.files[fake.python()] = b"MZ"
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    return fake


ROWS = "git_rename,alternate_data_stream,case_variant,short_name"


def test_verify_runs_the_acl_rows_and_leaves_the_machine_as_it_was(
    verify_machine: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    before = verify_machine.snapshot()
    assert cli.main(["setup"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", "--only", ROWS]) == 0
    out = capsys.readouterr().out
    for name in ROWS.split(","):
        assert f"ok    {name}" in out
    assert "4 passed, 0 failed" in out and "access denied" in out and "done" in out
    assert cli.main(["setup", "--remove"]) == 0
    after = verify_machine.snapshot()
    assert not verify_machine.violations
    own = state.root(APPDATA)
    assert {p: d for p, d in after.dacls.items() if not p.startswith(own)} == before.dacls
    assert {d for d in after.dirs - before.dirs if not d.startswith(own)} == set()
    assert {f for f in after.files if f not in before.files and not f.startswith(own)} == set()


def test_verify_fails_the_rows_when_git_is_not_guarded(
    verify_machine: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan before issue 28 (no guard on `.git`, its parent or the roots): the rows must say so."""
    monkeypatch.setattr(acl, "_guard_steps", lambda *a: [])
    assert cli.main(["setup"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", "--only", ROWS]) == 1
    out = capsys.readouterr().out
    assert "FAIL  git_rename" in out and "IT WORKED" in out and "ok    alternate_data_stream" not in out


def test_the_body_script_stands_alone_and_writes_its_result(tmp_path: Path) -> None:
    """The script carries aclprobes' and win32probefs' source (no sandgate import inside the
    sandbox): it must run as `python -c SCRIPT NAME` from an empty folder and write RESULT."""
    import json
    import subprocess
    import sys

    from selftest.windows import probeacl

    assert "import launcher" not in probeacl.SCRIPT and "from launcher" not in probeacl.SCRIPT
    r = subprocess.run(
        [sys.executable, "-I", "-c", probeacl.SCRIPT, "git_rename"], cwd=tmp_path, capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr[-1500:]
    got = json.loads((tmp_path / probebody.RESULT).read_text())
    assert got["probes"][0]["ok"] is False  # a POSIX folder has no `C:\...\.git`: never a pass
    verdict = probeacl.BODIES[0].judge(0, got)
    assert not verdict.ok and "no .git" in verdict.detail


def test_the_rows_are_windows_only_probes() -> None:
    from selftest.windows import probeacl, probes

    assert all(b.name in probes.WINDOWS_ONLY and b.prepare is not None for b in probeacl.BODIES)
    assert {b.name for b in allbodies.bodies()} >= set(probeacl.NAMES)
    assert set(probeacl.NAMES) <= set(winprobefakes.simulated())  # the e2e test runs them too


def test_a_run_read_grants_the_toolchain_on_path_for_its_duration(
    verify_machine: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """M6 through `sandgate run`: the backend fills read_grants from the real user's PATH."""
    fake = verify_machine
    fake.env["PATH"] += ";" + PY
    for p in (HOME + r"\AppData", HOME + r"\AppData\Local\Programs", HOME + r"\AppData\Local\Programs\Python", PY):
        fake.m.dirs.add(p)
        fake.m.dacls[p] = BASE_DACL
    seen: list[bool] = []

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        box = ntfsmodel.Ntfs(api.m, api.m.users[launch.user][0])
        seen.append(box.allowed(PY, acl.READ_EXECUTE) and not box.allowed(HOME + r"\AppData\Local", 0x1))
        return 0

    fake.program = program
    assert cli.main(["setup"]) == 0
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 0
    assert seen == [True]
    assert fake.m.dacls[PY] == BASE_DACL  # taken back after the run

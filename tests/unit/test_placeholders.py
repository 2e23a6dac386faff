"""Placeholders shared by concurrent runs (fsguard/placeholders.py, launcher/run/runstate.py): a
placeholder is removed only when no run holds it, a run uses the one an earlier live run made
(never creating inside it), a killed run's are reclaimed, and no held descriptor survives a fork.

Real files and real flocks under tmp_path; each "run" is a Refs (a run's references), which is what
a launcher process holds. The real concurrency runs in tests/e2e/test_concurrent_runs_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fsguard import mounts, placeholders
from fsguard.gitguard import PLACEHOLDER_TEXTS
from launcher.run import placeholdershare, runstate


def plan(ws: Path, *missing: tuple[str, bool], protect: tuple[str, ...] = ()) -> mounts.MountPlan:
    return mounts.MountPlan(
        False, (), (), tuple(str(ws / p) for p in protect), tuple((str(ws / p), d) for p, d in missing), (), (), ()
    )


def test_a_held_placeholder_is_not_removed_until_its_last_holder_lets_go(tmp_path: Path) -> None:
    ph = tmp_path / ".vscode"
    ident = placeholders.make(str(ph), True)
    one, two = placeholders.Refs(), placeholders.Refs()
    one.hold(str(ph))
    two.hold(str(ph))
    assert placeholders.try_remove(str(ph), ident, PLACEHOLDER_TEXTS) == "held"
    one.close()
    assert placeholders.try_remove(str(ph), ident, PLACEHOLDER_TEXTS) == "held" and ph.is_dir()
    two.close()
    assert placeholders.try_remove(str(ph), ident, PLACEHOLDER_TEXTS) == "removed" and not ph.exists()
    assert placeholders.try_remove(str(ph), ident, PLACEHOLDER_TEXTS) == "gone"


def test_another_process_holding_it_keeps_it(tmp_path: Path) -> None:
    """The lock is the file's, whoever holds it (another user's run included): here a separate process."""
    ph = tmp_path / "p"
    ident = placeholders.make(str(ph), True)
    holder = subprocess.Popen(
        ["python3", "-c", "import fcntl,os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); fcntl.flock(fd,fcntl.LOCK_SH);"
         "print('held',flush=True); sys.stdin.read()", str(ph)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert placeholders.try_remove(str(ph), ident, PLACEHOLDER_TEXTS) == "held" and ph.is_dir()
    finally:
        holder.communicate("", timeout=10)  # it exits: the kernel drops its lock
    assert placeholders.try_remove(str(ph), ident, PLACEHOLDER_TEXTS) == "removed"


def test_only_what_is_still_an_unused_placeholder_of_ours_goes(tmp_path: Path) -> None:
    d, f, user = tmp_path / "d", tmp_path / "commondir", tmp_path / "users"
    d_id, f_id = placeholders.make(str(d), True), placeholders.make(str(f), False, ".\n")
    os.chmod(d, 0o755)
    (d / "kept").write_text("user data")
    assert placeholders.try_remove(str(d), d_id, PLACEHOLDER_TEXTS) == "held" and (d / "kept").exists()
    assert placeholders.try_remove(str(f), f_id, PLACEHOLDER_TEXTS) == "removed"
    f.write_text("../evil\n")  # the name taken by something else: never removed, forgotten
    assert placeholders.try_remove(str(f), f_id, PLACEHOLDER_TEXTS) == "gone" and f.exists()
    user.mkdir(0o755)  # known by name only (a killed run's list): its mode must be ours too
    assert placeholders.try_remove(str(user), None, PLACEHOLDER_TEXTS) == "gone" and user.is_dir()
    os.chmod(user, placeholders.DIR_MODE)
    assert placeholders.try_remove(str(user), None, PLACEHOLDER_TEXTS) == "removed"


def test_holding_a_path_that_was_replaced_meanwhile_is_stale(tmp_path: Path) -> None:
    ph = tmp_path / "p"
    placeholders.make(str(ph), True)
    fd = os.open(ph, os.O_RDONLY)
    try:
        ph.rmdir()
        placeholders.make(str(ph), True)  # removed and made again between the open and the lock
        with pytest.raises(placeholders.Stale):
            placeholders._lock_unchanged(fd, str(ph))
    finally:
        os.close(fd)
    with pytest.raises(placeholders.Stale):
        placeholders.Refs().hold(str(tmp_path / "missing"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refs = placeholders.Refs()
    refs.hold(str(fifo))  # no placeholder, never waited on
    assert refs.fds == {}


def test_a_forked_child_never_keeps_a_held_descriptor(tmp_path: Path) -> None:
    """The threat: a placeholder directory's descriptor inside the sandbox reaches the writable
    directory under the read-only mount (the holder and init are forked from the launcher)."""
    refs = placeholders.Refs()
    placeholders.make(str(tmp_path / "p"), True)
    refs.hold(str(tmp_path / "p"))
    (fd,) = refs.fds.values()
    pid = os.fork()
    if pid == 0:
        try:
            os.fstat(fd)
            os._exit(1)
        except OSError:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    os.fstat(fd)  # the parent still holds it
    refs.close()


def _start(rt: Path, rid: str, p: mounts.MountPlan) -> tuple[runstate.RunPaths, mounts.MountPlan, placeholders.Refs]:
    """A run's step 3 (launcher/run/linuxbackend.py), with this process as the run's owner."""
    paths = runstate.RunPaths(rt, rid)
    runstate.make_dirs(paths)
    with runstate.lock(rt):
        runstate.cleanup_stale(rt)
        runstate.write_state(paths, [ph for ph, _ in p.placeholders])
        got, refs, used = placeholdershare.take(rt, p)
        runstate.write_state(paths, used)
    return paths, got, refs


def test_two_runs_share_placeholders_and_the_last_one_out_removes_them(tmp_path: Path) -> None:
    rt, ws = tmp_path / "rt", tmp_path / "ws"
    (ws / ".git" / "objects").mkdir(parents=True)
    first_plan = plan(ws, (".zed", True), (".git/objects/info", True))
    one, p1, refs1 = _start(rt, "one", first_plan)
    assert p1 == first_plan and (ws / ".zed").is_dir() and (ws / ".git/objects/info").is_dir()
    # The second run plans with the first's placeholders there: .zed exists, and objects/info/alternates
    # is missing inside the first's read-only directory, which covers it instead.
    two, p2, refs2 = _start(rt, "two", plan(ws, (".git/objects/info/alternates", False), protect=(".zed",)))
    assert p2.placeholders == () and set(p2.protect) == {str(ws / ".zed"), str(ws / ".git/objects/info")}
    assert list((ws / ".git/objects/info").iterdir()) == []  # nothing created inside the first's
    assert refs1.fds == {} and refs2.fds == {}  # this user's own: no descriptor, the state files say it
    runstate.release(one)  # the first run ends: the second still uses both
    assert (ws / ".zed").is_dir() and (ws / ".git/objects/info").is_dir()
    runstate.release(two)
    assert sorted(os.listdir(ws)) == [".git"] and os.listdir(ws / ".git/objects") == []
    assert not (rt / "placeholders.json").exists()


def test_another_users_placeholder_is_held_and_their_sweep_leaves_it(tmp_path: Path) -> None:
    """Root's runs and a user's keep separate runtime directories: the user's run holds what it binds
    of root's with a flock, so root's sweep (which sees no state file of the user's) keeps it."""
    theirs, mine, ws = tmp_path / "rt-root", tmp_path / "rt-user", tmp_path / "ws"
    ws.mkdir()
    other, _, _ = _start(theirs, "r", plan(ws, (".zed", True)))
    me, got, refs = _start(mine, "u", plan(ws, protect=(".zed",)))
    assert list(refs.fds) == [str(ws / ".zed")] and got.placeholders == ()
    runstate.release(other)
    assert (ws / ".zed").is_dir()  # held: kept in their registry for later
    refs.close()
    runstate.release(me)
    assert (ws / ".zed").is_dir()  # not ours to remove: their next sweep
    with runstate.lock(theirs):
        assert runstate.cleanup_stale(theirs) == [f"placeholder {ws / '.zed'}"]


def test_a_name_taken_between_planning_and_creating_is_stale(tmp_path: Path) -> None:
    rt, ws = tmp_path / "rt", tmp_path / "ws"
    rt.mkdir()
    ws.mkdir()
    (ws / ".vscode").mkdir()  # appeared after the plan was made
    with runstate.lock(rt), pytest.raises(placeholders.Stale):
        placeholdershare.take(rt, plan(ws, (".zed", True), (".vscode", True)))
    with runstate.lock(rt):
        runstate.sweep(rt)  # what the failed try made is not left behind
    assert sorted(os.listdir(ws)) == [".vscode"]


def test_a_killed_runs_placeholders_are_reclaimed_by_the_next_cleanup(tmp_path: Path) -> None:
    rt, ws = tmp_path / "rt", tmp_path / "ws"
    ws.mkdir()
    paths, _, _ = _start(rt, "dead1", plan(ws, (".zed", True)))
    # Killed before it wrote the registry: its state names a placeholder the registry lacks.
    placeholders.make(str(ws / ".idea"), True)
    data = {"id": "dead1", "pid": 2**22 + 1, "start": "0", "placeholders": [str(ws / ".zed"), str(ws / ".idea")]}
    paths.state.write_text(json.dumps(data))
    with runstate.lock(rt):
        removed = runstate.cleanup_stale(rt)
    assert set(removed) == {"run dead1", f"placeholder {ws / '.zed'}", f"placeholder {ws / '.idea'}"}
    assert os.listdir(ws) == [] and not paths.state.exists()


def test_adopt_covers_a_planned_placeholder_by_a_known_one_above_it() -> None:
    p = mounts.MountPlan(
        False, (), (), ("/w/.git/config",),
        (("/w/.git/objects/info/alternates", False), ("/w/.zed", True), ("/w/.git/commondir", False)),
        (), (), (), filled=(("/w/.git/commondir", ".\n"),),
    )  # fmt: skip
    got = placeholders.adopt(p, {"/w/.git/objects/info"})
    assert got.placeholders == (("/w/.zed", True), ("/w/.git/commondir", False))
    assert got.protect == ("/w/.git/config", "/w/.git/objects/info") and got.filled == p.filled
    assert placeholders.adopt(p, set()) is p


def test_another_runs_commondir_placeholder_is_not_taken_for_a_linked_worktree(tmp_path: Path) -> None:
    """A linked worktree's git directory takes hooks, info... from its common directory, so its missing
    names go uncovered; our "." placeholder names the directory itself and must not count as one."""
    from fsguard import gitguard
    from fsguard.policy import GIT_DIR_PROTECT

    g = tmp_path / ".git"
    for d in ("refs", "objects"):
        (g / d).mkdir(parents=True)
    (g / "HEAD").write_text("ref: refs/heads/main\n")
    names = {str(tmp_path): [(n.rstrip("/"), n.endswith("/")) for n in GIT_DIR_PROTECT]}
    alone = {p for p, _ in gitguard.plan(names).protect}
    assert f"{g}/remotes" in alone and f"{g}/commondir" in alone
    placeholders.make(str(g / "commondir"), False, gitguard.COMMONDIR_SELF)  # a live run's
    assert {p for p, _ in gitguard.plan(names).protect} == alone  # still every missing name covered
    (g / "commondir").chmod(0o644)
    (g / "commondir").write_text("../elsewhere\n")  # a real linked worktree: only its own names
    assert f"{g}/remotes" not in {p for p, _ in gitguard.plan(names).protect}


def test_another_users_placeholder_is_recognised_by_its_shape(tmp_path: Path) -> None:
    """Not in this user's registry: an empty directory of the placeholder mode covers what lies below
    (as an ordinary user, creating inside a root-owned 0555 directory would fail the run)."""
    ws = tmp_path / "ws"
    (ws / ".git" / "objects").mkdir(parents=True)
    placeholders.make(str(ws / ".git/objects/info"), True)  # the other user's run's
    p = plan(ws, (".git/objects/info/alternates", False), (".zed", True))
    got = placeholders.adopt(p, set())
    assert got.placeholders == ((str(ws / ".zed"), True),) and str(ws / ".git/objects/info") in got.protect
    os.chmod(ws / ".git/objects/info", 0o755)  # an ordinary directory of the user's: created inside as before
    assert placeholders.adopt(p, set()) is p

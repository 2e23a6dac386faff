"""Tests of the rootless harness (tests/support/rootless.py): if these fail, no "works without sudo" test can be trusted.

Every "cannot" is paired with a positive control showing the same probe would have seen it.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.rootless import (
    REPO,
    SandgateRootlessError,
    UnprivilegedUser,
    UserRunner,
    cleanup_stale_users,
    default_paths,
    plan_paths,
    processes_of,
)
from ..support.world import World, new_world

VENV_PY = REPO / ".venv" / "bin" / "python"
PYENV = {"PYTHONPATH": str(REPO)}


def _caps(status: str) -> dict[str, int]:
    return {m[1]: int(m[2], 16) for m in re.finditer(r"^(Cap\w+):\s+([0-9a-f]+)$", status, re.M)}


def _mounts_at_or_under(mountinfo: str, top: str) -> list[str]:
    """Mount points (field 5 of mountinfo) equal to or below `top`."""
    points = [line.split()[4] for line in mountinfo.splitlines() if line.strip()]
    return [p for p in points if p == top or p.startswith(top.rstrip("/") + "/")]


def _passwd_names() -> set[str]:
    return {line.split(":", 1)[0] for line in Path("/etc/passwd").read_text().splitlines() if line}


def _group_names() -> set[str]:
    return {line.split(":", 1)[0] for line in Path("/etc/group").read_text().splitlines() if line}


@pytest.fixture
def closed() -> Iterator[Path]:
    """A directory only root may traverse (as pyenv's /root is), with something the user must reach
    inside and something it must not see: the mount trick is exercised wherever the interpreter lives."""
    top = Path(tempfile.mkdtemp(prefix="sandgate-closed-", dir="/var/tmp"))
    try:
        top.chmod(0o700)
        (top / "needed").mkdir()
        (top / "needed" / "tool.txt").write_text("reachable\n")
        (top / "private.txt").write_text("root's own\n")
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _start_ready(r: UserRunner, seconds: int = 300) -> subprocess.Popen[bytes]:
    """A sleeper as the user that has already passed the mount trick and the drop (it printed "ready")."""
    proc = r.popen(["sh", "-c", f"echo ready; exec sleep {seconds}"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    rl, _, _ = select.select([proc.stdout], [], [], 10)
    assert rl and proc.stdout.readline() == b"ready\n"
    return proc


def _expect_venv_python() -> None:
    if not VENV_PY.exists():
        pytest.fail(f"{VENV_PY} missing: the rootless tests run this checkout's venv as the user", pytrace=False)


# ---------------------------------------------------------------- identity and capabilities


@pytest.mark.parametrize("drop", ["setpriv", "python"])
def test_commands_run_as_the_user_with_no_capabilities(world: World, unprivileged: UnprivilegedUser, drop: str) -> None:
    if drop == "setpriv" and shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is not installed", pytrace=False)
    r = unprivileged.runner(world, drop=drop)
    res = r.run(["id", "-u"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(unprivileged.uid)
    assert unprivileged.uid != 0 and unprivileged.gid != 0

    res = r.run(["grep", "-E", "^(Cap|Uid|Gid|Groups)", "/proc/self/status"])
    assert res.returncode == 0, res.stderr
    caps = _caps(res.stdout)
    assert caps["CapEff"] == 0, res.stdout
    assert caps["CapPrm"] == caps["CapInh"] == caps["CapAmb"] == 0, res.stdout
    ids = {line.split(":")[0]: line.split()[1:] for line in res.stdout.splitlines()}
    assert ids["Uid"] == [str(unprivileged.uid)] * 4  # real, effective, saved, fs
    assert ids["Gid"] == [str(unprivileged.gid)] * 4
    assert ids["Groups"] == [str(unprivileged.gid)]  # root's supplementary groups are gone

    # Positive control: the same probe as root in the same world does see capabilities.
    root_caps = _caps(world.run(["grep", "^Cap", "/proc/self/status"]).stdout)
    assert root_caps["CapEff"] != 0

    # It is really in the world's network namespace.
    assert r.run(["readlink", "/proc/self/ns/net"]).stdout == world.run(["readlink", "/proc/self/ns/net"]).stdout


def test_runner_works_in_a_client_namespace_too(world: World, unprivileged: UnprivilegedUser) -> None:
    client = world.sandbox()
    r = unprivileged.runner(client)
    assert r.run(["id", "-u"]).stdout.strip() == str(unprivileged.uid)
    assert r.run(["readlink", "/proc/self/ns/net"]).stdout == client.run(["readlink", "/proc/self/ns/net"]).stdout
    proc = _start_ready(r)
    assert proc.pid in unprivileged._provably_ours()  # found via the client's namespace and as our child


def test_e2e_helpers_work_with_the_runner(world: World, unprivileged: UnprivilegedUser) -> None:
    """tests/support/runner.py's curl() takes any runner: the user reaches the fake internet's DNS and HTTP like root does."""
    from ..support.runner import curl

    world.add_host("a.test", "198.51.100.10")
    srv = world.serve("http", "198.51.100.10", 80, name="a")
    got = curl(unprivileged.runner(world), "http://a.test/")
    assert (got.code, got.status, got.body) == (0, 200, "hello from a"), got.stderr
    assert [r["path"] for r in srv.log_records("http")] == ["/"]


def test_clean_environment_and_home(world: World, unprivileged: UnprivilegedUser) -> None:
    r = unprivileged.runner(world)
    res = r.run(["sh", "-c", "pwd; exec env"], env=PYENV)
    assert res.returncode == 0, res.stderr
    cwd, *lines = res.stdout.splitlines()
    assert cwd == str(unprivileged.home)  # default cwd: the user's home
    env = dict(line.split("=", 1) for line in lines)
    want = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(unprivileged.home),
        "USER": unprivileged.name,
        "LOGNAME": unprivileged.name,
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO),
    }
    assert {k: env.get(k) for k in want} == want
    assert set(env) - set(want) <= {"PWD", "SHLVL", "OLDPWD", "_"}, env  # nothing of root's environment

    st = unprivileged.home.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (unprivileged.uid, unprivileged.gid, 0o700)
    entry = pwd.getpwnam(unprivileged.name)
    assert (entry.pw_dir, entry.pw_shell, entry.pw_uid) == (str(unprivileged.home), "/bin/sh", unprivileged.uid)
    assert re.fullmatch(rf"sandgate-u{os.getpid()}x\d+", unprivileged.name)


def test_file_created_in_home_is_owned_by_the_user(world: World, unprivileged: UnprivilegedUser) -> None:
    r = unprivileged.runner(world)
    res = r.run(["sh", "-c", 'echo hi > "$HOME/made-by-user" && stat -c "%u %g" "$HOME/made-by-user"'])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(unprivileged.uid), str(unprivileged.gid)]
    st = (unprivileged.home / "made-by-user").stat()  # seen from the host, not just inside
    assert (st.st_uid, st.st_gid) == (unprivileged.uid, unprivileged.gid)
    # ... and the user cannot write where an ordinary user cannot.
    assert r.run(["touch", "/etc/sandgate-rootless-probe"]).returncode != 0
    assert not Path("/etc/sandgate-rootless-probe").exists()


# ---------------------------------------------------------------- the interpreter under /root


def test_venv_python_and_sandgate_cli_run_as_the_user(world: World, unprivileged: UnprivilegedUser) -> None:
    _expect_venv_python()
    r = unprivileged.runner(world)
    res = r.run([str(VENV_PY), "-c", "import mitmproxy, sys; print(sys.prefix)"], env=PYENV, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(REPO / ".venv")
    res = r.run([str(VENV_PY), "-m", "launcher.cli", "--help"], env=PYENV, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert "usage" in res.stdout.lower()

    # Positive control: without the mount trick the same user cannot even start the interpreter
    # (when it lives under a directory others cannot traverse, as pyenv's /root does).
    if plan_paths(default_paths())[1]:
        bare = unprivileged.runner(world, paths=[])
        res = bare.run([str(VENV_PY), "-c", "print(1)"], env=PYENV, cwd=REPO)
        assert res.returncode != 0 and "ermission denied" in res.stderr, res


def test_user_sees_only_the_skeleton_of_covered_dirs(
    world: World, unprivileged: UnprivilegedUser, closed: Path
) -> None:
    r = unprivileged.runner(world, paths=[*default_paths(), closed / "needed"])
    assert str(closed) in r.covers
    for cover in r.covers:
        host = sorted(os.listdir(cover))
        # Expected: per level, only the next component of each bound path below the cover.
        skeleton: dict[str, set[str]] = {}
        for path, _ in r.binds:
            rel = Path(path).relative_to(cover)
            for i, part in enumerate(rel.parts):
                skeleton.setdefault(str(Path(cover, *rel.parts[:i])), set()).add(part)
        for d, names in skeleton.items():
            res = r.run(["ls", "-A", d])
            assert res.returncode == 0, res.stderr
            assert sorted(res.stdout.split()) == sorted(names), (d, res.stdout)
        hidden = [n for n in host if n not in skeleton[cover]]
        assert hidden, f"positive control: {cover} has entries besides the skeleton"
        for n in hidden:
            res = r.run(["sh", "-c", 'test -e "$1" && echo VISIBLE || echo absent', "sh", f"{cover}/{n}"])
            assert res.stdout.strip() == "absent", n
        # The skeleton is read-only and root-owned: the user cannot plant anything in it.
        res = r.run(["touch", f"{cover}/planted"])
        assert res.returncode != 0
    # Positive control: the bound interpreter directory is fully there.
    path = r.binds[0][0]
    res = r.run(["ls", "-A", path])
    assert sorted(res.stdout.split()) == sorted(os.listdir(path))


def test_host_root_and_mounts_are_untouched(world: World, unprivileged: UnprivilegedUser, closed: Path) -> None:
    r = unprivileged.runner(world, paths=[*default_paths(), closed / "needed"])
    assert str(closed) in r.covers
    covers = r.covers
    before = {c: (stat.S_IMODE(os.stat(c).st_mode), sorted(os.listdir(c))) for c in covers}
    host_mounts = Path("/proc/self/mountinfo").read_text()
    host_before = {c: _mounts_at_or_under(host_mounts, c) for c in covers}
    if "/root" in covers:
        assert before["/root"][0] == 0o700

    proc = _start_ready(r)
    try:
        # Positive control: the user's mount namespace does have the tmpfs and the bind ...
        theirs = Path(f"/proc/{proc.pid}/mountinfo").read_text()
        for c in covers:
            assert c in _mounts_at_or_under(theirs, c)
        assert os.readlink(f"/proc/{proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        # ... while it is running, the host's does not (no propagation out of `ip netns exec`).
        now = Path("/proc/self/mountinfo").read_text()
        for c in covers:
            assert _mounts_at_or_under(now, c) == host_before[c]
            assert (stat.S_IMODE(os.stat(c).st_mode), sorted(os.listdir(c))) == before[c]
    finally:
        proc.kill()
        proc.wait(5)
    after = Path("/proc/self/mountinfo").read_text()
    for c in covers:
        assert _mounts_at_or_under(after, c) == host_before[c]
        assert not any(line.split()[4] == c and "tmpfs" in line for line in after.splitlines())
        assert (stat.S_IMODE(os.stat(c).st_mode), sorted(os.listdir(c))) == before[c]
    # The staging mount point on the host stays an empty directory with nothing mounted on it.
    assert list(unprivileged.stage.iterdir()) == []
    assert _mounts_at_or_under(after, str(unprivileged.base)) == []


def test_any_untraversable_path_can_be_shared(world: World, unprivileged: UnprivilegedUser) -> None:
    """The trick is general: a file in world.tmp (0700) becomes readable without exposing its neighbours."""
    assert stat.S_IMODE(world.tmp.stat().st_mode) & 0o001 == 0
    shared = world.tmp / "shared"
    shared.mkdir(mode=0o755)
    (shared / "data.txt").write_text("shared-data\n")
    (shared / "data.txt").chmod(0o644)
    (world.tmp / "secret.txt").write_text("secret\n")
    (world.tmp / "secret.txt").chmod(0o644)  # readable itself: only the 0700 parent protects it

    plain = unprivileged.runner(world)
    res = plain.run(["cat", str(shared / "data.txt")])
    assert res.returncode != 0 and "ermission denied" in res.stderr  # positive control: it is really blocked

    r = unprivileged.runner(world, paths=[*default_paths(), shared / "data.txt"])
    assert str(world.tmp) in r.covers
    assert r.run(["cat", str(shared / "data.txt")]).stdout == "shared-data\n"
    assert r.run(["ls", "-A", str(world.tmp)]).stdout.split() == ["shared"]
    assert r.run(["ls", "-A", str(shared)]).stdout.split() == ["data.txt"]  # a file bind: not the dir's neighbours
    assert r.run(["cat", str(world.tmp / "secret.txt")]).returncode != 0
    assert (world.tmp / "secret.txt").read_text() == "secret\n"  # and nothing changed on the host
    assert {"secret.txt", "shared", "ca.pem"} <= {p.name for p in world.tmp.iterdir()}


def test_unreadable_needed_paths_fail_clearly(tmp_path: Path) -> None:
    d = tmp_path / "tree"
    d.mkdir()
    d.chmod(0o755)
    (d / "ok.py").write_text("")
    (d / "ok.py").chmod(0o644)
    (d / "private.py").write_text("")
    (d / "private.py").chmod(0o600)
    with pytest.raises(SandgateRootlessError, match=r"not readable.*\n.*private\.py"):
        plan_paths([d])
    with pytest.raises(SandgateRootlessError, match="does not exist"):
        plan_paths([tmp_path / "missing"])
    # This checkout, its venv and interpreter are fine (else every rootless test would fail here).
    binds, _covers = plan_paths(default_paths())
    assert all(Path(b).exists() for b, _ in binds)


# ---------------------------------------------------------------- lifecycle


def test_creation_is_fast() -> None:
    t = time.monotonic()
    with UnprivilegedUser() as u:
        elapsed = time.monotonic() - t
        assert u.name in _passwd_names()
    assert elapsed < 0.3, f"creating a test user took {elapsed:.3f} s"


def test_teardown_removes_everything_even_when_the_test_fails() -> None:
    with new_world() as w:
        with pytest.raises(RuntimeError, match="the test failed"), UnprivilegedUser() as u:
            r = u.runner(w)
            sleeper = _start_ready(r)
            child = r.run(["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"])  # a detached straggler
            straggler = int(child.stdout)
            rt = r.run(["sh", "-c", f"mkdir -m 700 {u.runtime_dir} && echo x > {u.runtime_dir}/state"])
            assert rt.returncode == 0, rt.stderr
            scratch = Path(f"/var/tmp/sandgate-rootless-scratch-{u.name}")
            assert r.run(["touch", str(scratch)]).returncode == 0
            name, uid, base = u.name, u.uid, u.base
            raise RuntimeError("the test failed")
        # The world is still open: the user's teardown itself killed its processes, by PID.
        assert sleeper.poll() is not None
        assert not _alive_as(straggler, uid)
    assert name not in _passwd_names() and name not in _group_names()
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    assert not base.exists()
    assert not os.path.lexists(f"/tmp/sandgate-{uid}")
    assert not scratch.exists()
    assert processes_of(uid) == []


def _alive_as(pid: int, uid: int) -> bool:
    """Running as `uid`; a zombie is dead (killed, only not yet reaped by PID 1, which may take seconds)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    lines = text.splitlines()
    zombie = any(line.startswith("State:") and line.split()[1:2] == ["Z"] for line in lines)
    return not zombie and any(line.startswith("Uid:") and str(uid) in line.split() for line in lines)


PROBE = textwrap.dedent("""
    import json, os, subprocess, sys
    from pathlib import Path

    def test_probe(world, unprivileged):
        r = unprivileged.runner(world)
        proc = r.popen(["sh", "-c", "echo ready; exec sleep 300"], stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"ready\\n"  # past the mount trick and the drop
        Path(os.environ["SANDGATE_PROBE_OUT"]).write_text(json.dumps(
            {"name": unprivileged.name, "uid": unprivileged.uid, "base": str(unprivileged.base), "pid": proc.pid,
             "ns": world.ns}))
        if os.environ.get("SANDGATE_PROBE_HANG"):
            import time
            time.sleep(120)  # killed -9 by the outer test here
        assert False, "deliberate failure"
""")


def _probe_cmd(tmp_path: Path) -> list[str]:
    """An inner pytest run of PROBE, with this checkout's conftest (fixtures `world`, `unprivileged`) as a plugin."""
    (tmp_path / "test_probe_rootless.py").write_text(PROBE)
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-n0",  # one process, whatever the options say: the run is killed by its pid
        "-p",
        "tests.conftest",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        str(tmp_path / "test_probe_rootless.py"),
    ]


def test_fixture_teardown_after_a_failing_test(tmp_path: Path) -> None:
    """The `unprivileged` fixture itself, in a real pytest run whose test fails."""
    out = tmp_path / "probe.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SANDGATE_PROBE_OUT": str(out)}
    res = subprocess.run(_probe_cmd(tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "1 failed" in res.stdout and "deliberate failure" in res.stdout, res.stdout
    info = json.loads(out.read_text())
    assert info["name"] not in _passwd_names()
    assert not Path(info["base"]).exists()
    assert not _alive_as(info["pid"], info["uid"])
    assert processes_of(info["uid"]) == []


def test_processes_outside_our_namespaces_are_never_killed() -> None:
    """A process of the uid we did not start through a runner is reported, not killed; close() can be retried."""
    u = UnprivilegedUser().__enter__()
    outsider = None
    try:
        outsider = subprocess.Popen(
            ["setpriv", f"--reuid={u.uid}", f"--regid={u.gid}", "--init-groups", "sleep", "300"],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while not _alive_as(outsider.pid, u.uid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _alive_as(outsider.pid, u.uid)
        with pytest.raises(SandgateRootlessError, match=rf"{outsider.pid}.*not killed"):
            u.close()
        assert outsider.poll() is None  # untouched
        assert u.name in _passwd_names()  # userdel refused; nothing half-done
        assert u.base.exists()
    finally:
        if outsider is not None:
            outsider.kill()
            outsider.wait(5)
        u.close()
    assert u.name not in _passwd_names() and not u.base.exists()


def test_stale_cleanup_removes_only_dead_runs_users(unprivileged: UnprivilegedUser) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = UnprivilegedUser(pid=dead.pid).__enter__()  # as if created by a run that was SIGKILLed
    try:
        stale_rt = stale.runtime_dir
        stale_rt.mkdir(mode=0o700)
        os.chown(stale_rt, stale.uid, stale.gid)
        removed = cleanup_stale_users()
        assert f"user {stale.name}" in removed and str(stale.base) in removed
        for item in removed:  # only our naming scheme, only dead creators
            m = re.search(r"sandgate-u(\d+)x\d+", item) or re.fullmatch(r"/tmp/sandgate-\d+", item)
            assert m, item
        assert stale.name not in _passwd_names()
        assert not stale.base.exists() and not stale_rt.exists()
        # The live run's (our) user is untouched.
        assert unprivileged.name in _passwd_names() and unprivileged.home.is_dir()
    finally:
        stale.close()  # already gone: must be a no-op, not an error


def test_a_killed_runs_user_is_removed_by_the_next_run(tmp_path: Path) -> None:
    """SIGKILL an inner pytest mid-test: its user, home and sleeper survive; the stale cleanups remove them."""
    from ..support.world import cleanup_stale

    out = tmp_path / "probe.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SANDGATE_PROBE_OUT": str(out), "SANDGATE_PROBE_HANG": "1"}
    inner = subprocess.Popen(
        _probe_cmd(tmp_path),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline and inner.poll() is None:
            time.sleep(0.05)
        info = json.loads(out.read_text())
        assert _alive_as(info["pid"], info["uid"])
    finally:
        inner.kill()  # SIGKILL: no teardown, no atexit
        inner.wait(10)
    assert info["name"] in _passwd_names() and Path(info["base"]).exists()  # really left behind
    assert re.fullmatch(rf"sandgate-u{inner.pid}x\d+", info["name"])
    cleanup_stale()  # as the next run's session fixtures do: namespaces first (this ends the sleeper) ...
    deadline = time.monotonic() + 5
    while _alive_as(info["pid"], info["uid"]) and time.monotonic() < deadline:
        time.sleep(0.02)  # killed, may still be exiting
    assert not _alive_as(info["pid"], info["uid"])
    removed = cleanup_stale_users()  # ... then the users
    assert f"user {info['name']}" in removed
    assert info["name"] not in _passwd_names() and info["name"] not in _group_names()
    assert not Path(info["base"]).exists()
    assert processes_of(info["uid"]) == []


def test_a_sigtermed_run_removes_its_user_itself(tmp_path: Path) -> None:
    """SIGTERM an inner pytest mid-test: the handler (chained with the World's) removes the user before dying."""
    out = tmp_path / "probe.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SANDGATE_PROBE_OUT": str(out), "SANDGATE_PROBE_HANG": "1"}
    inner = subprocess.Popen(
        _probe_cmd(tmp_path),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline and inner.poll() is None:
            time.sleep(0.05)
        info = json.loads(out.read_text())
        inner.terminate()
        assert inner.wait(30) == -15  # it still dies of SIGTERM, after cleaning up
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait(10)
    assert info["name"] not in _passwd_names()
    assert not Path(info["base"]).exists()
    assert processes_of(info["uid"]) == []
    assert info["ns"] not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout

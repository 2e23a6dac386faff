"""Refusals by design and denials, said where the user looks (issue 26 item 2), end to end in a World.

Start: a PATH entry under the host's /tmp is named before the command runs (and `--write` of it
makes the same tool run). Exit: a failed `git config` in a git workspace names git protection
(the host's .git/config is unchanged; a plain file write in the same run went through). Live: a
denied connection is on stderr while the command still runs (it waits on stdin), `-q` silences
it, and two runs sharing one audit log each see only their own denial. Every denied request is
checked at the fake server (it saw nothing), beside an allowed one that it did see.
"""

from __future__ import annotations

import os
import select
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.rootless import UnprivilegedUser
from ..support.runner import Sandgate, env, write_policy
from ..support.threehosts import POLICY, ThreeHosts, three_hosts

ALLOWED, BLOCKED, BLOCKED2 = "198.51.100.10", "198.51.100.20", "198.51.100.21"
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@sandgate.test", "GIT_CONFIG_NOSYSTEM": "1"}


Env = ThreeHosts


@pytest.fixture(scope="module")
def e() -> Iterator[Env]:
    with three_hosts((ALLOWED, BLOCKED, BLOCKED2)) as h:
        yield h


def curl(url: str) -> str:
    return f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}\\n' {url}"


# ---- at start: a PATH entry the sandbox cannot see ------------------------------------------------


@pytest.fixture
def tmp_venv() -> Iterator[Path]:
    """A venv-like directory under the HOST's /tmp (outside the world's workspace), with one tool."""
    root = Path(tempfile.mkdtemp(prefix="sandgate-venv-", dir="/tmp"))
    try:
        (root / "bin").mkdir()
        tool = root / "bin" / "sgtool"
        tool.write_text("#!/bin/sh\necho sgtool-ran\n")
        tool.chmod(0o755)
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_path_entry_under_the_host_tmp_is_named_at_start_and_write_shows_it(e: Env, tmp_venv: Path) -> None:
    bindir = tmp_venv / "bin"
    path_env = {**env(), "PATH": f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"}
    r = e.sg.run(cmd=["sgtool"], env=path_env, audit=e.audit())
    warning = f"sandgate: warning: PATH entry {bindir} is not visible inside: the sandbox has its own private /tmp"
    assert warning in r.stderr and f"--write {tmp_venv} shows it" in r.stderr, r.stderr
    assert r.returncode == 127 and "sgtool-ran" not in r.stdout, (r.returncode, r.stderr)  # really not found
    assert "sandgate: hint: a PATH entry under the host's /tmp" in r.stderr, r.stderr
    ok = e.sg.run("--write", str(tmp_venv), cmd=["sgtool"], env=path_env, audit=e.audit())
    assert ok.returncode == 0 and ok.stdout.strip() == "sgtool-ran", ok.stderr
    assert "PATH entry" not in ok.stderr and "hint:" not in ok.stderr


# ---- at exit: a failed command's refusal by design -------------------------------------------------


def test_a_failed_git_config_names_git_protection_and_the_host_config_is_unchanged(e: Env) -> None:
    ws = Path(tempfile.mkdtemp(prefix="ws-", dir=e.world.tmp))
    genv = {**env(), **GIT_ID, "HOME": str(e.world.tmp)}
    subprocess.run(["git", "init", "-q", str(ws)], check=True, env=genv, timeout=30)
    before = (ws / ".git" / "config").read_text()
    r = e.sg.run(cmd=["sh", "-c", "echo ok > written.txt && git config x.y z"], cwd=ws, env=genv, audit=e.audit())
    assert r.returncode != 0, r.stderr
    assert "Device or resource busy" in r.stderr or "Read-only" in r.stderr, r.stderr  # git's own words
    assert "sandgate: hint: git's config, hooks and other control files are read-only inside" in r.stderr, r.stderr
    assert (ws / ".git" / "config").read_text() == before  # the refusal was real
    assert (ws / "written.txt").read_text() == "ok\n"  # the permitted write in the same run went through
    got = e.sg.run(cmd=["git", "config", "--get", "core.bare"], cwd=ws, env=genv, audit=e.audit())
    assert got.returncode == 0 and got.stdout.strip() == "false" and "hint:" not in got.stderr, got.stderr


def test_apt_get_install_as_root_names_the_missing_host_root(e: Env) -> None:
    r = e.sg.run(cmd=["apt-get", "install", "-y", "sandgate-no-such-package"], audit=e.audit())
    assert r.returncode != 0 and "are you root?" in r.stderr, r.stderr  # apt's own words: the lock was refused
    assert "sandgate: hint: apt-get needs the host's root" in r.stderr, r.stderr
    ok = e.sg.run(cmd=["apt-get", "--version"], audit=e.audit())
    assert ok.returncode == 0 and ok.stdout.startswith("apt ") and "hint:" not in ok.stderr, ok.stderr


# ---- while it runs: denials live ---------------------------------------------------------------------


def _start(e: Env, script: str, audit: Path, *, quiet: bool = False) -> subprocess.Popen[Any]:
    return e.sg.popen(
        cmd=["sh", "-c", script],
        audit=audit,
        quiet=quiet,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _stderr_until(p: subprocess.Popen[Any], needle: bytes, timeout: float = 20) -> bytes:
    """stderr read as it comes, until `needle` (or the deadline); the process is left running."""
    assert p.stderr is not None
    fd, got, deadline = p.stderr.fileno(), b"", time.monotonic() + timeout
    while needle not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            got += chunk
    return got


def _finish(p: subprocess.Popen[Any]) -> tuple[bytes, bytes]:
    out, err = p.communicate(b"go\n", timeout=30)
    return out, err


def _denial(audit: Path, host: str) -> bool:
    if not audit.exists():
        return False  # the run has not opened its log yet
    return any(r["event"] == "decision" and r["action"] == "deny" and r["host"] == host for r in read_records(audit))


def test_a_denial_is_on_stderr_while_the_command_still_runs(e: Env) -> None:
    before = {n: e.seen(n) for n in e.servers}
    audit = e.audit()
    p = _start(e, f"{curl('http://allowed.test/')}; {curl('http://blocked.test/')}; read x; echo finished", audit)
    live = _stderr_until(p, b"sandgate: denied blocked.test")
    still_running = p.poll() is None
    out, err = _finish(p)
    assert still_running, (live, err)
    assert b"sandgate: denied blocked.test:80 (no allow rule matches): allow it with --allow blocked.test" in live
    assert b"allowed.test" not in live.split(b"sandgate: denied blocked.test")[0]  # an allowed host is no denial
    assert out.decode().split() == ["200", "403", "finished"]
    assert e.seen("blocked") == before["blocked"] and e.seen("allowed") > before["allowed"]
    assert b"sandgate: 1 allowed, 1 denied" in err  # the exit summary stays


def test_quiet_silences_the_live_lines(e: Env) -> None:
    before = e.seen("blocked")
    audit = e.audit()
    p = _start(e, f"{curl('http://blocked.test/')}; read x; echo finished", audit, quiet=True)
    deadline = time.monotonic() + 20
    while not _denial(audit, "blocked.test") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # five polls of a follower, were there one
    assert p.poll() is None
    out, err = _finish(p)
    assert _denial(audit, "blocked.test") and out.decode().split() == ["403", "finished"]
    assert b"sandgate: denied" not in err and b"sandgate:" not in err, err
    assert e.seen("blocked") == before


def test_two_runs_sharing_one_audit_log_each_see_only_their_own_denials(e: Env) -> None:
    before = (e.seen("blocked"), e.seen("blocked2"))
    audit = e.audit()
    one = _start(e, f"{curl('http://blocked.test/')}; read x", audit)
    two = _start(e, f"{curl('http://blocked2.test/')}; read x", audit)
    try:
        live_one = _stderr_until(one, b"sandgate: denied blocked.test:80")
        live_two = _stderr_until(two, b"sandgate: denied blocked2.test:80")
        deadline = time.monotonic() + 20  # both denials are in the shared log: each follower had its chance
        while not (_denial(audit, "blocked.test") and _denial(audit, "blocked2.test")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        assert one.poll() is None and two.poll() is None
    finally:
        _, err_one = _finish(one)
        _, err_two = _finish(two)
    all_one, all_two = live_one + err_one, live_two + err_two
    assert b"sandgate: denied blocked.test:80" in all_one and b"blocked2.test" not in all_one, all_one
    assert b"sandgate: denied blocked2.test:80" in all_two and b"blocked.test" not in all_two, all_two
    assert (e.seen("blocked"), e.seen("blocked2")) == before


def test_rootless_a_denial_is_live_too(e: Env, unprivileged: UnprivilegedUser) -> None:
    """The throwaway user (no sudo): its own log, read by its own launcher while the command runs."""
    e.world.tmp.chmod(0o755)  # the user reads the policy here
    policy = write_policy(e.world, POLICY, "rootless")
    policy.chmod(0o644)
    work = unprivileged.home / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, unprivileged.uid, unprivileged.gid)
    sg = Sandgate(unprivileged.runner(e.world), policy=policy, cwd=work, env={**env(), "HOME": str(unprivileged.home)})
    before = e.seen("blocked")
    p = sg.popen(
        cmd=["sh", "-c", f"{curl('http://allowed.test/')}; {curl('http://blocked.test/')}; read x"],
        audit=work / "audit.jsonl",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    live = _stderr_until(p, b"sandgate: denied blocked.test:80")
    still_running = p.poll() is None
    out, err = _finish(p)
    assert still_running and b"sandgate: denied blocked.test:80 (no allow rule matches)" in live, (live, err)
    assert out.decode().split() == ["200", "403"] and e.seen("blocked") == before


def test_the_tool_is_executable_only_by_its_path(tmp_venv: Path) -> None:
    """The fixture's own control: the tool runs outside any sandbox (so "not found" inside is the private /tmp)."""
    tool = tmp_venv / "bin" / "sgtool"
    assert tool.stat().st_mode & stat.S_IXOTH
    assert subprocess.run([str(tool)], capture_output=True, text=True, check=True).stdout == "sgtool-ran\n"

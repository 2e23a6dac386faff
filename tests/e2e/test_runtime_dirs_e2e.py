"""Issue 22, defence in depth: no sandgate runtime directory of the user, in any spelling, and not
/run/user/<uid>, is reachable from inside a sandbox; a socket named by --expose-socket is.

Each spelling gets a listening unix socket (a canary that logs every connection and its first
bytes): another daemon's directory ($XDG_RUNTIME_DIR/sandgate beside /run/sandgate, a login
session's /run/user/<uid>/sandgate beside a run without XDG_RUNTIME_DIR, the sudo caller's) and
a D-Bus-like socket in /run/user/<uid>. A probe inside stats, lists and connects to each, sending
a token; the canaries' logs are the evidence: the token never arrives, while the same probe run
outside (the control) reaches every one, and the exposed socket gets its token in the same run.
Everything created under /run, /tmp and /var/tmp is removed again; only directories that did not
exist before are removed, and only once empty.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..support.rootless import UnprivilegedUser
from ..support.runner import SANDGATE, Sandgate, env
from ..support.world import Server, World, _NetnsRunner, new_world

#: Inside (and outside, for the control): stat, list and connect to each path, sending argv[1] + path.
PROBE = r"""
import errno, json, os, socket, sys
def name(e): return errno.errorcode.get(e.errno, str(e.errno))
out = {"xdg": os.environ.get("XDG_RUNTIME_DIR")}
for p in sys.argv[2:]:
    r = {}
    try:
        os.stat(p); r["stat"] = "ok"
    except OSError as e:
        r["stat"] = name(e)
    try:
        r["listed"] = os.path.basename(p) in os.listdir(os.path.dirname(p))
    except OSError as e:
        r["listed"] = name(e)
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(p); s.sendall((sys.argv[1] + " " + p).encode()); r["reply"] = s.recv(64).decode()
    except OSError as e:
        r["reply"] = name(e)
    finally:
        s.close()
    out[p] = r
print(json.dumps(out))
"""
ANSWER = "unix-canary\n"  # what the world's unix canary answers


@dataclass
class Spellings:
    """Canaries listening in runtime directories; the directories this module created, to remove."""

    world: World
    servers: dict[str, Server] = field(default_factory=dict)
    made: list[Path] = field(default_factory=list)

    def canary(self, directory: Path, owner: int, name: str = "") -> str:
        """A canary socket in `directory` (made 0700 for `owner` if missing); returns its path."""
        for d in reversed([directory, *directory.parents]):
            if not d.exists():  # /run/user/<uid> and what is under it: the user's own, 0700
                d.mkdir(0o700)
                os.chown(d, owner, owner)
                self.made.append(d)
        path = str(directory / (name or f"sandgate-test-{uuid.uuid4().hex[:8]}.sock"))
        self.servers[path] = self.world.serve_unix("unix", path)
        return path

    def seen(self, token: str) -> dict[str, list[str]]:
        """Per socket: the data of every connection that carried `token`."""
        return {p: [r["data"] for r in s.log_records() if token in r.get("data", "")] for p, s in self.servers.items()}

    def close(self) -> None:
        for s in self.servers.values():
            s.stop()  # removes its socket file
        for d in reversed(self.made):
            try:
                d.rmdir()  # only if empty: a daemon started meanwhile keeps its directory
            except OSError:
                pass


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with new_world() as w:
        w.tmp.chmod(0o755)  # the throwaway user's workspace and audit log live below
        yield w


@pytest.fixture(scope="module")
def user() -> Iterator[UnprivilegedUser]:
    with UnprivilegedUser() as u:
        yield u


@pytest.fixture
def spellings(world: World) -> Iterator[Spellings]:
    sp = Spellings(world)
    try:
        yield sp
    finally:
        sp.close()


@pytest.fixture
def xdg() -> Iterator[Path]:
    """A login session's XDG_RUNTIME_DIR for root, outside /tmp (the private /tmp would hide it anyway)."""
    d = Path(tempfile.mkdtemp(prefix="sandgate-test-xdg-", dir="/var/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def probe(runner: _NetnsRunner, sg: Sandgate | None, token: str, paths: list[str], *args: str) -> dict[str, Any]:
    """The probe inside `sandgate run ARGS` (or outside, the control, when `sg` is None)."""
    cmd = [sys.executable, "-c", PROBE, token, *paths]
    r = sg.run(*args, cmd=cmd) if sg is not None else runner.run(cmd, env=env())
    assert r.returncode == 0, r.stderr
    got: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    got["stderr"] = r.stderr
    return got


def assert_unreachable(got: dict[str, Any], sp: Spellings, token: str, paths: list[str]) -> None:
    seen = sp.seen(token)
    for p in paths:
        r = got[p]
        assert r["stat"] in ("ENOENT", "EACCES") and r["listed"] is not True and r["reply"] != ANSWER, (p, r)
        assert seen[p] == [], f"{p} got a connection from inside: {seen[p]}"


def assert_control(runner: _NetnsRunner, sp: Spellings, paths: list[str]) -> None:
    """Outside, the same user reaches every canary: a refusal inside is the sandbox's doing."""
    token = f"control-{uuid.uuid4().hex[:8]}"
    got = probe(runner, None, token, paths)
    seen = sp.seen(token)
    for p in paths:
        assert got[p] == {"stat": "ok", "listed": True, "reply": ANSWER}, (p, got[p])
        assert seen[p] == [f"{token} {p}"], (p, seen[p])


def stop_daemon(runner: _NetnsRunner, run_env: dict[str, str], cwd: Path) -> None:
    r = runner.run([*SANDGATE, "daemon", "stop"], cwd=cwd, env=run_env)
    assert r.returncode == 0, r.stderr


# ---- root: another daemon's directory in every spelling, the user's /run/user/0 --------------------------


def test_root_every_spelling_hidden_and_an_exposed_socket_answers(
    world: World, spellings: Spellings, xdg: Path
) -> None:
    """Root with XDG_RUNTIME_DIR set (its own daemon under it) beside root's default /run/sandgate,
    /tmp/sandgate-0 and a login session's /run/user/0/sandgate, and a D-Bus-like /run/user/0 socket."""
    (xdg / "sandgate").mkdir(0o700)  # this launcher's own runtime directory: its daemon will live here
    hidden = [
        spellings.canary(xdg / "sandgate", 0),
        spellings.canary(Path("/run/sandgate"), 0),
        spellings.canary(Path("/tmp/sandgate-0"), 0),
        spellings.canary(Path("/run/user/0/sandgate"), 0),
    ]
    bus = spellings.canary(Path("/run/user/0"), 0)
    link = f"/run/user/0/sandgate-test-link-{uuid.uuid4().hex[:8]}"
    work = world.tmp / "root-work"
    work.mkdir(exist_ok=True)
    run_env = {**env(), "HOME": str(world.tmp), "XDG_RUNTIME_DIR": str(xdg)}
    sg = Sandgate(world, audit=world.tmp / "root-audit.jsonl", env=run_env, cwd=work, quiet=True)
    try:
        assert_control(world, spellings, [*hidden, bus])
        token = f"in-{uuid.uuid4().hex[:8]}"
        got = probe(world, sg, token, [*hidden, bus])
        assert_unreachable(got, spellings, token, [*hidden, bus])
        assert got["xdg"] is None, got  # the directory it named is hidden: unset, not a dead end

        token = f"exp-{uuid.uuid4().hex[:8]}"
        got = probe(world, sg, token, [*hidden, bus], "-v", "--expose-socket", bus)
        assert got[bus] == {"stat": "ok", "listed": True, "reply": ANSWER}, got[bus]
        assert spellings.seen(token)[bus] == [f"{token} {bus}"]  # the canary saw the exposed connection
        assert_unreachable(got, spellings, token, hidden)  # its siblings under /run/user/0 stay hidden
        assert f"sandgate: exposed sockets: {bus}" in got["stderr"].splitlines()
        assert "/run/user/0" in next(x for x in got["stderr"].splitlines() if x.startswith("sandgate: hidden: "))
        records = [json.loads(x) for x in (world.tmp / "root-audit.jsonl").read_text().splitlines()]
        assert (
            f"{bus} is exposed inside (--expose-socket)"
            in [r for r in records if r["event"] == "policy"][-1]["warnings"]
        )

        # Named through a symlink that is hidden too: the socket shows at both the name and its target.
        os.symlink(bus, link)
        token = f"link-{uuid.uuid4().hex[:8]}"
        got = probe(world, sg, token, [link, bus], "--expose-socket", link)
        assert got[link]["reply"] == ANSWER and got[bus]["reply"] == ANSWER, got
        assert spellings.seen(token)[bus] == [f"{token} {link}", f"{token} {bus}"]
    finally:
        if os.path.islink(link):
            os.unlink(link)
        stop_daemon(world, run_env, work)


def test_root_refuses_to_expose_a_daemon_socket(world: World, spellings: Spellings, xdg: Path) -> None:
    """A daemon's control socket, in this run's own directory or another spelling, is never exposable."""
    (xdg / "sandgate").mkdir(0o700)
    own = spellings.canary(xdg / "sandgate", 0)
    other = spellings.canary(Path("/run/user/0/sandgate"), 0)
    linked = f"/run/user/0/sandgate-test-link-{uuid.uuid4().hex[:8]}.sock"  # the same socket, another name
    os.link(other, linked)
    work = world.tmp / "root-work"
    work.mkdir(exist_ok=True)
    run_env = {**env(), "HOME": str(world.tmp), "XDG_RUNTIME_DIR": str(xdg)}
    sg = Sandgate(world, env=run_env, cwd=work, quiet=True)
    (work / "plain").write_text("x")
    try:
        for path, why in (
            (own, "sandgate runtime directory"),
            (other, "sandgate runtime directory"),
            (linked, "under another name"),
            (str(work / "plain"), "not an existing unix socket"),
        ):
            r = sg.run("--expose-socket", path, cmd=["true"])
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 125 and len(lines) == 1 and why in lines[0], (path, r.stderr)
            assert lines[0].startswith(f"sandgate: error: --expose-socket {path}: "), lines
        assert all(not s for s in spellings.seen("").values()), "a refused run connected to a canary"
    finally:
        os.unlink(linked)
        stop_daemon(world, run_env, work)


# ---- sudo: root's run beside the caller's own daemon; and the caller itself, rootless ---------------------


def test_sudo_run_hides_the_callers_directories(world: World, spellings: Spellings, user: UnprivilegedUser) -> None:
    """`sudo sandgate run` (SUDO_UID set, no XDG_RUNTIME_DIR): the caller's login-session daemon and its
    /run/user/<uid> are hidden too, and the command (run as the caller) reaches neither."""
    run_user = Path(f"/run/user/{user.uid}")
    theirs = [spellings.canary(run_user / "sandgate", user.uid), spellings.canary(run_user, user.uid)]
    work = user.home / "sudo-work"
    work.mkdir(exist_ok=True)
    os.chown(work, user.uid, user.gid)
    run_env = {**env(), "HOME": str(world.tmp), "SUDO_UID": str(user.uid), "SUDO_GID": str(user.gid)}
    sg = Sandgate(world, env=run_env, cwd=work, quiet=True)
    try:
        assert_control(user.runner(world), spellings, theirs)
        token = f"sudo-{uuid.uuid4().hex[:8]}"
        got = probe(world, sg, token, theirs)
        assert_unreachable(got, spellings, token, theirs)
    finally:
        stop_daemon(world, run_env, work)


def test_unprivileged_user_login_session_daemon_hidden_exposed_agent_answers(
    world: World, spellings: Spellings, user: UnprivilegedUser
) -> None:
    """A run without XDG_RUNTIME_DIR (cron, CI) beside the user's login session: /run/user/<uid>/sandgate
    (another daemon) and /run/user/<uid> are hidden; the agent socket named by --expose-socket answers."""
    run_user = Path(f"/run/user/{user.uid}")
    daemon = spellings.canary(run_user / "sandgate", user.uid)
    agent = spellings.canary(run_user, user.uid)
    runner = user.runner(world)
    work = user.home / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, user.uid, user.gid)
    run_env = {**env(), "HOME": str(user.home)}
    sg = Sandgate(runner, env=run_env, cwd=work, quiet=True)
    try:
        assert_control(runner, spellings, [daemon, agent])
        token = f"user-{uuid.uuid4().hex[:8]}"
        got = probe(runner, sg, token, [daemon, agent], "--expose-socket", agent)
        assert_unreachable(got, spellings, token, [daemon])
        assert got[agent] == {"stat": "ok", "listed": True, "reply": ANSWER}, got[agent]
        seen = spellings.servers[agent].log_records()
        assert [(r["data"], r["uid"]) for r in seen if token in r["data"]] == [(f"{token} {agent}", user.uid)]
    finally:
        stop_daemon(runner, run_env, work)

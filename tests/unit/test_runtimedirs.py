"""Every sandgate runtime directory spelling and /run/user/<uid> hidden, and --expose-socket's checks
(launcher/run/runtimedirs.py, fsguard/exposed.py's planning half, confinement.py's use of both).

No namespaces: the plans are pure, the checks stat sockets made here under tmp_path. The mounts
themselves are tried for real in tests/e2e/test_runtime_dirs_e2e.py.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from fsguard import exposed, mounts
from launcher.errors import RunError, UsageError
from launcher.run import confinement, options, runtimedirs
from launcher.run.options import RunOptions
from netguard.audit import AuditLog, read_records
from netguard.daemon import control


def _hidden(environ: dict[str, str], *uids: int) -> set[str]:
    return set(runtimedirs.plan(environ, uids).hide)


# ---- the list: every spelling, for every uid the run speaks for --------------------------------------


def test_root_without_xdg() -> None:
    assert _hidden({}, 0) == {"/run/sandgate", "/run/user/0/sandgate", "/tmp/sandgate-0", "/run/user/0"}


def test_user_with_xdg_set() -> None:
    got = runtimedirs.plan({"XDG_RUNTIME_DIR": "/run/user/1000"}, [1000])
    assert set(got.hide) == {"/run/sandgate", "/run/user/1000/sandgate", "/tmp/sandgate-1000", "/run/user/1000"}
    assert set(got.sandgate) == set(got.hide) - {"/run/user/1000"}  # the parent is hidden, never a sandgate dir


def test_user_without_xdg_still_hides_the_login_sessions_spelling() -> None:
    """cron, su, CI: no XDG_RUNTIME_DIR, yet the user's login session runs a daemon under /run/user/<uid>."""
    assert {"/run/user/1000/sandgate", "/run/user/1000", "/tmp/sandgate-1000"} <= _hidden({}, 1000)


def test_xdg_elsewhere_hides_its_sandgate_dir_not_the_whole_directory() -> None:
    got = _hidden({"XDG_RUNTIME_DIR": "/home/u/.run//"}, 1000)
    assert "/home/u/.run/sandgate" in got and "/home/u/.run" not in got


@pytest.mark.parametrize("xdg", ["relative/dir", "/", ""])
def test_xdg_relative_root_or_empty_adds_nothing(xdg: str) -> None:
    assert _hidden({"XDG_RUNTIME_DIR": xdg}, 1000) == _hidden({}, 1000)


def test_sudo_hides_both_users_dirs() -> None:
    env = {"SUDO_UID": "1000", "XDG_RUNTIME_DIR": "/run/user/1000"}  # sudo -E: the caller's XDG, not owned by root
    ids = runtimedirs.uids(0, 0, env, 1000)
    assert ids == (0, 1000)
    assert {
        "/run/sandgate",
        "/tmp/sandgate-0",
        "/run/user/0",
        "/run/user/0/sandgate",
        "/tmp/sandgate-1000",
        "/run/user/1000",
        "/run/user/1000/sandgate",
    } == _hidden(env, *ids)


def test_uids_take_the_launcher_the_sudo_caller_and_the_command() -> None:
    assert runtimedirs.uids(1000, 1000, {}, None) == (1000,)
    assert runtimedirs.uids(0, 0, {"SUDO_UID": "x1"}, None) == (0,)  # not a number: ignored
    assert runtimedirs.uids(0, 0, {"SUDO_UID": ""}, 65534) == (0, 65534)  # --user nobody
    assert runtimedirs.uids(0, 1000, {}, None) == (0, 1000)  # setuid-style: effective and real


@pytest.mark.parametrize("uid", [0, 1000])
@pytest.mark.parametrize("xdg", ["owned", "not owned", "unset", "missing"])
def test_every_spelling_the_daemon_can_resolve_is_hidden(tmp_path: Path, uid: int, xdg: str) -> None:
    """The daemon's own resolver (control.runtime_base) against the list: whatever it picks is in it."""
    d = tmp_path / "xdg"
    d.mkdir()
    os.chown(d, uid if xdg == "owned" else 4242, 0)
    env = {} if xdg == "unset" else {"XDG_RUNTIME_DIR": str(d if xdg != "missing" else tmp_path / "nope")}
    spelled = str(control.runtime_base(env, uid))
    got = runtimedirs.plan(env, [uid])
    assert spelled in got.sandgate and spelled in got.hide, (spelled, got)


def test_a_writable_root_inside_keeps_its_directory_visible_and_says_so() -> None:
    got = runtimedirs.plan({}, [1000], keep_visible=["/run/user/1000/work", "/tmp"])
    assert "/run/user/1000" not in got.hide and "/run/user/1000/sandgate" in got.hide
    assert got.notes == ("/run/user/1000 stays visible inside: the writable path /run/user/1000/work lies in it",)


# ---- what --expose-socket may never show ---------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/run/sandgate/daemon-1-abc.sock",
        "/tmp/sandgate-4242/daemon-1-abc.sock",  # another uid's, by name alone
        "/run/user/77/sandgate/runs/x/approvals.sock",
        "/srv/xdg/sandgate/daemon.sock",  # this run's XDG spelling
        "/state/trust/x.sock",  # sandgate's own state
    ],
)
def test_refusal_names_sandgate_sockets(path: str) -> None:
    assert runtimedirs.refusal(path, ["/srv/xdg/sandgate"], ["/state/trust"]) is not None


@pytest.mark.parametrize("path", ["/run/user/1000/bus", "/run/user/1000/sandgate-agent", "/tmp/ssh-X/agent.1"])
def test_refusal_lets_other_sockets_through(path: str) -> None:
    assert runtimedirs.refusal(path, ["/run/user/1000/sandgate"], ["/state"]) is None


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch directory outside /tmp: the private /tmp would leave anything under it out of the plans."""
    d = Path(tempfile.mkdtemp(prefix="sandgate-test-rtdirs-", dir="/var/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sockets(base: Path) -> Iterator[Path]:
    """A listening socket in a fake runtime dir, and one in an ordinary directory."""
    held = []
    for where in (base / "sg", base / "agent"):
        where.mkdir()
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(where / "x.sock"))
        held.append(s)
    yield base
    for s in held:
        s.close()


def test_check_exposed_resolves_and_refuses(sockets: Path) -> None:
    sg, agent = str(sockets / "sg"), sockets / "agent" / "x.sock"
    (sockets / "link.sock").symlink_to(agent)
    got = runtimedirs.check_exposed([str(agent), str(sockets / "link.sock"), str(agent)], (sg,), ())
    assert got == (
        runtimedirs.Exposed(str(agent), str(agent)),
        runtimedirs.Exposed(str(sockets / "link.sock"), str(agent)),
    )
    with pytest.raises(runtimedirs.ExposeError, match="sandgate runtime directory"):
        runtimedirs.check_exposed([f"{sg}/x.sock"], (sg,), ())
    with pytest.raises(runtimedirs.ExposeError, match="sandgate's own"):
        runtimedirs.check_exposed([str(agent)], (), (str(sockets / "agent"),))
    os.link(f"{sg}/x.sock", sockets / "renamed.sock")  # the daemon's socket under another name
    with pytest.raises(runtimedirs.ExposeError, match="under another name"):
        runtimedirs.check_exposed([str(sockets / "renamed.sock")], (sg,), ())
    (sockets / "file").write_text("x")
    for bad in (sockets / "file", sockets / "missing", sockets / "agent"):
        with pytest.raises(runtimedirs.ExposeError, match=r"^--expose-socket .*: not an existing unix socket$"):
            runtimedirs.check_exposed([str(bad)], (), ())
    assert runtimedirs.check_exposed([], (sg,), ()) == ()


def test_option_refuses_what_is_not_a_socket_in_one_line(sockets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(sockets)
    assert options._expose_sockets(["agent/x.sock", str(sockets / "agent" / "x.sock")]) == (
        str(sockets / "agent" / "x.sock"),
    )
    with pytest.raises(UsageError, match=r"^--expose-socket agent: not an existing unix socket$"):
        options._expose_sockets(["agent"])


def test_the_option_parses_repeatably() -> None:
    from launcher import cli, cliargs

    args = cli.build_parser().parse_args(["run", "--expose-socket", "/a", "--expose-socket", "/b", "--", "true"])
    assert cliargs.run_args(args).expose_socket == ("/a", "/b")


# ---- the mount plan's half (fsguard/exposed.py) ------------------------------------------------------


def _mplan(**kw: object) -> mounts.MountPlan:
    base: dict[str, object] = dict(
        private_tmp=True, tmp_rebinds=("/tmp/keep",), pins=(), protect=(), placeholders=(), hide_dirs=(), hide_files=()
    )
    return mounts.MountPlan(write_roots=(), **{**base, **kw})  # type: ignore[arg-type]


def test_which_exposed_sockets_need_a_bind() -> None:
    p = _mplan(hide_dirs=("/run/user/1000", "/h/.ssh"), expose=(("/run/user/1000/bus", "/run/user/1000/bus"),))
    assert exposed.needs_bind("/run/user/1000/bus", p) and exposed.needs_bind("/tmp/ssh-X/agent", p)
    assert not exposed.needs_bind("/tmp/keep/agent", p) and not exposed.needs_bind("/var/run/x.sock", p)
    assert exposed.writable_hides(p) == frozenset({"/run/user/1000"})
    assert exposed.writable_hides(_mplan(hide_dirs=("/run/user/1000",))) == frozenset()
    # a symlink in a hidden directory to a socket in the private /tmp: the socket shows at both names
    assert exposed.binds("/h/.ssh/agent.sock", "/tmp/ssh-X/agent.1", p) == (
        ("/tmp/ssh-X/agent.1", "/tmp/ssh-X/agent.1"),
        ("/h/.ssh/agent.sock", "/tmp/ssh-X/agent.1"),
    )
    assert exposed.binds("/srv/agent.sock", "/run/user/1000/bus", p) == (("/run/user/1000/bus", "/run/user/1000/bus"),)
    assert exposed.binds("/var/run/x.sock", "/var/run/x.sock", p) == ()  # visible anyway: nothing to mount


# ---- confinement.plan: the list applied, the sockets recorded, XDG_RUNTIME_DIR -------------------------


@pytest.fixture
def planning(base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (base / "home").mkdir()
    (base / "ws").mkdir()
    monkeypatch.setenv("HOME", str(base / "home"))
    monkeypatch.chdir(base / "ws")
    monkeypatch.setattr("fsguard.landlock.abi_version", lambda: 0)
    return base


def _plan(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, xdg: Path, **kw: object
) -> tuple[confinement.Confinement, dict[str, object], str]:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    log = AuditLog(tmp / "a.jsonl")
    opts = RunOptions(cmd=["true"], audit_path=tmp / "a.jsonl", user=None, verbose=True, **kw)  # type: ignore[arg-type]
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            conf = confinement.plan(opts, log, tmp / "rt")
    finally:
        log.close()
    return conf, dict(read_records(tmp / "a.jsonl")[-1]), err.getvalue()


def test_plan_hides_another_spelling_and_unsets_xdg(planning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = planning / "xdg"
    (xdg / "sandgate").mkdir(parents=True)  # a login session's daemon dir: this run's own is tmp/rt
    conf, rec, err = _plan(planning, monkeypatch, xdg)
    assert str(xdg / "sandgate") in conf.mounts.hide_dirs and str(xdg / "sandgate") in rec["hidden"]  # type: ignore[operator]
    assert "XDG_RUNTIME_DIR" not in conf.env
    assert "sandgate: exposed sockets: -" in err.splitlines()


def test_plan_binds_an_exposed_socket_back_and_records_it(
    planning: Path, monkeypatch: pytest.MonkeyPatch, sockets: Path
) -> None:
    agent = str(sockets / "agent" / "x.sock")
    conf, rec, err = _plan(
        planning, monkeypatch, sockets / "agent", read_deny=(str(sockets / "agent"),), expose=(agent,)
    )
    assert conf.mounts.expose == ((agent, agent),) and conf.exposed == (agent,)
    assert conf.env["XDG_RUNTIME_DIR"] == str(sockets / "agent")  # the exposed socket is found through it
    assert f"sandgate: exposed sockets: {agent}" in err.splitlines()
    assert f"{agent} is exposed inside (--expose-socket)" in rec["warnings"]  # type: ignore[operator]
    assert "is exposed inside" not in err  # -v names it; it is not a warning printed on every run


def test_plan_refuses_a_socket_the_policy_hides_by_name(
    planning: Path, monkeypatch: pytest.MonkeyPatch, sockets: Path
) -> None:
    agent = str(sockets / "agent" / "x.sock")
    with pytest.raises(RunError, match="policy hides this very socket"):
        _plan(planning, monkeypatch, planning, read_deny=(agent,), expose=(agent,))
    (planning / "rt").mkdir()  # this run's own runtime directory: its daemon socket
    with socket.socket(socket.AF_UNIX) as daemon:
        daemon.bind(str(planning / "rt" / "daemon-1-x.sock"))
        with pytest.raises(RunError, match=r"daemon-1-x.sock: refused, it is sandgate's own"):
            _plan(planning, monkeypatch, planning, expose=(str(planning / "rt" / "daemon-1-x.sock"),))

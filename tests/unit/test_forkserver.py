"""launcher/forkserver: the messages, the context key, the code watch, and the protocol against a real
server process (issue 25: a warm run without the interpreter's imports).

What a served run must be: the run a fresh process would have made (same key, else not served), started
only on the caller's "go" (never twice), with the caller's streams, directory, umask, environment and
arguments, its status the caller's. The sandbox side (signals, SIGKILL, hidden socket) is in
tests/e2e/test_forkserver_e2e.py.
"""

from __future__ import annotations

import _socket
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.forkserver import client, codewatch, context, wire

from ..support.daemonfake import REPO, eventually

# ---- wire -----------------------------------------------------------------------------------


def _req(**kw: object) -> wire.Request:
    d: dict[str, object] = {
        "key": "k",
        "argv": ["sandgate", "run", "--", "true"],
        "cwd": "/",
        "env": {"A": "1"},
        "umask": 0o22,
        "tty": False,
    }
    d.update(kw)
    return wire.Request(**d)  # type: ignore[arg-type]


def test_a_request_survives_the_wire() -> None:
    req = _req(argv=["/x/sandgate", "run", "--", "sh", "-c", "echo 'a b'\n"], env={"É": "ü\n"}, tty=True)
    got = wire.decode(req.encode(), wire.FDS + 1)
    assert isinstance(got, wire.Request)
    assert (got.key, got.argv, got.cwd, got.env, got.umask, got.tty) == (
        req.key,
        req.argv,
        req.cwd,
        req.env,
        req.umask,
        req.tty,
    )
    assert wire.decode(wire.STOP, 0) == "stop"
    odd = _req(env={"B": "x=y", "C": "", "D": "\udcff"})  # a value with "=", an empty one, a stray byte
    got = wire.decode(odd.encode(), wire.FDS)
    assert isinstance(got, wire.Request) and got.env == odd.env
    assert isinstance(wire.decode(_raw(*GOOD), 4), wire.Request)


def _raw(*fields: str) -> bytes:
    """A request spelled by hand: MAGIC, key, cwd, umask, tty, argc, argv..., env..."""
    return "\0".join(fields).encode()


GOOD = (wire.MAGIC, "k", "/", "22", "0", "2", "s", "run", "A=1")


def _with(at: int, value: str) -> bytes:
    fields = list(GOOD)
    fields[at] = value
    return _raw(*fields)


@pytest.mark.parametrize(
    ("data", "nfds"),
    [
        (b"", 4),
        (b"\xff\x00garbage", 4),
        (_raw("sandgate-fork-2", *GOOD[1:]), 4),
        (_with(7, "proxy"), 4),  # only `run` is served
        (_with(5, "1"), 4),  # argv ["s"]
        (_with(5, "9"), 4),  # more arguments announced than sent
        (_with(5, "x"), 4),
        (_with(8, "NOEQUALS"), 4),
        (_with(2, "relative"), 4),
        (_with(3, "8"), 4),
        (_with(3, "1000"), 4),
        (_with(3, ""), 4),
        (_with(4, "2"), 4),
        (_raw(*GOOD), 3),  # a stream missing
        (_raw(*GOOD), 5),  # a terminal nobody announced
        (_with(4, "1"), 4),
        (wire.STOP, 1),  # a stop carries no descriptors
    ],
)
def test_the_server_refuses_what_is_not_a_request(data: bytes, nfds: int) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(data, nfds)


@given(st.binary(max_size=200), st.integers(min_value=0, max_value=6))
def test_no_bytes_make_the_decoder_fail_otherwise(data: bytes, nfds: int) -> None:
    try:
        wire.decode(data, nfds)
    except wire.WireError:
        pass


def test_replies_are_framed() -> None:
    assert wire.unframe(wire.frame(b"X", 141)) == (b"X", "141")
    assert wire.unframe(b"") == (b"", "")


# ---- context --------------------------------------------------------------------------------

MOUNTS_A = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 22 0:5 / /proc rw,nosuid - proc proc rw
41 22 8:1 /etc/netns/w/hosts /etc/hosts rw,relatime master:1 - ext4 /dev/sda1 rw
"""
# The same view in another mount namespace (`ip netns exec` again): new mount ids, new peer groups.
MOUNTS_B = MOUNTS_A.replace("22 1 ", "901 900 ").replace("35 22", "902 901").replace("41 22", "903 901")
MOUNTS_B = MOUNTS_B.replace("shared:1", "shared:77").replace("master:1", "master:9")


def test_a_mount_namespace_is_compared_by_what_it_shows() -> None:
    assert context.mounts(MOUNTS_A) == context.mounts(MOUNTS_B)
    assert context.mounts(MOUNTS_A) != context.mounts(MOUNTS_A.replace("0:5", "0:6"))  # another proc
    assert context.mounts(MOUNTS_A) != context.mounts(MOUNTS_A.replace("/etc/netns/w/hosts", "/etc/netns/v/hosts"))
    assert context.mounts(MOUNTS_A) != context.mounts(MOUNTS_A.replace(" rw,nosuid ", " ro,nosuid "))
    assert len(context.mounts(MOUNTS_A + "garbage line\n")) == 3


def test_a_file_bound_from_a_replaced_file_is_another_view(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("a\n")
    line = f"41 22 8:1 /x {f} rw - ext4 /dev/sda1 rw\n"
    before = context.mounts(line)
    (tmp_path / "new").write_text("b\n")
    os.replace(tmp_path / "new", f)  # a new inode at the mount point's path
    assert context.mounts(line) != before


ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "PYTHONPATH": "/a"}


def test_the_key_follows_what_the_interpreter_reads_and_nothing_else() -> None:
    key = context.key(ENV, client.LAUNCHER_DIR)
    assert key == context.key(dict(ENV), client.LAUNCHER_DIR)
    assert key == context.key({**ENV, "HOME": "/elsewhere", "TOKEN": "x", "PATH": "/bin"}, client.LAUNCHER_DIR)
    for changed in ({"PYTHONPATH": "/b"}, {"LANG": "de_DE.UTF-8"}, {"LC_ALL": "C"}, {"PYTHONHASHSEED": "1"}):
        assert context.key({**ENV, **changed}, client.LAUNCHER_DIR) != key, changed
    assert context.key(ENV, "/another/checkout/launcher") != key


def _key_in_child(change: str) -> str:
    """The key computed in a child after `change` (resource limits, nice): what a caller so set up asks for."""
    code = (
        "import os, resource, sys\n"
        f"{change}\n"
        "from launcher.forkserver import context, client\n"
        f"print(context.key({ENV!r}, client.LAUNCHER_DIR))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=30, check=True)
    return r.stdout.strip()


def test_the_key_follows_limits_and_priority() -> None:
    same = _key_in_child("pass")
    assert _key_in_child("pass") == same
    assert _key_in_child("resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))") != same
    assert _key_in_child("os.nice(3)") != same
    assert _key_in_child("os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})") != same or os.cpu_count() == 1


# ---- code watch -----------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for package in codewatch.PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "sub" / "m.py").write_text("")
    return tmp_path


@pytest.mark.parametrize(
    ("touch", "relevant"),
    [
        (lambda t: (t / "launcher" / "sub" / "m.py").write_text("x = 1\n"), True),  # an edit
        (lambda t: (t / "netguard" / "new.py").write_text(""), True),  # a new module
        (lambda t: (t / "sgbase" / "__init__.py").unlink(), True),
        (lambda t: os.utime(t / "fsguard" / "sub" / "m.py"), True),  # touched
        (lambda t: (t / "fsguard" / "newpkg").mkdir(), True),
        (lambda t: os.rename(t / "launcher" / "sub", t / "launcher" / "sub2"), True),
        (lambda t: (t / "launcher" / "sub" / "__pycache__").mkdir(), False),  # the imports' own cache
        (lambda t: (t / "launcher" / "notes.txt").write_text("x"), False),
    ],
)
def test_the_code_watch_sees_code_change_and_only_that(tree: Path, touch: object, relevant: bool) -> None:
    fd = codewatch.watch(str(tree))
    try:
        assert not codewatch.changed(fd)
        touch(tree)  # type: ignore[operator]
        assert codewatch.changed(fd) is relevant
        assert not codewatch.changed(fd)  # drained
    finally:
        os.close(fd)


# ---- the client's choice ----------------------------------------------------------------------

CHOICE = """
import os, sys
sys.argv = ["/x/sandgate", "run", "--", "true"]
from launcher.forkserver import client
client.serve(["run", "--", "true"])
print("full path", client.missed != [])
"""


def _choice(runtime: Path, **kw: object) -> str:
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(runtime), **kw.pop("env", {})}  # type: ignore[dict-item]
    r = subprocess.run(
        [sys.executable, "-c", CHOICE], capture_output=True, text=True, cwd=REPO, env=env, timeout=30, **kw
    )  # type: ignore[call-overload]
    assert r.returncode == 0, r.stderr
    return str(r.stdout.strip())


@pytest.fixture
def runtime() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandgate-fs-"))
    os.chmod(d, 0o700)
    try:
        yield d
    finally:
        _stop_servers(d)
        shutil.rmtree(d, ignore_errors=True)


def test_a_caller_on_a_terminal_or_that_said_no_is_not_served(runtime: Path) -> None:
    assert _choice(runtime) == "full path True"  # looked for a server (none yet): the next warm run spawns one
    assert _choice(runtime, env={"SANDGATE_FORKSERVER": "0"}) == "full path False"
    primary, secondary = os.openpty()
    try:
        assert _choice(runtime, stdin=secondary) == "full path False"  # a terminal: the pty relay's
    finally:
        os.close(primary)
        os.close(secondary)


# ---- a real server ----------------------------------------------------------------------------

SERVER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _start_server(runtime: Path) -> tuple[str, str, subprocess.Popen[bytes]]:
    env = {**SERVER_ENV, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(REPO)}
    key = context.key(env, client.LAUNCHER_DIR)
    path = str(runtime / "sandgate" / context.socket_name(key))
    (runtime / "sandgate").mkdir(mode=0o700, exist_ok=True)
    argv = [sys.executable, "-P", "-m", "launcher.forkserver", "--socket", path, "--key", key, "--idle-exit", "60"]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    assert eventually(lambda: os.path.exists(path) or proc.poll() is not None, timeout=30)
    assert proc.poll() is None, "the fork server did not start"
    s = _connect(path)  # answered once it serves (the socket is claimed before the imports)
    try:
        s.send(_raw(wire.MAGIC, "not-a-key", "/", "22", "0", "2", "s", "run"))
        assert s.recv(8) == b"R"
    finally:
        s.close()
    return path, key, proc


def _stop_servers(runtime: Path) -> None:
    if (runtime / "sandgate").is_dir():
        client.stop_all(str(runtime / "sandgate"))


def _connect(path: str) -> _socket.socket:
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    s.settimeout(20)
    s.connect(path)
    return s


def _send(s: _socket.socket, req: wire.Request, fds: list[int]) -> tuple[bytes, list[int]]:
    s.sendmsg([req.encode()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array("i", fds))])
    data, anc, _, _ = s.recvmsg(64, _socket.CMSG_SPACE(4))
    got = [fd for _, _, raw in anc for fd in array("i", raw[: len(raw) - len(raw) % 4])]
    return data, got


DRY = ["sandgate", "run", "--dry-run", "--", "sh", "-c", "echo hi"]


def test_a_served_run_is_the_callers_and_its_status_comes_back(runtime: Path, tmp_path: Path) -> None:
    path, key, proc = _start_server(runtime)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    cwd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    env = {**SERVER_ENV, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    s = _connect(path)
    try:
        data, pidfds = _send(s, wire.Request(key, DRY, str(tmp_path), env, 0o27, False), [0, out_w, err_w, cwd])
        assert data[:1] == b"P" and len(pidfds) == 1
        s.send(b"G")
        os.close(out_w)
        os.close(err_w)
        assert wire.unframe(s.recv(64)) == (b"X", "0")
        out = ""
        while select.select([out_r], [], [], 10)[0]:  # to EOF: no spare worker holds the caller's pipe
            chunk = os.read(out_r, 1 << 16).decode()
            if not chunk:
                break
            out += chunk
        else:
            pytest.fail("the caller's stdout stayed open after its run ended")
        assert "sh -c 'echo hi'" in out or "echo hi" in out  # the dry run's boundary, on the caller's stdout
        assert str(tmp_path) in out  # in the caller's directory
    finally:
        s.close()
        for fd in (out_r, err_r, cwd, *pidfds):
            os.close(fd)
        client.stop_all(str(runtime / "sandgate"))
        assert proc.wait(timeout=20) == 0  # no run left: it exits at once
    assert not os.path.exists(path)


def test_without_go_nothing_runs_and_another_key_is_refused(runtime: Path, tmp_path: Path) -> None:
    path, key, proc = _start_server(runtime)
    out_r, out_w = os.pipe()
    cwd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    env = {**SERVER_ENV, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(REPO)}
    try:
        s = _connect(path)
        data, fds = _send(
            s, wire.Request("another-context", DRY, str(tmp_path), env, 0o22, False), [0, out_w, out_w, cwd]
        )
        assert data == b"R" and fds == []  # not its twin: the caller takes the full path
        s.close()
        s = _connect(path)
        data, fds = _send(s, wire.Request(key, DRY, str(tmp_path), env, 0o22, False), [0, out_w, out_w, cwd])
        assert data[:1] == b"P"
        s.close()  # gave up before "go" (a timeout, say): it will run the command itself
        os.close(out_w)
        # The worker ran nothing and is gone, and the spare forked after it holds no copy: EOF, at once.
        assert select.select([out_r], [], [], 10)[0] and os.read(out_r, 1 << 16) == b""
        for fd in fds:
            os.close(fd)
    finally:
        os.close(out_r)
        os.close(cwd)
        client.stop_all(str(runtime / "sandgate"))
        proc.wait(timeout=20)


def test_a_server_started_from_another_context_refuses_to_serve(runtime: Path) -> None:
    env = {**SERVER_ENV, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(REPO)}
    (runtime / "sandgate").mkdir(mode=0o700)
    path = str(runtime / "sandgate" / "fork-wrong.sock")
    argv = [sys.executable, "-P", "-m", "launcher.forkserver", "--socket", path, "--key", "wrong"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not wrong" in r.stderr
    assert Path(path + ".refused").exists() and not Path(path).exists()  # and the clients do not start it again


def test_only_its_own_uid_is_served(runtime: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs as root (CI): it connects as another uid")
    path, key, proc = _start_server(runtime)
    os.chmod(runtime, 0o755)
    os.chmod(runtime / "sandgate", 0o755)
    os.chmod(path, 0o777)  # the socket reachable: the server's own check is what refuses
    code = (
        "import _socket, sys\n"
        "s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)\n"
        f"s.settimeout(10); s.connect({path!r})\n"
        "try:\n"
        f"    s.send({_req(key=key).encode()!r})\n"
        "    print(repr(s.recv(64)))\n"
        "except (BrokenPipeError, ConnectionResetError):  # closed before or after our request\n"
        "    print(repr(b''))\n"
    )
    try:
        r = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.stdout.strip() == "b''", r.stderr  # closed without an answer: no worker for uid 65534
    finally:
        client.stop_all(str(runtime / "sandgate"))
        proc.wait(timeout=20)


def test_an_idle_server_exits_and_removes_its_socket(runtime: Path) -> None:
    env = {**SERVER_ENV, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(REPO)}
    key = context.key(env, client.LAUNCHER_DIR)
    (runtime / "sandgate").mkdir(mode=0o700)
    path = str(runtime / "sandgate" / context.socket_name(key))
    argv = [sys.executable, "-P", "-m", "launcher.forkserver", "--socket", path, "--key", key, "--idle-exit", "0.5"]
    t = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "stopping (idle)" in r.stderr
    assert time.monotonic() - t >= 0.5 and not os.path.exists(path)


def test_sigterm_stops_a_server_at_once(runtime: Path) -> None:
    _, _, proc = _start_server(runtime)  # --idle-exit 60: only the signal can end it within the wait below
    proc.send_signal(15)
    assert proc.wait(timeout=10) == 0


def test_descriptors_are_packed_as_the_kernel_reads_them() -> None:
    fds = [0, 1, 2, 1023, 2**31 - 1]
    assert wire.pack_fds(fds) == array("i", fds).tobytes()
    rights = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS)
    anc = [(rights[0], rights[1], wire.pack_fds(fds)), (rights[0], 99, b"\x01\x00\x00\x00")]
    assert wire.unpack_fds(anc, rights) == fds  # other ancillary data ignored


def test_cleanup_finds_dead_sockets_and_old_refusals_only(runtime: Path) -> None:
    path, _, proc = _start_server(runtime)  # a live one: kept
    rt = runtime / "sandgate"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(rt / "fork-1-dead.sock"))  # bound, never listening: what a SIGKILLed server leaves
    dead.close()
    (rt / "fork-1-old.sock.refused").write_text("x")
    os.utime(rt / "fork-1-old.sock.refused", (0, 0))
    (rt / "fork-1-new.sock.refused").write_text("x")  # refused just now: still honoured
    try:
        assert client.stale_files(str(rt)) == [str(rt / "fork-1-old.sock.refused"), str(rt / "fork-1-dead.sock")]
        assert not client._refused_lately(str(rt / "fork-1-old.sock.refused"))
        assert client._refused_lately(str(rt / "fork-1-new.sock.refused"))
    finally:
        client.stop_all(str(rt))
        proc.wait(timeout=20)
    assert not os.path.exists(path)


def test_a_stopping_server_removes_its_socket_before_its_last_run_ends(runtime: Path, tmp_path: Path) -> None:
    """Its file goes with the stop, not with the process: a server killed while its runs end leaves none."""
    path, key, proc = _start_server(runtime)
    cwd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    env = {**SERVER_ENV, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(REPO)}
    s = _connect(path)
    try:
        data, pidfds = _send(s, wire.Request(key, DRY, str(tmp_path), env, 0o22, False), [0, 1, 2, cwd])
        assert data[:1] == b"P"  # a worker waits for our "go": a run in progress
        client.stop_all(str(runtime / "sandgate"))
        assert eventually(lambda: not os.path.exists(path), timeout=10)
        assert proc.poll() is None  # still there for its run
    finally:
        s.close()  # no go: the worker ends, then the server
        for fd in (cwd, *pidfds):
            os.close(fd)
        assert proc.wait(timeout=20) == 0


def test_a_change_queued_before_a_request_is_never_served(runtime: Path, tmp_path: Path) -> None:
    """An edit, then at once a request: whichever the server reads first, the old code serves nothing."""
    tree = tmp_path / "tree"
    for part in (*codewatch.PACKAGES, "allowlists"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**SERVER_ENV, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(tree)}
    key = context.key(env, str(tree / "launcher"))
    (runtime / "sandgate").mkdir(mode=0o700)
    path = str(runtime / "sandgate" / context.socket_name(key))
    argv = [sys.executable, "-P", "-m", "launcher.forkserver", "--socket", path, "--key", key]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, cwd="/")
    cwd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        assert eventually(lambda: os.path.exists(path) or proc.poll() is not None, timeout=30)
        s = _connect(path)  # in the loop once it answers
        s.send(_raw(wire.MAGIC, "not-a-key", "/", "22", "0", "2", "s", "run"))
        assert s.recv(8) == b"R"
        s.close()
        with open(tree / "sgbase" / "__init__.py", "a") as f:
            f.write("# changed\n")
        try:
            s = _connect(path)
            data, fds = _send(s, wire.Request(key, DRY, str(tmp_path), env, 0o22, False), [0, 1, 2, cwd])
            s.close()
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
            data, fds = b"R", []  # already gone: not served either
        assert data in (b"R", b"") and fds == []  # refused, or closed unanswered as it stopped
        assert proc.wait(timeout=20) == 0 and not os.path.exists(path)
    finally:
        os.close(cwd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("locale", [{}, {"LANG": "C"}, {"LANG": "C.UTF-8"}, {"PYTHONUTF8": "0"}, {"PYTHONUTF8": "1"}])
def test_a_server_started_by_a_caller_has_that_callers_key_in_any_locale(locale: dict[str, str]) -> None:
    """`env -i` (the C locale: UTF-8 mode and a coerced LC_CTYPE, PEP 538/540) once made every server
    another context than its caller: it refused, and such callers were never served."""
    code = (
        "import os, subprocess, sys\n"
        "from launcher.forkserver import context, client\n"
        "mine = context.key(os.environ, client.LAUNCHER_DIR)\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith(('PYTHON', 'LC_')) or k in ('PATH', 'LANG')}\n"
        "show = 'from launcher.forkserver import context, client; import os; "
        "print(context.key(os.environ, client.LAUNCHER_DIR))'\n"
        "theirs = subprocess.run([sys.executable, *client.server_flags(), '-c', show], env=env,\n"
        "                        capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(mine == theirs, sys.flags.utf8_mode)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **locale}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    same, utf8 = r.stdout.split()
    assert same == "True", (locale, utf8)

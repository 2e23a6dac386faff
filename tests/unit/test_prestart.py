"""launcher/prestart.py: `sandgate run` reaches or spawns its daemon before its own imports (issue 25).

The spawned daemon must hold nothing of its caller (an inherited pipe would keep the caller's reader
waiting for EOF as long as the daemon lives), run in its own session from `/`, and see only DAEMON_ENV;
a second run must find it and connect; what was found for one socket is never handed to another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher import prestart
from netguard.daemon.control import ControlClient

from ..support.daemonfake import REPO, eventually


def test_command_args_know_the_console_script_and_python_m() -> None:
    assert prestart.command_args(["/x/.venv/bin/sandgate", "run", "--", "true"], []) == ["run", "--", "true"]
    orig = ["/usr/bin/python3", "-m", "launcher.cli", "run", "-q", "--", "true"]
    assert prestart.command_args(["-m"], orig) == ["run", "-q", "--", "true"]
    assert prestart.command_args(["-m"], ["python", "-m", "launcher.timings"]) is None
    assert prestart.command_args(["/usr/bin/pytest", "run"], ["pytest", "run"]) is None  # not sandgate
    assert prestart.command_args([], []) is None


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["run", "--", "curl", "x"], True),
        (["run", "--allow", "pypi", "--", "pip", "--help"], True),  # CMD's own --help is CMD's
        (["run", "--help"], False),
        (["run", "-h", "--", "true"], False),
        (["run", "--dry-run", "--", "true"], False),  # starts nothing
        (["run", "--", "sh", "--dry-run"], True),
        (["audit", "summary"], False),
        (["--version"], False),
        ([], False),
        (None, False),
    ],
)
def test_only_a_run_that_will_run_looks_for_its_daemon(args: list[str] | None, want: bool) -> None:
    assert prestart.wanted(args) is want


@pytest.fixture
def runtime() -> Iterator[Path]:
    """An XDG_RUNTIME_DIR of the test's own, short (AF_UNIX paths are), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="sgp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


FIRST = """
import json, os, select, sys
extra_r, extra_w = os.pipe()          # a caller's descriptor without close-on-exec, as a shell may pass one
os.set_inheritable(extra_w, True)
from launcher import prestart
from netguard.daemon import daemonpath
prestart.start()
path = daemonpath.socket_path(daemonpath.runtime_dir())
early = prestart.take(path)
assert early is not None and early.sock is None and early.ready_fd is not None
select.select([early.ready_fd], [], [], 30)
print(json.dumps({"path": path, "ready": os.read(early.ready_fd, 64).decode(), "pipe": os.fstat(extra_w).st_ino}))
"""

SECOND = """
import json
from launcher import prestart
from netguard.daemon import daemonpath
from netguard.daemon.control import ControlClient
prestart.start()
path = daemonpath.socket_path(daemonpath.runtime_dir())
assert prestart.take(path + ".other") is None  # found for one socket, never handed to another
prestart.start()
early = prestart.take(path)
assert early is not None and early.ready_fd is None and early.sock is not None
print(json.dumps(ControlClient(early.sock).status()))
"""


def _python(code: str, runtime: Path) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(runtime), "SECRET_TOKEN": "not for the daemon"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def test_a_spawned_daemon_holds_nothing_of_its_caller_and_the_next_run_connects(runtime: Path) -> None:
    first = _python(FIRST, runtime)
    assert first["ready"] == "ready\n"
    client = ControlClient.connect(str(first["path"]))
    pid = client.status()["pid"]
    try:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert f"pipe:[{first['pipe']}]" not in fds  # the caller's pipe did not live on in the daemon
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
        assert os.readlink(f"/proc/{pid}/fd/2") == str(runtime / "sandgate" / "daemon.log")
        assert os.getsid(pid) == pid  # its own session: the caller's terminal's Ctrl-C is not for it
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert {e.split(b"=")[0].decode() for e in env if e} <= set(prestart.DAEMON_ENV)
        second = _python(SECOND, runtime)
        assert second["pid"] == pid  # the same daemon, reached by the early connect
    finally:
        client.stop()
        client.close()
        assert eventually(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout=10)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


CLOSED_STREAMS = """
import json, os, select, sys
os.close(1)                                    # `sandgate run ... >&-`: the pipe would take fd 1
from launcher import prestart
from netguard.daemon import daemonpath
path = daemonpath.socket_path(daemonpath.runtime_dir())
r = prestart.spawn(path)
select.select([r], [], [], 30)
os.write(2, json.dumps({"path": path, "ready": os.read(r, 64).decode()}).encode())
"""


def test_a_daemon_spawned_with_a_standard_stream_closed_still_reports_ready(runtime: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(runtime)}
    code = [sys.executable, "-c", CLOSED_STREAMS]
    r = subprocess.run(code, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stderr)
    assert got["ready"] == "ready\n"
    with ControlClient.connect(str(got["path"])) as client:
        pid = client.status()["pid"]
        client.stop()
    assert eventually(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout=10)

"""The suite lock (tests/support/suitelock.py): a second suite waits, says so once, and runs once released."""

from __future__ import annotations

import fcntl
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

from ..support import suitelock
from ..support.runner import REPO

#: A second "suite": takes the lock at PATHS, then says it holds it.
SECOND = """
import sys
from tests.support import suitelock
suitelock.hold(lambda line: print(line, file=sys.stderr, flush=True), tuple(sys.argv[1:]))
print("held", flush=True)
"""


def _second(*paths: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != suitelock.HELD}
    cmd = [sys.executable, "-c", SECOND, *map(str, paths)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _line(stream: object, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
    assert sel.select(timeout), "nothing said in time"
    return stream.readline()  # type: ignore[attr-defined,no-any-return]


def test_a_second_suite_waits_while_the_lock_is_held_and_proceeds_once_released(tmp_path: Path) -> None:
    lock = tmp_path / "sandgate-tests.lock"
    first = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(first, fcntl.LOCK_EX)  # the first suite
    proc = _second(lock)
    try:
        said = _line(proc.stderr, 30)
        assert "another test suite on this machine holds" in said and str(lock) in said, said
        time.sleep(0.5)
        assert proc.poll() is None  # still waiting, not holding
        os.close(first)  # the first suite ends
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and out == "held\n" and err == "", (out, err)
    finally:
        proc.kill()
        proc.wait()


def test_a_free_lock_is_taken_silently_and_the_next_path_serves_when_one_cannot_be_opened(tmp_path: Path) -> None:
    lock = tmp_path / "sandgate-tests.lock"
    proc = _second(tmp_path / "no-such-dir" / "sandgate-tests.lock", lock)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == "held\n" and err == "", (out, err)
    assert lock.exists()


def test_the_holder_marks_its_children_as_the_same_suite(tmp_path: Path) -> None:
    """xdist workers and inner pytest runs inherit the mark: tests/conftest.py then never waits for itself."""
    before = os.environ.pop(suitelock.HELD, None)
    try:
        fd = suitelock.hold(lambda line: None, (str(tmp_path / "l"),))
        assert os.environ[suitelock.HELD] == str(os.getpid())
        suitelock.release(fd)
        assert suitelock.HELD not in os.environ
        again = os.open(tmp_path / "l", os.O_RDWR)
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: free at once
        os.close(again)
    finally:
        if before is not None:
            os.environ[suitelock.HELD] = before

"""The test command (tests/support/suiterun.py, `python -m tests`) and the refusal of tests/e2e/ with -n.

The runner's plan is checked as data; real runs of it, on a tiny tree of its own (a failing test
in the rest, a passing one in e2e/), show both parts run under one lock, and the exit code.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..support import suitelock, suiterun
from ..support.runner import REPO

TESTS, MACHINE = str(suiterun.TESTS), str(suiterun.MACHINE)


def test_no_arguments_run_the_rest_in_two_processes_then_e2e_alone() -> None:
    rest, machine = suiterun.plan([], REPO)
    assert rest.argv == ("-n", "2", f"--ignore={MACHINE}", TESTS)
    assert machine.argv == ("-n0", MACHINE)


def test_options_go_to_both_parts_and_their_values_are_not_paths() -> None:
    rest, machine = suiterun.plan(["-k", "inspect", "-x", "--durations", "30", "-q"], REPO)
    assert rest.argv[3:] == ("-k", "inspect", "-x", "--durations", "30", "-q", TESTS)
    assert machine.argv == ("-k", "inspect", "-x", "--durations", "30", "-q", "-n0", MACHINE)
    assert suiterun.stops_early(["-x"]) and suiterun.stops_early(["--maxfail=2"]) and not suiterun.stops_early(["-q"])


def test_each_path_goes_to_the_part_that_holds_it() -> None:
    (only_rest,) = suiterun.plan(["tests/unit/test_docs.py"], REPO)
    assert only_rest.argv[-1] == str(REPO / "tests/unit/test_docs.py") and "-n0" not in only_rest.argv
    (only_machine,) = suiterun.plan(["tests/e2e/test_world.py::test_x", "-k", "y"], REPO)
    assert only_machine.argv == ("-k", "y", "-n0", str(REPO / "tests/e2e/test_world.py::test_x"))
    rest, machine = suiterun.plan(["tests", "tests/e2e"], REPO)  # tests holds both: e2e/ once
    assert rest.argv[-1] == str(REPO / "tests") and machine.argv == ("-n0", MACHINE)
    (from_inside,) = suiterun.plan(["test_world.py"], REPO / "tests" / "e2e")
    assert from_inside.argv == ("-n0", str(REPO / "tests/e2e/test_world.py"))


@pytest.mark.parametrize(
    ("codes", "want"),
    [([0, 0], 0), ([1, 0], 1), ([0, 1], 1), ([4, 1], 4), ([0, 5], 0), ([5, 0], 0), ([5, 5], 5), ([2], 2)],
)
def test_the_suite_fails_when_either_part_fails(codes: list[int], want: int) -> None:
    assert suiterun.overall(codes) == want


def test_the_summary_names_each_part_and_one_that_did_not_run() -> None:
    parts = suiterun.plan([], REPO)
    lines = suiterun.summary(parts, [1]).splitlines()
    assert lines == [
        "sandgate tests: the rest, in 2 processes: exit 1 (tests failed)",
        "sandgate tests: the machine-wide tests/e2e/, one at a time: not run (stopped after a failure or an interrupt)",
    ]


#: Each tiny test writes whether the suite lock is held (by another process: flock refuses it) and
#: whether it runs marked as the holding suite; the rest's test then fails.
TINY = """
import fcntl, os
from pathlib import Path


def _mark(name):
    fd = os.open({lock!r}, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = "free"
    except BlockingIOError:
        held = "held"
    finally:
        os.close(fd)
    Path({marks!r}, name).write_text(held + " " + os.environ.get({env!r}, "unmarked"))
"""


def _tiny_suite(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A checkout of two tests, the rest's failing and e2e/'s passing, each leaving a mark; a lock of its own."""
    marks, lock = root / "marks", root / "sandgate-tests.lock"
    marks.mkdir()
    (root / "tests" / "e2e").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p no:cacheprovider'\n")
    tiny = TINY.format(lock=str(lock), marks=str(marks), env=suitelock.HELD)
    (root / "tests" / "test_rest.py").write_text(f"{tiny}\ndef test_rest():\n    _mark('rest')\n    assert False\n")
    (root / "tests" / "e2e" / "test_machine.py").write_text(f"{tiny}\ndef test_machine():\n    _mark('machine')\n")
    for name, value in (("ROOT", root), ("TESTS", root / "tests"), ("MACHINE", root / "tests" / "e2e")):
        monkeypatch.setattr(suiterun, name, value)
    hold = suitelock.hold
    monkeypatch.setattr(suitelock, "hold", lambda say: hold(say, (str(lock),)))  # not the machine's lock
    monkeypatch.delenv(suitelock.HELD, raising=False)  # so the runner takes it, as from a shell
    return marks, lock


def test_both_parts_run_under_one_lock_and_a_failing_first_part_fails_the_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    marks, lock = _tiny_suite(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert suiterun.main([]) == 1
    me = str(os.getpid())
    assert (marks / "rest").read_text() == (marks / "machine").read_text() == f"held {me}"  # held, and they are it
    err = capfd.readouterr().err
    assert "the rest, in 2 processes: exit 1 (tests failed)" in err
    assert "the machine-wide tests/e2e/, one at a time: exit 0 (passed)" in err
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at the end: free at once
    os.close(fd)
    assert suitelock.HELD not in os.environ
    (marks / "machine").unlink()
    assert suiterun.main(["-x"]) == 2  # stop at the first failure (xdist says "interrupted"): e2e/ never starts
    assert not (marks / "machine").exists() and "not run" in capfd.readouterr().err


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, suitelock.HELD: str(os.getpid())}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_plain_pytest_refuses_e2e_with_n_and_names_the_command() -> None:
    for paths in (["tests/e2e/test_world.py"], ["tests"], ["."]):
        res = _pytest("-n", "2", *paths)
        assert res.returncode == 4, (paths, res.stdout, res.stderr)
        assert "run one at a time" in res.stderr and "python -m tests" in res.stderr, res.stderr
    allowed = _pytest("-n", "2", "--ignore=tests/e2e", "--ignore=tests/unit", "tests")  # as the runner's rest
    assert allowed.returncode == 5 and "bringing up nodes" in allowed.stdout, (allowed.stdout, allowed.stderr)
    serial = _pytest("tests/e2e/test_world.py", "-k", "a_name_no_test_has")
    assert serial.returncode == 5, (serial.stdout, serial.stderr)


#: The runner on a tiny tree (argv: its root), as `python -m tests` would run it from a shell.
DRIVE = """
import sys
import time
from pathlib import Path
from tests.support import suiterun
root = Path(sys.argv[1])
suiterun.ROOT, suiterun.TESTS, suiterun.MACHINE = root, root / "tests", root / "tests" / "e2e"
sys.exit(suiterun.main([]))
"""


def test_a_sigterm_reaches_the_running_part_and_the_suite_stops_there(tmp_path: Path) -> None:
    started, ran = tmp_path / "started", tmp_path / "e2e-ran"
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p no:cacheprovider'\n")
    rest = f"import time\nfrom pathlib import Path\n\ndef test_rest():\n    Path({str(started)!r}).touch()\n"
    (tmp_path / "tests" / "test_rest.py").write_text(rest + "    time.sleep(60)\n")
    (tmp_path / "tests" / "e2e" / "test_machine.py").write_text(f"def test_machine():\n    open({str(ran)!r}, 'w')\n")
    env = {**os.environ, suitelock.HELD: str(os.getpid()), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVE, str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), "the rest's test never started"
        proc.terminate()
        _, err = proc.communicate(timeout=45)  # not the 60 s the test sleeps: the pytest it ran was stopped
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143 and not ran.exists(), err
    assert "exit 143 (ended by signal 15)" in err and "one at a time: not run" in err, err

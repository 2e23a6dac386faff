"""A real terminal inside (issue 26, item 1): on a terminal, the command gets a pty of the sandbox's
own devpts as its controlling terminal, relayed to the user's; the user's terminal never enters.

Each test starts sandgate on a pty made here (DRIVER: the "user's terminal"), in a test world, and
types at it like a person. The checks look at what the user's terminal received, at what the
command saw inside, and at sandgate's exit status.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.rootless import UnprivilegedUser
from ..support.runner import Sandgate, env
from ..support.world import World, new_world

DRIVER = textwrap.dedent("""\
    # The user's terminal: a pty of 24x80 whose slave is sandgate's stdin/stdout/stderr (stdout: a file
    # with --stdout FILE; stdin: a pipe carrying TEXT with --stdin TEXT). Steps (argv[1], JSON):
    # ["wait", text] for output (after the last wait's), ["send", text] keys typed, ["resize", rows, cols] the window,
    # ["kill", "SIGINT"] a signal to sandgate, ["pause", seconds].
    # Prints one JSON line: exit status, the terminal's output, the bytes left unread in its input queue.
    import fcntl, json, os, select, signal, struct, sys, termios, time
    steps, mode, arg, argv = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    master, slave = os.openpty()
    def size(rows, cols):
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    size(24, 80)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        if mode == "--stdout":
            os.dup2(os.open(arg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
        if mode == "--stdin":
            r, w = os.pipe()
            os.write(w, arg.encode())
            os.close(w)
            os.dup2(r, 0)
        os.execvp(argv[0], argv)
    out, status, mark = b"", None, 0  # a wait looks only at the output after what the last one found
    def pump(seconds, until=None):
        global out, status, mark
        end = time.time() + seconds
        while time.time() < end and not (until and until in out[mark:]):
            if select.select([master], [], [], 0.1)[0]:
                out += os.read(master, 65536)
            elif status is not None:
                return
            if status is None:
                done, st = os.waitpid(pid, os.WNOHANG)
                status = os.waitstatus_to_exitcode(st) if done else None
        if until and until in out[mark:]:
            mark = out.index(until, mark) + len(until)
    t0, times = time.time(), []  # seconds into the run at which each step was done
    for step in steps:
        times.append(round(time.time() - t0, 2))
        if step[0] == "wait":
            pump(30, step[1].encode())
        elif step[0] == "send":
            os.write(master, step[1].encode())
        elif step[0] == "pause":
            pump(step[1])
        elif step[0] == "kill":
            os.kill(pid, getattr(signal, step[1]))  # sent to sandgate itself, not typed
        elif step[0] == "resize":
            size(step[1], step[2])  # the kernel sends SIGWINCH to sandgate, the terminal's foreground
    pump(60)
    if status is None:  # a test that failed to end it: sandgate (and with it the sandbox) goes
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    pending = struct.unpack("i", fcntl.ioctl(slave, termios.FIONREAD, b"\\0" * 4))[0]
    print(json.dumps({"status": status, "out": out.decode(errors="replace").replace("\\r", ""),
                      "pending": pending, "outer_dev": os.fstat(slave).st_dev, "times": times}))
    """)

# Inside: what the command's terminal is (printed as JSON on one line).
WHO_AM_I = textwrap.dedent("""\
    import json, os
    fds = {}
    for fd in (0, 1, 2):
        st = os.fstat(fd)
        fds[fd] = [os.ttyname(fd) if os.isatty(fd) else None, st.st_dev]
    t = os.open("/dev/tty", os.O_RDWR)
    seen = []  # every descriptor of every process it can look at
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                names = os.listdir(f"/proc/{p}/fd")
            except OSError:
                continue
            for n in names:
                try:
                    seen.append(os.stat(f"/proc/{p}/fd/{n}").st_dev)
                except OSError:
                    pass
    print("WHO=" + json.dumps({"fds": fds, "devtty_fg": os.tcgetpgrp(t), "seen": seen,
                               "pgrp": os.getpgrp(), "fg": os.tcgetpgrp(0), "sid": os.getsid(0), "pid": os.getpid()}))
    """)
INJECT = textwrap.dedent("""\
    import fcntl, os, termios
    for name, fd in (("fd0", 0), ("devtty", os.open("/dev/tty", os.O_RDWR))):
        try:
            for c in b"INJECTED":
                fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))
            print(f"tiocsti-{name}=ok")
        except OSError as e:
            print(f"tiocsti-{name}={e.strerror}")
    """)


ASK_IP = "198.51.100.26"  # inside the world's fake internet


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    with new_world() as w:
        w.add_host("ask.test", ASK_IP)
        w.serve("https", ASK_IP, 443, "ask.test")
        yield w


def drive(
    world: Any,
    argv: list[str],
    steps: list[list[Any]],
    mode: str = "-",
    arg: str = "-",
    cwd: Path | None = None,
    home: Path | None = None,
) -> dict[str, Any]:
    """`argv` on a fresh terminal, `steps` typed at it; what the terminal saw (DRIVER's JSON line)."""
    r = world.run(
        [sys.executable, "-c", DRIVER, json.dumps(steps), mode, arg, *argv],
        cwd=cwd or world.tmp,
        env={**env(), **({"HOME": str(home)} if home else {})},
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    got: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return got


def sg(world: World, *cmd: str) -> list[str]:
    return Sandgate(world, cwd=world.tmp, quiet=True).argv(audit=world.tmp / f"a-{time.monotonic_ns()}.jsonl", cmd=cmd)


def who(out: str) -> dict[str, Any]:
    line = next(x for x in out.splitlines() if x.startswith("WHO="))
    got: dict[str, Any] = json.loads(line[4:])
    return got


def test_tty_names_a_pty_of_the_sandboxs_own_devpts_and_the_users_terminal_is_not_inside(world: World) -> None:
    r = drive(world, sg(world, "sh", "-c", f"tty; stty size; python3 -c '{WHO_AM_I}'; exit 3"), [])
    lines = r["out"].splitlines()
    assert r["status"] == 3 and lines[0].startswith("/dev/pts/") and lines[1] == "24 80", r
    got = who(r["out"])
    assert {got["fds"][fd][0] for fd in "012"} == {lines[0]}, got  # ttyname() on every std fd: one terminal
    inner = got["fds"]["0"][1]
    assert {got["fds"][fd][1] for fd in "012"} == {inner} and inner != r["outer_dev"], (got, r["outer_dev"])
    assert r["outer_dev"] not in got["seen"] and inner in got["seen"], got  # the control: the scan saw ttys
    # Its own session, in the foreground of its terminal, which /dev/tty opens too.
    assert got["sid"] == got["pgrp"] == got["fg"] == got["devtty_fg"], got


def test_the_same_script_bare_sees_the_users_terminal(world: World) -> None:
    """The control for the test above: outside a sandbox, WHO_AM_I does find the driver's terminal."""
    r = drive(world, ["python3", "-c", WHO_AM_I], [])
    got = who(r["out"])
    assert {got["fds"][fd][1] for fd in "012"} == {r["outer_dev"]} and r["outer_dev"] in got["seen"], got


def test_ttyname_works_for_python(world: World) -> None:
    r = drive(world, sg(world, "python3", "-c", "import os; print('name=' + os.ttyname(0))"), [])
    assert r["status"] == 0 and "name=/dev/pts/" in r["out"], r


def test_ctrl_c_interrupts_the_command_and_sandgate_exits_130(world: World) -> None:
    t0 = time.monotonic()
    r = drive(world, sg(world, "sh", "-c", "echo ready; exec sleep 100"), [["wait", "ready"], ["send", "\x03"]])
    assert r["status"] == 130 and time.monotonic() - t0 < 60, r


def test_ctrl_z_and_job_control_belong_to_the_shell_inside(world: World) -> None:
    steps: list[list[Any]] = [
        ["wait", "# "],
        ["send", "bash -c 'printf \"st%sed\\n\" art; exec sleep 100'\r"],  # "started": the job runs
        ["wait", "started"],
        ["send", "\x1a"],  # ^Z: the inner pty's line discipline stops the shell's foreground job
        ["wait", "Stopped"],
        ["wait", "# "],
        ["send", "jobs; fg\r"],
        ["wait", "sleep 100'"],  # fg names the job before it hands it the terminal:
        ["pause", 0.5],  # a ^C sooner would be the shell's
        ["send", "\x03"],
        ["wait", "# "],
        ["send", "echo status-$?\r"],
        ["wait", "status-130"],
        ["wait", "# "],
        ["send", "exit 7\r"],
    ]
    r = drive(world, sg(world, "bash", "--norc", "--noprofile", "-i"), steps)
    assert r["status"] == 7 and "Stopped" in r["out"] and "status-130" in r["out"], r
    assert "no job control" not in r["out"] and r["times"][-1] < 25, r


def test_started_in_the_background_it_leaves_the_terminal_alone_and_takes_it_after_fg(world: World) -> None:
    """`sandgate run -- cmd &` in an interactive shell: no raw mode, no reading the keys (the shell
    reads them: `echo shell-$((6*7))` runs there); after `fg` the keys are the command's."""
    line = shlex.join(sg(world, "sh", "-c", "printf 'st%sed\\n' art; read x; echo got=$x"))  # not its own echo
    steps: list[list[Any]] = [
        ["wait", "# "],
        ["send", f"{line} &\r"],
        ["wait", "started"],
        ["send", "echo shell-$((6*7))\r"],
        ["wait", "shell-42"],
        ["send", "fg\r"],
        ["wait", "sh -c"],  # bash names the job it brings back
        ["send", "hi\r"],
        ["wait", "got=hi"],
        ["wait", "# "],  # the shell's prompt again: keys typed before it would still be the command's
        ["send", "exit 5\r"],
    ]
    r = drive(world, ["bash", "--norc", "--noprofile", "-i"], steps)
    assert r["status"] == 5 and "shell-42" in r["out"] and "got=hi" in r["out"], r
    assert r["times"][-1] < 25, r


def test_a_resize_of_the_users_terminal_reaches_the_command(world: World) -> None:
    script = "stty size; trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.1; done"
    r = drive(world, sg(world, "sh", "-c", script), [["wait", "ready"], ["resize", 40, 100], ["wait", "40 100"]])
    assert r["status"] == 0 and r["out"].splitlines()[:2] == ["24 80", "ready"] and "40 100" in r["out"], r


def test_stdout_redirected_to_a_file_stays_the_file(world: World) -> None:
    target = world.tmp / f"out-{time.monotonic_ns()}.txt"
    script = "echo to-file; tty; [ -t 1 ] || echo stdout-not-a-tty >&2; [ -t 0 ] && echo stdin-tty >&2"
    r = drive(world, sg(world, "sh", "-c", script), [], "--stdout", str(target))
    written = target.read_text().splitlines()
    assert r["status"] == 0 and written[0] == "to-file" and written[1].startswith("/dev/pts/"), (written, r)
    assert "stdout-not-a-tty" in r["out"] and "stdin-tty" in r["out"] and "to-file" not in r["out"], r


def test_stdin_from_a_pipe_stays_the_pipe_and_stdout_is_a_pty(world: World) -> None:
    script = "cat; [ -t 0 ] || echo stdin-not-a-tty; [ -t 1 ] && echo stdout-tty"
    r = drive(world, sg(world, "sh", "-c", script), [], "--stdin", "piped-text\n")
    assert r["status"] == 0, r
    assert r["out"].splitlines() == ["piped-text", "stdin-not-a-tty", "stdout-tty"], r


def test_with_stdin_a_pipe_the_keys_still_reach_dev_tty_inside(world: World) -> None:
    """`... | sandgate run -- less`: the data from the pipe, the keys from the terminal (/dev/tty)."""
    script = "cat; read k < /dev/tty; echo key=$k"
    r = drive(world, sg(world, "sh", "-c", script), [["wait", "piped"], ["send", "hello\r"]], "--stdin", "piped\n")
    assert r["status"] == 0 and "key=hello" in r["out"], r


def test_ctrl_c_with_stdin_a_pipe_reaches_the_commands_foreground_job(world: World) -> None:
    """stdin a pipe: the keys (^C too) come from the user's terminal all the same, and the sandbox's
    pty makes ^C a SIGINT of the foreground process group inside; a shell that traps it goes on."""
    script = 'trap "echo trapped" INT; sh -c "echo ready; exec sleep 100"; echo after'  # "ready": sleep runs
    t0 = time.monotonic()
    r = drive(world, sg(world, "sh", "-c", script), [["wait", "ready"], ["send", "\x03"]], "--stdin", "")
    assert r["status"] == 0 and r["out"].replace("^C", "").splitlines()[-2:] == ["trapped", "after"], r
    assert time.monotonic() - t0 < 30, r


def test_a_sigint_sent_to_sandgate_reaches_the_commands_foreground_job(world: World) -> None:
    """`kill -INT <sandgate>` while it relays: to the foreground process group inside, as ^C would."""
    script = 'trap "echo trapped" INT; sh -c "echo ready; exec sleep 100"; echo after'
    t0 = time.monotonic()
    r = drive(world, sg(world, "sh", "-c", script), [["wait", "ready"], ["kill", "SIGINT"]])
    assert r["status"] == 0 and r["out"].splitlines()[-2:] == ["trapped", "after"], r
    assert time.monotonic() - t0 < 30, r


def test_terminal_injection_stays_refused_and_never_reaches_the_users_terminal(world: World) -> None:
    inside = drive(world, sg(world, "python3", "-c", INJECT), [])
    assert "tiocsti-fd0=Operation not permitted" in inside["out"], inside
    assert "tiocsti-devtty=Operation not permitted" in inside["out"], inside
    assert "INJECTED" not in inside["out"] and inside["pending"] == 0, inside
    bare = drive(world, ["python3", "-c", INJECT], [])  # the control: this machine allows TIOCSTI
    assert "tiocsti-fd0=ok" in bare["out"] and "INJECTED" in bare["out"], bare


def test_without_a_terminal_nothing_changes(world: World) -> None:
    r = Sandgate(world, cwd=world.tmp, quiet=True).run(audit=world.tmp / "n.jsonl", cmd=["tty"])
    assert r.returncode == 1 and r.stdout.strip() == "not a tty", r


def test_an_ordinary_user_gets_a_terminal_too(world: World, unprivileged: UnprivilegedUser) -> None:
    runner = unprivileged.runner(world)
    work = unprivileged.home / "work"  # not the home itself: sandgate refuses a writable home
    work.mkdir()
    os.chown(work, unprivileged.uid, unprivileged.gid)
    line = Sandgate(runner, cwd=work, quiet=True).argv(cmd=["sh", "-c", "tty; stty size"])
    r = drive(runner, line, [], cwd=work, home=unprivileged.home)
    lines = r["out"].splitlines()
    assert r["status"] == 0 and lines[0].startswith("/dev/pts/") and lines[1] == "24 80", r


def test_a_prompts_answer_goes_to_sandgate_and_the_next_line_to_the_command(world: World) -> None:
    """While sandgate asks on the terminal the relay leaves the keys alone: "o" answers the prompt,
    the line typed after it is the command's."""
    pol = world.tmp / "ask.yaml"
    pol.write_text("version: 1\nnetwork:\n  ask: [ask.test]\n")
    audit = world.tmp / f"ask-{time.monotonic_ns()}.jsonl"
    curl = f"curl -sS -m 20 --cacert {world.ca_pem} -o /dev/null -w 'code=%{{http_code}}\\n' https://ask.test/"
    script = f"{curl} & read line; echo read=$line; wait"
    line = Sandgate(world, cwd=world.tmp, quiet=True).argv(policy=pol, audit=audit, cmd=["sh", "-c", script])
    steps = [["wait", "allow ask.test:443"], ["send", "o\r"], ["wait", "code=200"], ["send", "typed\r"]]
    r = drive(world, line, steps)
    assert r["status"] == 0 and "read=typed" in r["out"] and "code=200" in r["out"], r
    assert r["times"][-1] < 25, r  # no step waited for what never came
    answers = [x for x in read_records(audit) if x["event"] == "approval" and x["stage"] == "answer"]
    assert [(x["answer"], x["by"]) for x in answers] == [("once", "terminal")], answers

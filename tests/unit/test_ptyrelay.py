"""The launcher's pty relay (launcher/run/ptyrelay.py) and the inside half's pty (fsguard/sandboxpty.py),
on ptys made here: no sandbox. The "user's terminal" is one pty, the "sandbox's" another, whose
master travels over a socketpair as init sends it."""

from __future__ import annotations

import os
import select
import socket
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from fsguard import sandboxpty
from launcher.run import ptyrelay

SAME, OTHER = 34816, 34817  # two terminals' st_rdev


def ids(mapping: dict[int, int | None]) -> Callable[[int], int | None]:
    return lambda fd: mapping[fd]


@pytest.mark.parametrize(
    ("kinds", "expect"),
    [
        ({0: SAME, 1: SAME, 2: SAME}, ((0, 1, 2), 0, 1)),
        ({0: SAME, 1: None, 2: SAME}, ((0, 2), 0, 2)),  # `run -- cmd > file`: stdout stays the file
        ({0: None, 1: SAME, 2: SAME}, ((1, 2), None, 1)),  # `... | run -- cmd`: stdin stays the pipe
        ({0: SAME, 1: None, 2: None}, ((0,), 0, 0)),  # only the echo has somewhere to go
        ({0: SAME, 1: SAME, 2: OTHER}, ((0, 1), 0, 1)),  # another terminal is not the user's: left alone
        ({0: None, 1: None, 2: SAME}, None),  # only stderr: no pty, as before
        ({0: None, 1: None, 2: None}, None),
    ],
)
def test_which_fds_are_the_users_terminal(kinds: dict[int, int | None], expect: object) -> None:
    assert ptyrelay.terminal_fds(ids(kinds)) == expect


def test_raw_is_cfmakeraw_and_leaves_its_input_alone() -> None:
    m, s = os.openpty()
    try:
        cooked = termios.tcgetattr(s)
    finally:
        os.close(m)
        os.close(s)
    before = [x[:] if isinstance(x, list) else x for x in cooked]
    got = ptyrelay.raw(cooked)
    assert cooked == before  # pure
    assert not got[3] & (termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
    assert not got[0] & (termios.ICRNL | termios.IXON) and not got[1] & termios.OPOST
    assert got[2] & termios.CSIZE == termios.CS8 and got[6][termios.VMIN] == 1 and got[6][termios.VTIME] == 0
    assert cooked[3] & termios.ICANON  # the control: the input was cooked


@dataclass
class Rig:
    user_m: int  # what the person types into / reads from
    user_s: int  # sandgate's side of the user's terminal
    box_m: int  # the sandbox pty's master (sent to the relay)
    box_s: int  # what the command inside has
    relay: ptyrelay.Relay
    init_end: socket.socket
    prompting: list[bool]

    def spin(self, until: Callable[[], bool], seconds: float = 5) -> None:
        end = time.monotonic() + seconds
        while not until() and time.monotonic() < end:
            r, w, _ = select.select(self.relay.readers(), self.relay.writers(), [], 0.05)
            self.relay.pump(r, w)

    def send_master(self) -> None:
        socket.send_fds(self.init_end, [b"P"], [self.box_m])
        self.spin(lambda: self.relay.master is not None)


def read_some(fd: int, want: bytes, seconds: float = 5) -> bytes:
    got, end = b"", time.monotonic() + seconds
    while want not in got and time.monotonic() < end:
        if select.select([fd], [], [], 0.05)[0]:
            got += os.read(fd, 4096)
    return got


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.setattr(ptyrelay, "_foreground", lambda fd: True)  # as sandgate run in the foreground
    user_m, user_s = os.openpty()
    box_m, box_s = os.openpty()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    prompting = [False]
    outer = ptyrelay.Outer((user_s,), user_s, user_s, termios.tcgetattr(user_s))
    relay = ptyrelay.Relay(outer, mine, lambda: prompting[0])
    rig = Rig(user_m, user_s, box_m, box_s, relay, theirs, prompting)
    try:
        yield rig
    finally:
        relay.close()
        theirs.close()
        for fd in (user_m, user_s, box_s):
            os.close(fd)
        try:
            os.close(box_m)  # ours: the relay closed its own copy
        except OSError:
            pass


def test_keys_and_output_cross_and_the_users_modes_come_back(rig: Rig) -> None:
    cooked = termios.tcgetattr(rig.user_s)
    rig.send_master()
    assert not termios.tcgetattr(rig.user_s)[3] & termios.ICANON  # raw while relaying
    termios.tcsetattr(rig.box_s, termios.TCSANOW, ptyrelay.raw(termios.tcgetattr(rig.box_s)))  # to see every byte
    os.write(rig.user_m, b"ls\x03")  # ^C is a byte here: the sandbox pty's line discipline makes it SIGINT
    rig.spin(lambda: False, 0.3)
    assert read_some(rig.box_s, b"ls\x03") == b"ls\x03"
    os.write(rig.box_s, b"hello\n")
    rig.spin(lambda: False, 0.3)
    assert b"hello" in read_some(rig.user_m, b"hello")
    rig.relay.close()
    assert termios.tcgetattr(rig.user_s) == cooked


def test_while_a_prompt_holds_the_terminal_its_keys_are_not_relayed(rig: Rig) -> None:
    rig.send_master()
    rig.prompting[0] = True
    os.write(rig.user_m, b"o\r")
    rig.spin(lambda: False, 0.3)
    assert rig.relay.to_master == b"" and ptyrelay._waiting(rig.user_s) == 2  # left for the prompt to read
    assert os.read(rig.user_s, 2) == b"o\r"  # the prompt's read
    rig.prompting[0] = False
    os.write(rig.user_m, b"x")
    rig.spin(lambda: False, 0.3)
    termios.tcsetattr(rig.box_s, termios.TCSANOW, ptyrelay.raw(termios.tcgetattr(rig.box_s)))
    assert read_some(rig.box_s, b"x") == b"x"


def test_bytes_another_reader_took_do_not_stall_the_relay(rig: Rig) -> None:
    """Woken for input that the prompt's thread then read: the relay must not block on an empty terminal."""
    rig.send_master()
    os.write(rig.user_m, b"k")
    select.select([rig.user_s], [], [], 5)
    os.read(rig.user_s, 1)  # the other reader wins the race
    t0 = time.monotonic()
    rig.relay.pump([rig.user_s], [])
    assert time.monotonic() - t0 < 1 and rig.relay.input_open


def test_the_last_output_is_drained_at_close(rig: Rig) -> None:
    rig.send_master()
    os.write(rig.box_s, b"last words\n")
    rig.relay.close()
    assert b"last words" in read_some(rig.user_m, b"last words")


def test_a_resize_reaches_the_sandbox_pty(rig: Rig) -> None:
    rig.send_master()
    sandboxpty.set_size(rig.user_s, 40, 100)
    rig.relay.resize()
    assert ptyrelay.window(rig.box_s) == (40, 100)


def test_init_failing_before_the_master_leaves_nothing_to_relay(rig: Rig) -> None:
    rig.init_end.close()
    rig.spin(lambda: rig.relay.readers() == [])
    assert rig.relay.master is None and rig.relay.readers() == []
    rig.relay.close()
    assert termios.tcgetattr(rig.user_s)[3] & termios.ICANON  # never raw


def test_the_inside_pty_starts_in_the_users_modes_and_size() -> None:
    master, slave = sandboxpty.open_pair()
    try:
        assert os.isatty(slave) and os.ttyname(slave).startswith("/dev/pts/")
        sandboxpty.set_size(slave, 33, 99)
        assert ptyrelay.window(master) == (33, 99)
    finally:
        os.close(master)
        os.close(slave)


def test_in_the_background_it_neither_goes_raw_nor_reads_and_takes_over_after_fg(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = [False]
    monkeypatch.setattr(ptyrelay, "_foreground", lambda fd: ours[0])
    rig.send_master()
    os.write(rig.user_m, b"k")
    rig.spin(lambda: False, 0.3)
    assert termios.tcgetattr(rig.user_s)[3] & termios.ICANON and rig.relay.to_master == b""
    assert rig.user_s not in rig.relay.readers() and rig.relay.timeout() == ptyrelay.BACKGROUND_POLL
    ours[0] = True  # `fg`: the shell gives sandgate the terminal, with no signal for a running job
    rig.spin(lambda: rig.relay.raw)
    assert not termios.tcgetattr(rig.user_s)[3] & termios.ICANON and rig.relay.timeout() is None

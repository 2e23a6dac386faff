"""netguard/daemon/__main__.py's own option parser (no argparse before a cold daemon is ready, issue 25)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from netguard.daemon.__main__ import parse_args


def test_the_forms_its_starters_use_and_the_equals_form() -> None:
    a = parse_args(["--socket", "/run/x.sock", "--ready-fd", "3"])
    assert (a.socket, a.ready_fd, a.idle_exit, a.verbose) == ("/run/x.sock", 3, 300.0, False)
    b = parse_args(["--idle-exit=0", "--verbose", "--socket=/s"])
    assert (b.socket, b.ready_fd, b.idle_exit, b.verbose) == ("/s", None, 0.0, True)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        ([], "required: --socket"),
        (["--socket"], "--socket needs a value"),
        (["--socket="], "--socket needs a value"),
        (["--socket", "/s", "--ready-fd", "three"], "a number is needed"),
        (["--socket", "/s", "--idle-exit", "soon"], "a number is needed"),
        (["--socket", "/s", "extra"], "unrecognized argument: extra"),
        (["--socket", "/s", "--verbose=yes"], "unrecognized argument: --verbose=yes"),
    ],
)
def test_a_mistake_is_the_usage_and_one_line_exit_2(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: python -m netguard.daemon") and why in err


def test_help_and_no_argparse_before_ready() -> None:
    code = "import sys, runpy; sys.argv=['x','--help']\ntry: runpy.run_module('netguard.daemon', run_name='__main__')\nexcept SystemExit: pass\nprint('argparse' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--idle-exit SECONDS" in out and out.strip().endswith("False")

"""argparse stops at launcher/cli.py (issue 29): each command's body gets typed frozen records made in
one call (cliargs.typed), whose every field names an option its command really has."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from launcher import cli, cliargs
from launcher.exportcmd import ExportArgs
from launcher.run.options import RunArgs
from launcher.run.policyargs import PolicyArgs
from launcher.run.proxy import ProxyArgs

#: Fields the CLI sets itself (`given`), or that only some platforms' or commands' parsers add.
_GIVEN = {"policy", "cmd"}
_ELSEWHERE: dict[type[Any], set[str]] = {
    RunArgs: {"transparent", "json"}
}  # run --transparent: Windows only; --json: explain's


def _dests(command: str) -> set[str]:
    parser = cli.build_parser(command)
    sub = next(a for a in parser._actions if a.dest == "command")
    own = sub.choices[command]  # type: ignore[index]
    return {a.dest for a in own._actions} | set(own._defaults) | {"command"}  # set_defaults: explain's dry_run


@pytest.mark.parametrize(
    ("record", "command"),
    [(RunArgs, "run"), (RunArgs, "explain"), (PolicyArgs, "proxy"), (ProxyArgs, "proxy"), (ExportArgs, "export")],
)
def test_every_field_of_a_record_is_an_option_of_its_command(record: type[Any], command: str) -> None:
    """A misspelt field would silently keep its default (typed() skips what the namespace lacks)."""
    fields = {f.name for f in dataclasses.fields(record)}
    missing = fields - _dests(command) - _GIVEN - _ELSEWHERE.get(record, set())
    if record is PolicyArgs:  # run's --user/--write/--quiet reach the policy checks; proxy has none of them
        missing -= {"user", "write"}
    assert not missing, f"{record.__name__} fields that `sandgate {command}` has no option for: {sorted(missing)}"


def test_the_run_record_is_typed_frozen_and_has_no_namespace_in_it() -> None:
    ns = cli.build_parser("run").parse_args(
        ["run", "--allow", "a.test", "--write", "/w", "--write", "/v", "-q", "--ask-timeout", "5", "--", "echo", "hi"]
    )
    args = cliargs.run_args(ns)
    assert args.cmd == ("echo", "hi") and args.write == ("/w", "/v") and args.quiet and args.ask_timeout == 5.0
    assert args.policy == PolicyArgs("run", allow=("a.test",), write=("/w", "/v"), quiet=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.quiet = False  # type: ignore[misc]
    assert cliargs.run_args(cli.build_parser("run").parse_args(["run", "true"])).cmd == ("true",)  # no `--`
    assert cliargs.run_args(cli.build_parser("run").parse_args(["run"])).cmd == ()  # launch refuses it in one line

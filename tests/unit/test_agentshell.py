"""`sandgate-shell` (launcher/agentshell.py) and the agents' bundled lists (allowlists/anthropic.yaml, openai.yaml).

The end-to-end proof (commands really run inside, keys really brokered) is tests/e2e/test_agent_recipes_e2e.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from launcher import agentshell
from launcher.agentshell import UsageError, plan, sandgate_argv, shell_args
from launcher.config.load import build_policy

SG = ["/opt/sg/bin/sandgate"]


def test_every_way_an_agent_passes_a_command_reaches_the_inner_shell_unchanged() -> None:
    assert shell_args([]) == []  # interactive
    assert shell_args(["-c", "ls -l 'a b'"]) == ["-c", "ls -l 'a b'"]  # $SHELL -c CMD (Aider)
    assert shell_args(["-lc", "make", "name", "x"]) == ["-lc", "make", "name", "x"]
    assert shell_args(["cd src && make 'a b'"]) == ["-c", "cd src && make 'a b'"]  # CLAUDE_CODE_SHELL_PREFIX: $1


def test_the_plan_is_sandgate_run_with_the_users_options_and_a_real_shell_inside() -> None:
    environ = {"SANDGATE_SHELL_OPTS": "--allow pypi --policy '/home/u/my policy.yaml'", "SHELL": "/x/sandgate-shell"}
    p = plan(["-c", "pip install x"], environ, SG)
    assert p.argv == [
        *SG,
        "run",
        "--allow",
        "pypi",
        "--policy",
        "/home/u/my policy.yaml",
        "--",
        "/bin/bash",
        "-c",
        "pip install x",
    ]
    # A tool inside that starts $SHELL gets the inner shell, not sandgate again.
    assert p.env["SHELL"] == "/bin/bash" and p.env["SANDGATE_SHELL_OPTS"] == environ["SANDGATE_SHELL_OPTS"]
    p = plan([], {"SANDGATE_SHELL_INNER": "/bin/zsh"}, SG)
    assert p.argv == [*SG, "run", "--", "/bin/zsh"] and p.env["SHELL"] == "/bin/zsh"


@pytest.mark.parametrize(
    "environ,fragment",
    [
        ({"SANDGATE_SHELL_OPTS": "--allow 'pypi"}, "is not a valid option list"),
        ({"SANDGATE_SHELL_OPTS": "--allow pypi -- rm -rf ~"}, "holds sandgate options only"),
        ({"SANDGATE_SHELL_INNER": "bash"}, "must be an absolute path"),
    ],
)
def test_configuration_mistakes_are_one_line_errors(environ: dict[str, str], fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        plan(["-c", "true"], environ, SG)


def test_main_says_what_is_wrong_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGATE_SHELL_OPTS", "'")
    assert agentshell.main(["-c", "true"]) == 125
    err = capsys.readouterr().err
    assert err.startswith("sandgate: error: $SANDGATE_SHELL_OPTS") and len(err.splitlines()) == 1


def test_sandgate_is_started_without_the_workspace_on_sys_path(tmp_path: Path) -> None:
    """The agent's directory is an untrusted checkout: `python -m launcher.cli` there would import its
    `launcher/` first. Beside a console script it is the script; else `python -P`."""
    bare = tmp_path / "bin" / "python3"
    bare.parent.mkdir()
    assert sandgate_argv(str(bare)) == [str(bare), "-P", "-m", "launcher.cli"]
    (tmp_path / "bin" / "sandgate").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "bin" / "sandgate", 0o755)
    assert sandgate_argv(str(bare)) == [str(tmp_path / "bin" / "sandgate")]
    assert sandgate_argv(sys.executable)[0].startswith(os.path.dirname(sys.executable))


@pytest.mark.parametrize(
    "name,host,header,template,stored",
    [
        ("anthropic", "api.anthropic.com", "x-api-key", "${ANTHROPIC_API_KEY}", "~/.claude/.credentials.json"),
        ("openai", "api.openai.com", "Authorization", "Bearer ${OPENAI_API_KEY}", "~/.codex/auth.json"),
    ],
)
def test_the_agent_lists_allow_only_the_api_host_and_broker_its_key(
    name: str, host: str, header: str, template: str, stored: str
) -> None:
    pol = build_policy([], [name], [])
    # The CLI's own stored login is hidden: a real key there would be readable by every tool inside.
    assert pol.filesystem.read_deny == (stored,)
    net = pol.network
    assert [str(r.value) for r in net.allow] == [host]  # no telemetry, login or update host
    ((cred,),) = [net.credentials]
    assert (cred.host, cred.header, cred.template, cred.file) == (host, header, template, None)

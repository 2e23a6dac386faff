"""What `sandgate run -- true` imports (issue 25: a warm start is mostly imports): never yaml without a
policy file, never mitmproxy or cryptography, never another command's modules nor the real `inspect`; and the phase stamps
(launcher/timings.py) are written only when asked. Not timed: the modules themselves are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launcher import timings

REPO = Path(__file__).resolve().parents[2]

# The run path up to the sandbox: parse, policy, options, the backend's module (no namespaces made).
RUN_PATH = """
import json, sys
from launcher import cli
args = cli.build_parser("run").parse_args(["run", "-q", "--audit-log", sys.argv[1], "--", "true"])
from launcher.run import launch, options
options.build(cli.run_args(args))
print(json.dumps(sorted(sys.modules)))
"""

NEVER = (
    "yaml",
    "mitmproxy",
    "cryptography",
    "hashlib",
    "ast",  # with dis and tokenize: what the real `inspect` imports (sgbase/dataclasscache.py's stand-in)
    "dis",
    "uuid",
    "launcher.audit.command",
    "launcher.audit.summary",
    "selftest",
    "launcher.approvals",
    "launcher.run.inspection",
    "launcher.run.brokered",
    "launcher.run.proxy",
    "launcher.run.housekeeping",
    "launcher.run.windows",
    "launcher.run.windowsbackend",
    "sgbase.windows",
    "netguard.windows",
    "fsguard.windows",
    "netguard.daemon.serve",
)


def test_run_without_a_policy_file_imports_nothing_it_does_not_need(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", RUN_PATH, str(tmp_path / "audit.jsonl")],
        cwd=tmp_path,  # no ./.sandgate.yaml here
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    modules = set(json.loads(out.stdout))
    assert "launcher.run.linuxbackend" in modules and "netguard.policy" in modules  # the control: the path ran
    assert not {m for m in modules for n in NEVER if m == n or m.startswith(n + ".")}


def test_only_the_named_command_gets_a_parser_and_the_rest_still_parse() -> None:
    from launcher import cli

    run_only = cli.build_parser("run")
    assert run_only.parse_args(["run", "--", "true"]).cmd == ["--", "true"]
    everything = cli.build_parser(None)
    assert "verify" in everything.format_usage() and "verify" not in run_only.format_usage()
    assert cli.build_parser("daemon").parse_args(["daemon", "status"]).daemon_command == "status"


def test_stamps_are_written_only_when_asked() -> None:
    code = "from launcher import timings; timings.mark('x')"
    for value, expect in (("1", 1), ("", 0), ("0", 0)):
        env = {**os.environ, "SANDGATE_TIMINGS": value, "PYTHONPATH": str(REPO)}
        err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stderr
        stamps = timings.parse(err)
        assert len([p for p, _ in stamps if p == "x"]) == expect
        assert all(p in ("interpreter", "x") for p, _ in stamps)

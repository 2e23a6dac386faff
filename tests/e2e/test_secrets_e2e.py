"""Issue 10, end to end: credentials in sandgate's environment and in the home's credential
files do not reach the command; well-known non-secrets do. Real `sandgate run`, in a World.

As in tests/e2e/test_fsguard_e2e.py, the workspace and the fake home live under /var/tmp (the
sandbox's /tmp is its own), and every hidden file is shown readable without sandgate, so no
test passes because the file was unreadable anyway.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fsguard import mounts
from fsguard import policy as fp
from netguard.audit import read_records

from ..support.runner import Sandgate, env
from ..support.world import World, new_world

MARKER = "CRED-MARKER-3c9e"
GHP = "ghp_" + "Q7w8E9r0T1" * 3 + "y2U3i4"  # a classic GitHub token's shape, under an innocent name
SECRETS = {
    "OPENAI_API_KEY": f"sk-{MARKER}-openai-aaaaaaaaaaaaaaaa",
    "ANTHROPIC_API_KEY": f"{MARKER}-anthropic",
    "PGPASSWORD": f"{MARKER}-pg",
    "MYSQL_PWD": f"{MARKER}-mysql",
    "DATABASE_URL": f"postgres://u:pw{MARKER}@h/db",
    "openai_api_key": f"{MARKER}-lower",
    "BUILD_LABEL": GHP,
}
#: Credential files (relative to the home) with the marker in them; each must be hidden by default.
CRED_FILES = (".npmrc", ".pypirc", ".git-credentials", ".cargo/credentials.toml", ".config/gcloud/credentials.db")


@dataclass
class Home:
    world: World
    base: Path
    ws: Path
    home: Path

    def run(
        self, cmd: list[str], *, policy: str = "version: 1\n", flag: str = "-q", envx: dict[str, str] | None = None
    ) -> tuple[subprocess.CompletedProcess[str], Path]:
        stamp = time.monotonic_ns()
        pol = self.base / f"policy-{stamp}.yaml"
        pol.write_text(policy)
        audit = self.base / f"audit-{stamp}.jsonl"
        sg = Sandgate(self.world, policy=pol, audit=audit, cwd=self.ws, timeout=60)
        r = sg.run(
            *([] if flag == "-q" else [flag]),
            quiet=flag == "-q",
            cmd=cmd,
            env={**env(), "HOME": str(self.home), **(envx or {})},
        )
        return r, audit

    def bare(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        """The same command without sandgate: the control that shows the file is there and readable."""
        return self.world.run(cmd, cwd=self.ws, env={**env(), "HOME": str(self.home)})


@pytest.fixture(scope="module")
def h() -> Iterator[Home]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-secrets-", dir="/var/tmp"))
    try:
        with new_world() as w:
            ws, home = base / "ws", base / "home"
            ws.mkdir(parents=True)
            for rel in CRED_FILES:
                (home / rel).parent.mkdir(parents=True, exist_ok=True)
                (home / rel).write_text(f"{MARKER} {rel}\n")
            (home / ".config" / "other.conf").write_text("plain-config\n")
            yield Home(w, base, ws, home)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))  # the fake home's sandbox layer too
        shutil.rmtree(base, ignore_errors=True)


def environ(r: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def policy_record(audit: Path) -> Any:
    return next(rec for rec in read_records(audit) if rec["event"] == "policy")


def test_the_default_read_deny_names_the_issues_credential_files() -> None:
    # A plain unit check first: a failure here explains the e2e failure below.
    for rel in (
        ".npmrc",
        ".pypirc",
        ".git-credentials",
        ".cargo/credentials.toml",
        ".cargo/credentials",
        ".config/gcloud",
        ".netrc",
        ".docker/config.json",
        ".kube",
        ".config/gh",
        ".gem/credentials",
        ".azure",
        ".pgpass",
        ".my.cnf",
        ".vault-token",
        ".config/git/credentials",
    ):
        assert f"~/{rel}" in fp.DEFAULT_READ_DENY, rel
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="sandgate-test-") as home:
        for rel in CRED_FILES:
            (Path(home) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(home) / rel).write_text("x")
        plan = mounts.plan(fp.effective(fp.FsPolicy(), cwd=home, home=home))
        assert {f"{home}/{r}" for r in CRED_FILES[:4]} <= set(plan.hide_files)
        assert f"{home}/.config/gcloud" in plan.hide_dirs


def test_environment_credentials_never_reach_the_command(h: Home) -> None:
    keep = {
        "AWS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
        "SSL_CERT_FILE": "/etc/ssl/certs/ca.pem",
        "PWD": str(h.ws),
        "SANDGATE_TEST_PLAIN": "1",
    }
    r, audit = h.run(["env"], flag="-v", envx={**SECRETS, **keep})
    got = environ(r)
    assert not set(SECRETS) & set(got), sorted(got)
    assert {k: got.get(k) for k in keep} == keep
    assert MARKER not in r.stdout and GHP not in r.stdout
    rec = policy_record(audit)
    assert set(SECRETS) <= set(rec["env_dropped"])
    assert not set(keep) & set(rec["env_dropped"])
    dropped_line = next(x for x in r.stderr.splitlines() if x.startswith("sandgate: environment dropped: "))
    assert set(SECRETS) <= set(dropped_line.split(": ", 2)[2].split(", "))
    # names only, never values: not in the audit log, not on the terminal
    assert MARKER not in audit.read_text() + r.stderr and GHP not in audit.read_text() + r.stderr


def test_env_keep_lets_a_named_variable_through_in_any_case(h: Home) -> None:
    r, audit = h.run(["env"], policy="version: 1\nenv:\n  keep: [OPENAI_API_KEY]\n", envx=SECRETS)
    got = environ(r)
    assert got["OPENAI_API_KEY"] == SECRETS["OPENAI_API_KEY"]
    assert got["openai_api_key"] == SECRETS["openai_api_key"]  # names match case-insensitively
    assert not {"ANTHROPIC_API_KEY", "PGPASSWORD", "MYSQL_PWD", "DATABASE_URL", "BUILD_LABEL"} & set(got)
    assert "OPENAI_API_KEY" not in policy_record(audit)["env_dropped"]


@pytest.mark.parametrize("rel", CRED_FILES)
def test_credential_files_in_home_are_hidden(h: Home, rel: str) -> None:
    path = str(h.home / rel)
    inside, audit = h.run(["sh", "-c", f"cat {path}; echo rc=$?; cat ~/.config/other.conf"])
    assert MARKER not in inside.stdout + inside.stderr, inside
    assert inside.stdout.splitlines()[-1] == "plain-config", inside  # the rest of the home stays readable
    hidden = policy_record(audit)["hidden"]
    assert any(path == x or path.startswith(f"{x}/") for x in hidden), hidden
    outside = h.bare(["cat", path])
    assert outside.returncode == 0 and MARKER in outside.stdout  # the file is really there and readable

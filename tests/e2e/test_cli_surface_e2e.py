"""Issue 26 items 3-4 end to end: the user's defaults file, `run --dry-run`, a mistyped list name.

The real `sandgate run` inside a test World. The user config (XDG_CONFIG_HOME, under the world's
tmp) allows three fake hosts; the command line denies one and the checkout's untrusted
`.sandgate.yaml` another: each denial is judged by what the fake server saw, next to the request
the user config alone allows, which the server did see.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netguard.audit import read_records

from ..support.runner import SANDGATE, Sandgate, env
from ..support.world import Server, World, new_world

HOSTS = {"fake": "198.51.100.71", "cli": "198.51.100.72", "ws": "198.51.100.73"}
USER_CONFIG = "version: 1\nnetwork:\n  allow:\n    - fake.test\n    - cli.test\n    - ws.test\n"


@dataclass
class Env:
    world: World
    servers: dict[str, Server]
    config: Path  # XDG_CONFIG_HOME

    def project(self, workspace_policy: str | None = None) -> Path:
        proj = self.world.tmp / f"proj-{time.monotonic_ns()}"
        proj.mkdir()
        if workspace_policy is not None:
            (proj / ".sandgate.yaml").write_text(workspace_policy)
        return proj

    def sandgate(self, proj: Path, *args: str) -> tuple[int, str, str, Path]:
        audit = self.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"
        sg = Sandgate(self.world, audit=audit, quiet=True, cwd=proj, timeout=60)
        e = {**env(), "HOME": str(self.world.tmp / "home"), "XDG_CONFIG_HOME": str(self.config)}
        r = sg.run(*args, env=e)
        return r.returncode, r.stdout, r.stderr, audit

    def daemon(self, command: str) -> int:
        """`sandgate daemon COMMAND` as the runs here start it (same user, same runtime directory)."""
        e = {**env(), "HOME": str(self.world.tmp / "home")}
        return self.world.run([*SANDGATE, "daemon", command], cwd=self.world.tmp, env=e).returncode

    def seen(self) -> dict[str, int]:
        return {k: len(s.log_records()) for k, s in self.servers.items()}


@pytest.fixture(scope="module")
def cs() -> Iterator[Env]:
    with new_world() as w:
        servers = {}
        for name, ip in HOSTS.items():
            w.add_host(f"{name}.test", ip)
            servers[name] = w.serve("http", ip, 80, f"{name}.test")
        (w.tmp / "home").mkdir()
        cfg = w.tmp / "config"
        (cfg / "sandgate").mkdir(parents=True, mode=0o700)
        (cfg / "sandgate" / "config.yaml").write_text(USER_CONFIG)
        (cfg / "sandgate" / "config.yaml").chmod(0o600)
        yield Env(w, servers, cfg)  # the world removes its tmp (and the config in it) on exit


def curl(host: str) -> str:
    return f"curl -sS -m 8 -o /dev/null -w '{host}=%{{http_code}}\\n' http://{host}/"


def test_a_user_config_allow_works_and_command_line_and_workspace_denies_beat_it(cs: Env) -> None:
    proj = cs.project("version: 1\nnetwork:\n  deny: [ws.test]\n")  # untrusted: its deny applies all the same
    before = cs.seen()
    probes = " ; ".join(curl(h) for h in ("fake.test", "cli.test", "ws.test"))
    code, out, err, audit = cs.sandgate(proj, "--deny", "cli.test", "--", "sh", "-c", probes)
    assert code == 0, err
    after = cs.seen()
    assert "fake.test=200" in out and after["fake"] > before["fake"]  # the user's default allow works
    assert "cli.test=403" in out and after["cli"] == before["cli"]  # the command line's deny beats it
    assert "ws.test=403" in out and after["ws"] == before["ws"]  # so does the workspace file's
    rules = {r["host"]: r["rule"] for r in read_records(audit) if r["event"] == "decision" and r["kind"] != "dns"}
    assert rules["fake.test"] == f"{cs.config}/sandgate/config.yaml:4"
    assert rules["cli.test"] == "command line" and rules["ws.test"] == ".sandgate.yaml:3", rules


def test_a_user_config_others_may_write_is_refused(cs: Env) -> None:
    f = cs.config / "sandgate" / "config.yaml"
    proj = cs.project()
    before = cs.seen()
    try:
        f.chmod(0o666)
        code, out, err, _ = cs.sandgate(proj, "--", "sh", "-c", curl("fake.test"))
    finally:
        f.chmod(0o600)
    assert code == 125 and out == "" and cs.seen() == before
    assert err.splitlines() == [
        f"sandgate: error: user config {f} is writable by group or others, who could loosen your policy; chmod go-w it"
    ]
    code, out, err, _ = cs.sandgate(proj, "--", "sh", "-c", curl("fake.test"))  # the control: as it was, it works
    assert (code, out.strip()) == (0, "fake.test=200"), err


def test_dry_run_prints_the_boundary_and_runs_nothing(cs: Env) -> None:
    proj = cs.project()
    cmd = ["--", "sh", "-c", f"touch made; {curl('fake.test')}"]
    before = cs.seen()
    assert cs.daemon("stop") == 0
    code, out, err, audit = cs.sandgate(proj, "--dry-run", "--allow", "pypi", *cmd)
    assert code == 0, err
    assert not (proj / "made").exists() and cs.seen() == before and not audit.exists()
    assert cs.daemon("status") == 3  # no daemon was started for it either
    assert "sandgate run would start: sh -c touch made;" in out
    for line in ("pypi.org  (ports 80,443)  allowlists/pypi.yaml:", "fake.test  (ports 80,443)  "):
        assert line in out, out
    assert f"writable: {proj}, /tmp (private)" in out and "nothing was started (dry run)" in out
    code, out, err, _ = cs.sandgate(proj, *cmd)  # the control: the same command, run, does both
    assert code == 0 and (proj / "made").exists() and out.strip() == "fake.test=200", err
    assert cs.seen()["fake"] > before["fake"] and cs.daemon("status") == 0  # a real run did start one


def test_a_mistyped_list_name_gets_a_guess_and_nothing_runs(cs: Env) -> None:
    proj = cs.project()
    code, out, err, _ = cs.sandgate(proj, "--allow", "pipy", "--", "touch", "made")
    assert code == 125 and out == "" and not (proj / "made").exists()
    assert err.splitlines() == [
        "sandgate: error: no bundled list 'pipy'; did you mean 'pypi'? ('sandgate allowlists' lists them)"
    ]
    code, _, err, _ = cs.sandgate(proj, "--allow", "pypi", "--", "touch", "made")  # the control
    assert code == 0 and (proj / "made").exists(), err


def test_run_verbose_names_the_network_before_the_run(cs: Env) -> None:
    proj = cs.project()
    code, out, err, _ = cs.sandgate(proj, "-v", "--allow", "npm-readonly", "--", "true")
    assert code == 0 and out == "", err
    assert "sandgate: allowed (" in err and "registry.npmjs.org  (ports 80,443; TLS inspected)" in err
    assert "sandgate:   registry.npmjs.org: read-only" in err and f"sandgate: writable: {proj}" in err

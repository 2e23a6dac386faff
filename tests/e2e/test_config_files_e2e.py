"""A run cannot change what configures it (issue 24, items 1 and 6), end to end.

The review's case: `sandgate run --policy agent.yaml` from the project, the command rewriting
agent.yaml (to inspect another host and bind the credential there) so that the user's next
identical command would send the secret elsewhere. Here the command tries every way to change its
own --policy file, an included file (and an include of that), its --upstream-ca bundle, the
--approvals socket and an audit log named through a symlink: write, append, chmod, unlink, rename
over, rename of the parent directory. Each is judged on the host (byte-identical, still there),
next to the same operations on ordinary files beside them, which must work. A name the command
could redirect (a symlink in the workspace) is refused in one line before the command starts.

Also: after a hostile `include: /etc/shadow`, no file of sandgate's holds a line of it; and a
root-started command sees no other user's store of home layers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netguard.audit import read_records
from netguard.daemon import control

from ..support.rootless import UnprivilegedUser
from ..support.runner import REPO, Sandgate, env
from ..support.world import World, new_world

EVIL = """version: 1
network:
  allow:
    - host: evil.test
      inspect: true
  credentials:
    - host: evil.test
      header: X-Leak
      value: "${SANDGATE_TEST_KEY}"
"""
#: Runs inside: tries each operation, prints {name: "done" | errno name}.
TRY = r"""
import errno, json, os, socket, sys
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
def write(path, mode="w"):
    with open(path, mode) as f:
        f.write(EVIL)
def over(path):
    write(path + ".new")
    os.rename(path + ".new", path)
def plant(path):  # the socket case: a listener of the command's own at the name
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
EVIL = sys.stdin.read()
files, dirs, controls = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
for f in files:
    attempt(f + ":write", lambda: write(f))
    attempt(f + ":append", lambda: write(f, "a"))
    attempt(f + ":chmod", lambda: os.chmod(f, 0o666))
    attempt(f + ":rename-over", lambda: over(f))
    attempt(f + ":unlink", lambda: os.unlink(f))
    if f.endswith(".sock"):
        attempt(f + ":plant", lambda: plant(f))
for d in dirs:
    attempt(d + ":rename-dir", lambda: os.rename(d, d + "-moved"))
for c in controls:
    if c.endswith("/"):
        attempt(c + ":rename-dir", lambda: os.rename(c, c.rstrip("/") + "-moved"))
    else:
        attempt(c + ":write", lambda: write(c))
        attempt(c + ":rename-over", lambda: over(c))
print(json.dumps(out))
"""


@dataclass
class Lab:
    world: World
    base: Path  # under /var/tmp: the sandbox's /tmp is its own, a workspace there would prove nothing

    def workspace(self, uid: int = 0, gid: int = 0) -> Path:
        """A fresh project: agent.yaml -> conf/extra.yaml -> conf/deep/more.yaml, certs/ca.pem, and
        ordinary files beside each."""
        ws = self.base / f"ws-{time.monotonic_ns()}"
        (ws / "conf" / "deep").mkdir(parents=True)
        (ws / "certs").mkdir()
        (ws / "plain").mkdir()
        (ws / "agent.yaml").write_text("version: 1\ninclude: [./conf/extra.yaml]\nnetwork:\n  allow: [api.test]\n")
        (ws / "conf" / "extra.yaml").write_text("version: 1\ninclude: [./deep/more.yaml]\n")
        (ws / "conf" / "deep" / "more.yaml").write_text("version: 1\nnetwork:\n  allow: [more.test]\n")
        shutil.copy(self.world.ca_pem, ws / "certs" / "ca.pem")
        for n in ("notes.txt", "conf/notes.txt", "certs/notes.txt"):
            (ws / n).write_text("ordinary\n")
        for p in (ws, *ws.rglob("*")):
            os.lchown(p, uid, gid)
        return ws

    def home(self) -> Path:
        h = self.base / f"home-{time.monotonic_ns()}"
        h.mkdir()
        return h


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-cfg-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        with new_world() as w:
            yield Lab(w, base)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))
        shutil.rmtree(base, ignore_errors=True)


CONFIG = ["agent.yaml", "conf/extra.yaml", "conf/deep/more.yaml", "certs/ca.pem"]
CONTROLS = ["notes.txt", "conf/notes.txt", "certs/notes.txt", "plain/"]


def _try(sg: Sandgate, ws: Path, home: Path, files: list[str], dirs: list[str], *args: str) -> dict[str, str]:
    cmd = [sys.executable, "-c", TRY, json.dumps(files), json.dumps(dirs), json.dumps(CONTROLS)]
    r = sg.run(*args, cmd=cmd, cwd=ws, env={**env(), "HOME": str(home)}, input=EVIL)
    assert r.returncode == 0, r.stdout + r.stderr
    out: dict[str, str] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def _snapshot(ws: Path, names: list[str]) -> dict[str, bytes]:
    return {n: (ws / n).read_bytes() for n in names}


#: Why each operation on a configuring file must fail: the read-only bind (EROFS), a mount point
#: that cannot be unlinked, replaced or renamed (EBUSY), a name that is taken (a socket planted).
WHY = {"write": "EROFS", "append": "EROFS", "chmod": "EROFS", "rename-over": "EBUSY", "unlink": "EBUSY"}
WHY |= {"rename-dir": "EBUSY", "plant": "EADDRINUSE"}


def _judge(out: dict[str, str], ws: Path, before: dict[str, bytes]) -> None:
    """Every operation on a configuring file failed for the boundary's reason, the host shows them
    as they were, and the same operations on the ordinary files beside them worked."""
    config = {k: v for k, v in out.items() if not k.startswith(tuple(CONTROLS))}
    wrong = {k: v for k, v in config.items() if v != WHY[k.rsplit(":", 1)[1]]}
    assert not wrong, wrong
    assert _snapshot(ws, list(before)) == before
    assert not [p for p in ws.rglob("*-moved") if p.name != "plain-moved"]
    assert all(out[k] == "done" for k in out if k.startswith(tuple(CONTROLS))), out  # the controls
    assert (ws / "notes.txt").read_text() == EVIL and (ws / "conf" / "notes.txt").read_text() == EVIL
    assert (ws / "plain-moved").is_dir()


def test_a_run_cannot_change_its_policy_its_includes_or_its_upstream_ca(lab: Lab) -> None:
    ws, home = lab.workspace(), lab.home()
    before = _snapshot(ws, CONFIG)
    audit = lab.base / f"audit-{time.monotonic_ns()}.jsonl"
    sg = Sandgate(lab.world, quiet=True, timeout=90)
    dirs = ["conf", "conf/deep", "certs"]
    out = _try(
        sg, ws, home, CONFIG, dirs, "--policy", "agent.yaml", "--upstream-ca", "certs/ca.pem", "--audit-log", str(audit)
    )
    _judge(out, ws, before)
    rec = next(r for r in read_records(audit) if r["event"] == "policy")
    assert {str(ws / n) for n in CONFIG} <= set(rec["protect"]), rec["protect"]


def test_a_name_through_a_symlink_in_the_workspace_is_refused_before_the_command_starts(lab: Lab) -> None:
    ws, home = lab.workspace(), lab.home()
    (ws / "link.yaml").symlink_to("agent.yaml")
    (ws / "via").symlink_to("conf")
    (ws / "indirect.yaml").write_text("version: 1\ninclude: [./via/extra.yaml]\n")
    sg = Sandgate(lab.world, quiet=True, timeout=60)
    started = ws / "started"
    for args in (
        ["--policy", "link.yaml"],
        ["--policy", "indirect.yaml"],
        ["--policy", "agent.yaml", "--upstream-ca", "via/../certs/ca.pem"],
    ):
        r = sg.run(*args, cmd=["touch", str(started)], cwd=ws, env={**env(), "HOME": str(home)})
        assert r.returncode == 125 and not started.exists(), (args, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("sandgate: error: ") and "name it by its real path" in line, line
    r = sg.run("--policy", "agent.yaml", cmd=["touch", str(started)], cwd=ws, env={**env(), "HOME": str(home)})
    assert r.returncode == 0 and started.exists(), r.stderr  # the control: the real name works


def test_names_through_a_symlink_outside_and_the_audit_log_are_held_too(lab: Lab) -> None:
    """A symlink outside every writable root (the command cannot change it) may lead into the
    workspace: what it reaches is held read-only, the audit log included (it was not, by that name)."""
    ws, home = lab.workspace(), lab.home()
    link = lab.base / f"link-{time.monotonic_ns()}"
    link.symlink_to(ws)
    audit = ws / "audit.jsonl"
    audit.touch()
    before = _snapshot(ws, CONFIG)
    sg = Sandgate(lab.world, quiet=True, timeout=90)
    args = (
        "--policy",
        f"{link}/agent.yaml",
        "--upstream-ca",
        f"{link}/certs/ca.pem",
        "--audit-log",
        f"{link}/audit.jsonl",
    )
    out = _try(sg, ws, home, [*CONFIG, "audit.jsonl"], ["conf"], *args)
    _judge(out, ws, before)
    lines = audit.read_text().splitlines()
    assert lines and all(json.loads(x).get("event") for x in lines) and "evil.test" not in audit.read_text()


def test_the_approvals_socket_and_its_directory_stay_in_place(lab: Lab) -> None:
    """sandgate makes the socket before it plans (the policy may ask): a write that reaches a
    read-only file proves something was held there; its directory cannot be renamed away."""
    ws, home = lab.workspace(), lab.home()
    (ws / "chan").mkdir()
    sock = ws / "chan" / "approvals.sock"
    policy = lab.base / f"ask-{time.monotonic_ns()}.yaml"
    policy.write_text("version: 1\nnetwork:\n  ask: [ask.test]\n")
    sg = Sandgate(lab.world, policy=policy, quiet=True, timeout=90)
    out = _try(sg, ws, home, ["chan/approvals.sock"], ["chan"], "--approvals", f"unix:{sock}")
    _judge(out, ws, {})
    assert (ws / "chan").is_dir() and not os.path.lexists(sock)  # sandgate removed its socket; none planted


def test_a_rootless_run_cannot_change_its_policy_either(lab: Lab, _sandgate_cleanup_stale_users: None) -> None:
    with UnprivilegedUser(base_dir="/var/tmp") as u:
        ws = lab.workspace(u.uid, u.gid)
        before = _snapshot(ws, CONFIG)
        sg = Sandgate(u.runner(lab.world), quiet=True, timeout=90)  # VIEW: it runs this checkout's python
        dirs = ["conf", "certs"]
        try:
            out = _try(sg, ws, u.home, CONFIG, dirs, "--policy", "agent.yaml", "--upstream-ca", "certs/ca.pem")
        finally:
            shutil.rmtree(f"/var/tmp/sandgate-{u.uid}", ignore_errors=True)  # the user's layers (its uid only)
        _judge(out, ws, before)


# ---- item 6: what sandgate keeps, and whose ---------------------------------------------------


def _files_holding(roots: list[Path], needles: list[bytes]) -> list[str]:
    hits = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                p = Path(dirpath) / n
                try:
                    if p.is_symlink() or not p.is_file():
                        continue
                    data = p.read_bytes()
                except OSError:
                    continue
                if any(x in data for x in needles):
                    hits.append(str(p))
    return hits


def test_after_a_hostile_include_no_file_of_sandgates_holds_the_included_file(lab: Lab) -> None:
    # Each entry without its trailing colons: YAML reads `name:...:7:::` as the key `name:...:7::`.
    shadow = [x.rstrip(":").encode() for x in Path("/etc/shadow").read_text().splitlines() if len(x) > 8]
    assert shadow, "the test needs a readable /etc/shadow with entries"
    started = time.time()
    ws, home = lab.workspace(), lab.home()
    state = lab.base / f"state-{time.monotonic_ns()}"
    (ws / "hostile.yaml").write_text("version: 1\ninclude: [/etc/shadow]\n")
    e = {**env(), "HOME": str(home), "XDG_STATE_HOME": str(state)}
    sg = Sandgate(lab.world, quiet=True, timeout=60)
    r = sg.run("--policy", "hostile.yaml", cmd=["true"], cwd=ws, env=e)
    assert r.returncode == 125 and "is not a sandgate policy" in r.stderr, r.stderr
    assert not any(x.decode() in r.stderr for x in shadow)
    marker = f"sgcached-{time.monotonic_ns()}"
    (ws / "ok.yaml").write_text(f"version: 1\ndescription: {marker}\n")
    assert sg.run("--policy", "ok.yaml", cmd=["true"], cwd=ws, env=e).returncode == 0
    rt = control.runtime_base({}, 0)  # root's runtime directory: the daemon, the runs, the parse cache
    assert _files_holding([rt / "policy-cache"], [marker.encode()]), "the control: the cache is where we look"
    logs = [p for p in Path("/var/log/sandgate").glob("*") if p.stat().st_mtime >= started - 1]
    held = _files_holding([rt, home, state, *logs], shadow)
    assert not held, held


def test_no_command_sees_another_users_store_of_layers(lab: Lab) -> None:
    """File modes are not the boundary: another user's store left readable (0755) is still empty
    inside a root-started run, and so is root's own store of every uid's layers."""
    other = Path(f"/var/tmp/sandgate-{3_900_000 + os.getpid() % 10_000}")  # a uid without an account
    sibling = lab.base / "readable"
    try:
        (other / "homes" / "layer").mkdir(parents=True)
        (other / "homes" / "layer" / ".npmrc").write_text("token-of-another-user\n")
        for p in (other, *other.rglob("*")):
            os.lchown(p, int(other.name.split("-")[1]), 0)
            p.chmod(0o755 if p.is_dir() else 0o644)
        sibling.mkdir(exist_ok=True)
        (sibling / "note").write_text("visible\n")
        ws, home = lab.workspace(), lab.home()
        script = (
            f"cat {sibling}/note; ls -A {other} | wc -l; cat {other}/homes/layer/.npmrc 2>/dev/null; "
            "ls -A /var/lib/sandgate 2>/dev/null | wc -l"
        )
        sg = Sandgate(lab.world, quiet=True, timeout=60)
        r = sg.run(cmd=["sh", "-c", script], cwd=ws, env={**env(), "HOME": str(home)})
        assert r.stdout.split() == ["visible", "0", "0"], (r.stdout, r.stderr)  # the control, then empty stores
        assert os.listdir("/var/lib/sandgate") and os.listdir(other), "the host's stores are not empty"
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_hard_link_an_earlier_run_made_to_a_policy_is_refused_before_the_command_starts(lab: Lab) -> None:
    """The read-only bind holds a name, not the inode: `ln agent.yaml cache/a` by a run that did not name the
    policy left the next governed run a way to rewrite it (issue 24 review)."""
    ws, home = lab.workspace(), lab.home()
    sg = Sandgate(lab.world, quiet=True, timeout=60)
    e = {**env(), "HOME": str(home)}
    r = sg.run(cmd=["sh", "-c", "mkdir cache && ln agent.yaml cache/a && ln certs/ca.pem cache/c"], cwd=ws, env=e)
    assert r.returncode == 0 and (ws / "cache" / "a").stat().st_nlink == 2, r.stderr  # an earlier, ungoverned run
    started = ws / "started"
    for args in (["--policy", "agent.yaml"], ["--upstream-ca", "certs/ca.pem"]):
        r = sg.run(*args, cmd=["touch", str(started)], cwd=ws, env=e)
        assert r.returncode == 125 and not started.exists(), (args, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("sandgate: error: ") and "hard links" in line and "remove the others" in line, line
    (ws / "cache" / "a").unlink()
    r = sg.run("--policy", "agent.yaml", cmd=["touch", str(started)], cwd=ws, env=e)
    assert r.returncode == 0 and started.exists(), r.stderr  # the control: one name again, and it runs


def test_sandgates_own_installation_is_read_only_from_a_run_in_its_checkout(lab: Lab) -> None:
    """The README's quick start runs from the checkout: its packages and .venv are what the next run executes,
    outside any sandbox (issue 24 review). Judged on the host: nothing appeared; the control beside them did."""
    scratch = REPO / f".sg-test-{os.getpid()}"
    targets = ["launcher/zz-planted", "netguard/zz-planted", "sgbase/zz-planted", "selftest/zz-planted"]
    targets += ["allowlists/zz-planted", f"{sys.prefix}/zz-planted"]
    script = "; ".join(f"touch {t} 2>/dev/null && echo planted {t}" for t in targets)
    try:
        r = Sandgate(lab.world, quiet=True, timeout=60).run(
            cmd=["sh", "-c", f"{script}; mkdir {scratch.name} && touch {scratch.name}/ok"], cwd=REPO
        )
        assert r.returncode == 0 and "planted" not in r.stdout, (r.stdout, r.stderr)
        assert not [t for t in targets if (REPO / t).exists()]
        assert (scratch / "ok").is_file()  # the checkout itself is the writable workspace
    finally:
        for t in targets:
            (REPO / t).unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)

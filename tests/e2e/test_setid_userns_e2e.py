"""Issue 24: no setuid/setgid bits and no file capabilities from inside, whoever started sandgate, and
no nested user namespaces unless the run asks for them (`--allow-nested-userns`).

Started by root, the command is uid 0 mapped to host root: a setuid copy of `id` it left in the
workspace was euid 0 for every local account. Each attack runs once from a sandgate started by root
and once from one started by a throwaway user, as root inside (`--user 0`: the most the sandbox
leaves), and is judged on the host: the files are stat'ed and their xattrs read from outside, and
another account runs what was left. Next to each refusal runs its control: the same action outside
the sandbox works, and the plain action inside (chmod 755, a user namespace when asked for) works.
The real tools a sandbox runs (git, tar, pip, npm) keep working.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fsguard import userns
from netguard.audit import read_records

from ..support.rootless import UnprivilegedUser
from ..support.runner import Sandgate, env, write_policy
from ..support.verifyruns import Rows, VerifyRun
from ..support.world import World, _NetnsRunner, new_world

PLANT = """
set +e
cp /usr/bin/id id6755; chmod 6755 id6755; echo "chmod6755 $?"
cp /usr/bin/id id2755; chmod g+s id2755; echo "chmod2755 $?"
install -m 4755 /usr/bin/id idinstall; echo "install $?"
cp /usr/bin/id idcap; setcap cap_net_raw+ep idcap; echo "setcap $?"
cp /usr/bin/id idxattr; "$PY" -c 'import os, struct, sys
try:
    os.setxattr("idxattr", "security.capability", struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0))
except OSError as e:
    sys.exit(e.errno)'; echo "setxattr $?"
cp /usr/bin/id plain; chmod 755 plain; echo "chmod755 $?"
"""
EPERM = 1
LEFT = ("id6755", "id2755", "idinstall", "idcap", "idxattr")


@dataclass
class Side:
    """One way of starting sandgate: as root in the world, or as a throwaway user in it."""

    name: str
    world: World
    runner: _NetnsRunner  # the world itself (root) or a UserRunner (the throwaway user)
    work: Path  # the workspace (cwd), writable by whoever runs sandgate
    home: Path
    policy: Path
    uid: int

    def sandgate(self, *args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        sg = Sandgate(self.runner, policy=self.policy, quiet=True, env={**env(), "HOME": str(self.home)})
        e = {**env(), "HOME": str(self.home), "PY": sys.executable, "NO_UPDATE_NOTIFIER": "1"}
        return sg.run(*args, audit=self.work / "audit.jsonl", cwd=cwd or self.work, timeout=timeout, env=e)

    def fresh(self, name: str) -> Path:
        """A new directory of the workspace, owned by whoever starts sandgate."""
        d = self.work / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        os.chown(d, self.uid, os.stat(self.work).st_gid)
        return d


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with new_world() as w:
        w.tmp.chmod(0o755)  # the throwaway user reads the policy and runs what root's run left here
        yield w


@pytest.fixture(scope="module")
def user() -> Iterator[UnprivilegedUser]:
    with UnprivilegedUser() as u:
        yield u


@pytest.fixture(scope="module", params=["root", "user"])
def side(request: pytest.FixtureRequest, world: World, user: UnprivilegedUser) -> Side:
    policy = write_policy(world, "version: 1\n", "setid")
    policy.chmod(0o644)
    if request.param == "root":
        work, home = world.tmp / "root-work", world.tmp / "root-home"
        for d in (work, home):
            d.mkdir(exist_ok=True)
        work.chmod(0o755)  # another account runs what the run left, as the review did
        return Side("root", world, world, work, home, policy, 0)
    work = user.home / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, user.uid, user.gid)
    return Side("user", world, user.runner(world), work, user.home, policy, user.uid)


def _results(out: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}


def _caps(path: Path) -> str:
    try:
        return os.getxattr(path, "security.capability").hex()
    except OSError as e:
        return os.strerror(e.errno or 0)


# ---- setuid/setgid bits and file capabilities ---------------------------------------------------


def test_no_setid_bit_or_file_capability_is_left_while_chmod_755_works(side: Side, user: UnprivilegedUser) -> None:
    ws = side.fresh("plant")
    r = side.sandgate("--user", "0", "--", "/bin/sh", "-c", PLANT, cwd=ws)
    assert r.returncode == 0, r.stderr
    said = _results(r.stdout)
    # Refused inside, and said so in one line each (chmod/install: EPERM from the filter; setcap: no CAP_SETFCAP).
    assert said["chmod6755"] == said["chmod2755"] == said["install"] == said["setcap"] == 1, (said, r.stderr)
    assert said["setxattr"] == EPERM, said
    assert "Operation not permitted" in r.stderr, r.stderr
    # Judged on the host: no bit, no capability, whoever's files they are.
    for name in LEFT:
        st = os.stat(ws / name)
        assert st.st_uid == side.uid and not st.st_mode & (stat.S_ISUID | stat.S_ISGID), (name, oct(st.st_mode))
        assert _caps(ws / name) == "No data available", name
    assert said["chmod755"] == 0 and stat.S_IMODE(os.stat(ws / "plain").st_mode) == 0o755  # the plain mode works
    if side.name == "root":
        # The review's scenario: another local account runs what the root-started run left.
        ran = user.runner(side.world).run([str(ws / "id6755"), "-u"], cwd="/")
        assert ran.returncode == 0 and ran.stdout.strip() == str(user.uid), (ran.stdout, ran.stderr)


def test_control_outside_the_same_bits_are_kept_and_give_euid_0(side: Side, user: UnprivilegedUser) -> None:
    """Without the sandbox the same commands leave the bits (and, from root, a working euid 0)."""
    ws = side.fresh("control")
    r = side.runner.run(["/bin/sh", "-c", PLANT], cwd=ws, env={**env(), "PY": sys.executable})
    said = _results(r.stdout)
    assert said["chmod6755"] == said["chmod2755"] == said["install"] == 0, (said, r.stderr)
    assert stat.S_IMODE(os.stat(ws / "id6755").st_mode) == 0o6755
    if side.name == "root":
        assert said["setcap"] == said["setxattr"] == 0 and _caps(ws / "idcap") != "No data available"
        ran = user.runner(side.world).run([str(ws / "id6755"), "-u"], cwd="/")
        assert ran.stdout.strip() == "0", (ran.stdout, ran.stderr)  # the hole the filter closes
    shutil.rmtree(ws)  # no setuid-root copy outlives the test


def test_an_existing_setuid_root_binary_raises_nothing_inside(world: World, user: UnprivilegedUser) -> None:
    """no_new_privs, and a nosuid bind of the workspace (it lies under the host's /tmp, bound into the
    private one): the command run as another user gets nothing from a setuid-root file it finds."""
    ws = world.tmp / "existing"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(mode=0o755)
    shutil.copy("/usr/bin/id", ws / "rootid")
    os.chmod(ws / "rootid", 0o4755)  # planted by root outside: the host's own setuid binary
    try:
        outside = user.runner(world).run([str(ws / "rootid"), "-u"], cwd="/")
        assert outside.stdout.strip() == "0", outside.stderr  # control: honoured outside
        sg = Sandgate(world, policy=write_policy(world, "version: 1\n", "setid"), quiet=True, env=env())
        inside = "./rootid -u; grep NoNewPrivs /proc/self/status; awk -v d=\"$PWD\" '$5 == d {print $6}' /proc/self/mountinfo"
        r = sg.run("--user", user.name, cmd=["/bin/sh", "-c", inside], cwd=ws)
        assert r.returncode == 0, r.stderr
        out = r.stdout.split()
        assert out[:3] == [str(user.uid), "NoNewPrivs:", "1"], r.stdout
        assert out[3:] and all("nosuid" in opts.split(",") for opts in out[3:]), r.stdout  # the bind's own word
    finally:
        shutil.rmtree(ws)


# ---- the tools a sandbox runs -------------------------------------------------------------------


def _archive(ws: Path) -> None:
    """A tar with a setuid and a setgid member, as a release tarball or a backup may hold."""
    with tarfile.open(ws / "a.tar", "w") as t:
        for name, mode in (("suid", 0o4755), ("sgid", 0o2755), ("plain", 0o644)):
            info = tarfile.TarInfo(name)
            info.mode, info.size = mode, 3
            t.addfile(info, io.BytesIO(b"hi\n"))


def _wheel(ws: Path) -> None:
    """A pure-Python wheel with a console script: pip chmods the script it writes."""
    files = {
        "sgdemo/__init__.py": "def main():\n    print('sgdemo ok')\n",
        "sgdemo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: sgdemo\nVersion: 0.1\n",
        "sgdemo-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "sgdemo-0.1.dist-info/entry_points.txt": "[console_scripts]\nsgdemo = sgdemo:main\n",
    }
    record = "".join(f"{n},,\n" for n in files) + "sgdemo-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(ws / "sgdemo-0.1-py3-none-any.whl", "w") as z:
        for name, text in {**files, "sgdemo-0.1.dist-info/RECORD": record}.items():
            z.writestr(name, text)


def _npm_tarball(ws: Path) -> None:
    """An npm package tarball with a bin: npm unpacks it and chmods the bin."""
    pkg = {"name": "sgdemo", "version": "1.0.0", "bin": {"sgdemo": "cli.js"}}
    with tarfile.open(ws / "sgdemo-1.0.0.tgz", "w:gz") as t:
        for name, text in (("package/package.json", json.dumps(pkg)), ("package/cli.js", "#!/usr/bin/env node\n")):
            info = tarfile.TarInfo(name)
            data = (text + ("console.log('sgdemo ok')\n" if name.endswith(".js") else "")).encode()
            info.mode, info.size = 0o644, len(data)
            t.addfile(info, io.BytesIO(data))
    (ws / "proj").mkdir()
    (ws / "proj" / "package.json").write_text('{"name": "proj", "version": "1.0.0"}\n')


TOOLS = """
set -e
git init -q repo && cd repo && git config user.email t@sandgate.test && git config user.name t
printf '#!/bin/sh\\necho run\\n' > run.sh && chmod +x run.sh && git add run.sh && git commit -qm one
cd .. && git clone -q repo clone && test -x clone/run.sh && echo "git ok"
mkdir out && tar --no-same-permissions -C out -xf a.tar && echo "tar ok"
mkdir out2 && tar -C out2 -xf a.tar && echo "tar plain 0" || echo "tar plain $?"
"$PY" -m pip install -q --no-index --no-deps --no-cache-dir --target pipdir sgdemo-0.1-py3-none-any.whl
PYTHONPATH=pipdir pipdir/bin/sgdemo
cd proj && npm install --offline --no-audit --no-fund --loglevel=error ../sgdemo-1.0.0.tgz >/dev/null
node_modules/.bin/sgdemo
"""


def test_git_tar_pip_and_npm_still_work(side: Side) -> None:
    ws = side.fresh("tools")
    _archive(ws)
    _wheel(ws)
    _npm_tarball(ws)
    for p in ws.rglob("*"):
        os.lchown(p, side.uid, os.stat(side.work).st_gid)
    r = side.sandgate("--", "/bin/sh", "-c", TOOLS, cwd=ws, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[:2] == ["git ok", "tar ok"] and lines[2].startswith("tar plain "), r.stdout
    assert "sgdemo ok" in r.stdout.splitlines()[-2:] and r.stdout.count("sgdemo ok") == 2, r.stdout
    # Judged on the host: what they unpacked is there, executable, and without a setid bit.
    for f in ("out/suid", "out/sgid", "out2/suid", "out2/sgid", "pipdir/bin/sgdemo", "proj/node_modules/sgdemo/cli.js"):
        mode = os.stat(ws / f).st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID) and mode & stat.S_IXUSR, (f, oct(mode))
    assert stat.S_IMODE(os.stat(ws / "out" / "suid").st_mode) == 0o755
    assert (ws / "clone" / "run.sh").stat().st_mode & 0o111 == 0o111
    # Plain `tar -x` as root: the member is there, only its setid chmod failed (and tar says so).
    tar_plain = int(r.stdout.split("tar plain ")[1].split()[0])
    if side.name == "root":
        assert tar_plain == 2 and "Cannot change mode to rwsr-xr-x: Operation not permitted" in r.stderr
    else:
        assert tar_plain == 0  # an ordinary user's tar never restores the bits


# ---- nested user namespaces ---------------------------------------------------------------------

NEST = """
set +e
cat /proc/sys/user/max_user_namespaces
unshare -U -n true; echo "unshare $?"
"$PY" -c 'import os, sys
try:
    os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
except OSError as e:
    sys.exit(e.errno)
print(next(ln for ln in open("/proc/self/status") if ln.startswith("CapEff")).strip())'; echo "python $?"
"""


def _policy_warnings(audit: Path) -> list[str]:
    recs = [r for r in read_records(audit) if r["event"] == "policy"]
    warnings: list[str] = recs[-1]["warnings"]
    return warnings


def test_nested_user_namespaces_fail_by_default_and_work_when_asked(side: Side) -> None:
    # Control: whoever started sandgate can make them outside.
    r = side.runner.run(["unshare", "-U", "-n", "true"], cwd="/")
    assert r.returncode == 0, r.stderr
    refused = side.sandgate("--user", "0", "--", "/bin/sh", "-c", NEST)
    assert refused.returncode == 0, refused.stderr
    lines = refused.stdout.splitlines()
    assert lines == ["0", "unshare 1", f"python {EPERM}"], refused.stdout
    assert "unshare failed: Operation not permitted" in refused.stderr, refused.stderr
    assert userns.NESTED_WARNING not in _policy_warnings(side.work / "audit.jsonl")

    allowed = side.sandgate("-v", "--allow-nested-userns", "--user", "0", "--", "/bin/sh", "-c", NEST)
    assert allowed.returncode == 0, allowed.stderr
    lines = allowed.stdout.splitlines()
    # The opt-in really gives what the default withholds: every capability over a namespace of its own.
    assert lines[1:] == ["unshare 0", "CapEff:\t000001ffffffffff", "python 0"] and lines[0] != "0", allowed.stdout
    assert "sandgate: nested user namespaces: allowed (--allow-nested-userns)" in allowed.stderr
    assert userns.NESTED_WARNING in _policy_warnings(side.work / "audit.jsonl")


# ---- sandgate verify's rows ---------------------------------------------------------------------

VERIFY_PROBES = "file_caps,nested_userns,setuid_plant"


def _verify(runner: _NetnsRunner, weaken: str = "") -> tuple[int, Rows, str]:
    e = {**env(), **({"SANDGATE_INTERNAL_WEAKEN": weaken} if weaken else {})}
    r = runner.run([sys.executable, "-m", "launcher.cli", "verify", "--json", "--only", VERIFY_PROBES], env=e, cwd="/")
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else []), r.stderr


def _ours(run: VerifyRun) -> Rows:
    """This module's rows of a whole run (support/verifyruns.py: made once, shared with test_verify)."""
    return [r for r in run.rows if r["probe"] in VERIFY_PROBES.split(",")]


def test_verify_rows_hold_and_the_nested_userns_weakening_flips_exactly_its_rows(
    world: World, verify_as_root: VerifyRun
) -> None:
    rows = _ours(verify_as_root)  # the control: the whole run's rows of these probes all hold
    assert len(rows) == 3 * 3 * 2 and all(r["ok"] for r in rows), (rows, verify_as_root.err[-2000:])
    code, rows, err = _verify(world, weaken="nested-userns")  # the same probes see a missing boundary
    assert code == 1, err[-2000:]
    assert {r["probe"] for r in rows} == set(VERIFY_PROBES.split(","))
    failed = {(r["probe"], r["context"], r["identity"]) for r in rows if not r["ok"]}
    assert failed == {
        ("nested_userns", ctx, who) for ctx in ("child", "grandchild", "daemon") for who in ("root", "user")
    }
    assert all("CapEff 000001ffffffffff" in str(r["evidence"]) for r in rows if not r["ok"]), rows


def test_an_ordinary_user_verifies_the_same_rows_without_sudo(verify_as_user: VerifyRun) -> None:
    rows = _ours(verify_as_user)
    assert len(rows) == 3 * 3 * 2 and all(r["ok"] for r in rows), (rows, verify_as_user.err[-2000:])

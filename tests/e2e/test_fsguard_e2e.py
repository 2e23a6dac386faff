"""The filesystem and process boundary, end to end: real `sandgate run`, real kernel.

The workspace and a fake home live under /var/tmp (the sandbox gets its own /tmp, so files
under the host's /tmp would be invisible for the wrong reason). Every refusal is checked
on the host afterwards (the file is unchanged), and the same action is shown to succeed
without sandgate, so a test cannot pass because the action was impossible anyway.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.runner import Sandgate, env
from ..support.world import World, new_world

SECRET = "SECRET-KEY-6f1d"


@dataclass
class Fs:
    world: World
    base: Path
    ws: Path
    home: Path
    outside: Path
    policy: Path

    @property
    def sg(self) -> Sandgate:
        """`sandgate run -q` in the workspace under the module's policy."""
        return Sandgate(self.world, policy=self.policy, quiet=True, cwd=self.ws)

    def run(
        self,
        script: str,
        *extra: str,
        envx: dict[str, str] | None = None,
        timeout: float = 60,
        audit: Path | None = None,
        depth: str = "child",
    ) -> subprocess.CompletedProcess[str]:
        """Run `script` in the sandbox by the command itself ("child") or by a process it starts ("grandchild")."""
        self.audit = audit or self.base / f"audit-{time.monotonic_ns()}.jsonl"
        cmd = ["sh", "-c", script] if depth == "child" else ["sh", "-c", 'sh -c "$SG_SCRIPT"']
        return self.sg.run(
            *extra,
            audit=self.audit,
            cmd=cmd,
            timeout=timeout,
            env={**env(), "HOME": str(self.home), "SG_SCRIPT": script, **(envx or {})},
        )

    def bare(self, script: str) -> subprocess.CompletedProcess[str]:
        """The same script without sandgate: the control that shows the action is possible at all."""
        return self.world.run(["sh", "-c", script], cwd=self.ws, env={**env(), "HOME": str(self.home)})


def git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def fs() -> Iterator[Fs]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-fs-", dir="/var/tmp"))
    try:
        with new_world() as w:
            ws, home, outside = base / "ws", base / "home", base / "outside"
            for d in (ws, home / ".ssh", home / ".aws", outside):
                d.mkdir(parents=True)
            (home / ".ssh" / "id_ed25519").write_text(SECRET + "\n")
            (home / ".aws" / "credentials").write_text(SECRET + "\n")
            (home / ".bashrc").write_text("# rc\n")
            (outside / "victim.txt").write_text("original\n")
            git(ws, "init", "-q")
            git(ws, "config", "user.email", "t@sandgate.test")
            git(ws, "config", "user.name", "t")
            (ws / "README").write_text("hi\n")
            git(ws, "add", "README")
            git(ws, "commit", "-qm", "init")
            policy = base / "policy.yaml"
            policy.write_text("version: 1\nnetwork:\n  allow: [pypi.test]\nenv:\n  keep: [KEEP_TOKEN]\n")
            yield Fs(w, base, ws, home, outside, policy)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))  # the fake home's sandbox layer too
        shutil.rmtree(base, ignore_errors=True)


DEPTHS = pytest.mark.parametrize("depth", ["child", "grandchild"])


def lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    return r.stdout.strip().splitlines()


# ---- writes ------------------------------------------------------------------------------------


@DEPTHS
def test_writes_inside_workspace_and_tmp_work_and_outside_fail(fs: Fs, depth: str) -> None:
    probe = textwrap.dedent(f"""\
        w() {{ if ( echo x >> "$1" ) 2>/dev/null; then echo "ok $1"; else echo "refused $1"; fi; }}
        w ws-{depth}.txt; w /tmp/t-{depth}; w {fs.home}/.bashrc; w /etc/sandgate-probe; w /root/sandgate-probe
        w {fs.outside}/victim.txt; w {fs.outside}/new-{depth}.txt""")
    r = fs.run(probe, depth=depth)
    # ~/.bashrc: written inside the sandbox's home overlay, never the real one (checked below).
    assert lines(r) == [
        f"ok ws-{depth}.txt",
        f"ok /tmp/t-{depth}",
        f"ok {fs.home}/.bashrc",
        "refused /etc/sandgate-probe",
        "refused /root/sandgate-probe",
        f"refused {fs.outside}/victim.txt",
        f"refused {fs.outside}/new-{depth}.txt",
    ], r.stderr
    assert (fs.ws / f"ws-{depth}.txt").read_text() == "x\n"
    assert (fs.home / ".bashrc").read_text() == "# rc\n" and (fs.outside / "victim.txt").read_text() == "original\n"
    assert not Path("/etc/sandgate-probe").exists() and not (fs.outside / f"new-{depth}.txt").exists()
    assert not Path(f"/tmp/t-{depth}").exists()  # the sandbox's /tmp was its own
    r = fs.run(f"echo x >> {fs.outside}/victim.txt")
    assert r.returncode != 0 and "Permission denied" in r.stderr  # EACCES from Landlock


@DEPTHS
def test_git_hooks_and_config_are_read_only_while_git_commit_works(fs: Fs, depth: str) -> None:
    r = fs.run(
        textwrap.dedent(f"""\
        echo 'curl evil' > .git/hooks/pre-commit; echo "hook=$?"
        echo '[core] fsmonitor = evil' >> .git/config; echo "config=$?"
        echo change > work-{depth}.txt && git add work-{depth}.txt && git commit -qm 'from sandbox' && echo committed"""),
        depth=depth,
    )
    assert lines(r) == ["hook=2", "config=2", "committed"], r.stderr
    assert "Read-only file system" in r.stderr
    assert not (fs.ws / ".git/hooks/pre-commit").exists()
    assert "fsmonitor" not in (fs.ws / ".git/config").read_text()
    assert "from sandbox" in git(fs.ws, "log", "--oneline")
    assert (
        fs.bare("echo '#' > .git/hooks/pre-commit.sample-probe && rm .git/hooks/pre-commit.sample-probe").returncode
        == 0
    )


@DEPTHS
def test_missing_protected_paths_cannot_be_created_and_leave_nothing(fs: Fs, depth: str) -> None:
    extra = fs.base / "extra.yaml"
    extra.write_text("version: 1\nfilesystem:\n  protect: [deploy.key, ci/]\n")
    r = fs.run(
        "touch .sandgate.yaml; echo a=$?; echo k > deploy.key; echo b=$?; mkdir -p ci/x; echo c=$?; "
        "rm -rf ci; echo d=$?",
        "--policy",
        str(extra),
        depth=depth,
    )
    assert lines(r) == ["a=1", "b=2", "c=1", "d=1"], r.stderr
    for p in (".sandgate.yaml", "deploy.key", "ci"):
        assert not (fs.ws / p).exists(), p  # the run's placeholders are gone


@DEPTHS
def test_protected_directories_cannot_be_renamed_away(fs: Fs, depth: str) -> None:
    r = fs.run(
        "mv .git/hooks .git/hooks-old; echo a=$?; mv .git .git-old; echo b=$?; "
        "mkdir -p x/.git/hooks 2>/dev/null; mv .git x/ 2>/dev/null; echo c=$?",
        depth=depth,
    )
    assert lines(r) == ["a=1", "b=1", "c=1"], r.stderr
    assert "Device or resource busy" in r.stderr
    assert (fs.ws / ".git/hooks").is_dir() and not (fs.ws / ".git-old").exists()


@DEPTHS
def test_hard_links_and_symlinks_cannot_reach_outside(fs: Fs, depth: str) -> None:
    r = fs.run(
        f"ln {fs.outside}/victim.txt hard; echo hard=$?; ln -s {fs.outside}/victim.txt soft; "
        f"echo gotcha > soft; echo soft=$?; ln -s {fs.outside} dirlink; echo x > dirlink/new.txt; echo dir=$?",
        depth=depth,
    )
    assert lines(r) == ["hard=1", "soft=2", "dir=2"], r.stderr
    assert (fs.outside / "victim.txt").read_text() == "original\n" and not (fs.outside / "new.txt").exists()
    assert not (fs.ws / "hard").exists()
    # Control: without sandgate root can hard-link the file in.
    assert fs.bare(f"ln {fs.outside}/victim.txt hard-ctl && rm hard-ctl").returncode == 0
    for p in ("soft", "dirlink"):
        (fs.ws / p).unlink()


@DEPTHS
def test_remount_and_umount_fail_even_for_root(fs: Fs, depth: str) -> None:
    r = fs.run(
        "id -u; mount -o remount,rw,bind .git/hooks; echo m=$?; umount .git/hooks; echo u=$?; "
        "mount -t tmpfs none .git/hooks; echo t=$?; touch .git/hooks/x; echo w=$?",
        depth=depth,
    )
    assert lines(r) == ["0", "m=32", "u=32", "t=32", "w=1"], r.stderr


@DEPTHS
def test_secrets_in_home_are_hidden(fs: Fs, depth: str) -> None:
    r = fs.run("cat ~/.ssh/id_ed25519 ~/.aws/credentials; ls -A ~/.ssh; echo rc=$?; cat ~/.bashrc", depth=depth)
    assert SECRET not in r.stdout + r.stderr
    # .ssh is an empty directory now; other files stay readable (an earlier test of this module may have
    # appended to ~/.bashrc inside: the sandbox's home layer keeps that, the real file never changes).
    assert lines(r)[:2] == ["rc=0", "# rc"]
    assert SECRET in fs.bare("cat ~/.ssh/id_ed25519").stdout  # the key is really there


@DEPTHS
def test_environment_secrets_are_dropped_and_kept_ones_present(fs: Fs, depth: str) -> None:
    r = fs.run(
        "env | cut -d= -f1 | sort",
        envx={
            "MY_TOKEN": "v1",
            "GITHUB_TOKEN": "v2",
            "DB_PASSWORD_X": "v3",
            "AWS_SECRET_ACCESS_KEY": "v4",
            "KEEP_TOKEN": "v5",
            "PLAIN": "v6",
        },
        depth=depth,
    )
    names = set(lines(r))
    assert {"KEEP_TOKEN", "PLAIN", "HTTPS_PROXY"} <= names
    assert not names & {"MY_TOKEN", "GITHUB_TOKEN", "DB_PASSWORD_X", "AWS_SECRET_ACCESS_KEY"}
    rec: Any = next(r for r in read_records(fs.audit) if r["event"] == "policy")
    assert {"MY_TOKEN", "GITHUB_TOKEN", "DB_PASSWORD_X", "AWS_SECRET_ACCESS_KEY"} <= set(rec["env_dropped"])
    assert "v1" not in fs.audit.read_text()  # names only, never values
    assert rec["landlock_abi"] >= 1 and str(fs.ws) in rec["write"] and rec["private_tmp"] is True
    assert f"{fs.ws}/.git/hooks" in rec["protect"] and f"{fs.home}/.ssh" in rec["hidden"]


@DEPTHS
def test_no_new_privileges_and_seccomp_are_set(fs: Fs, depth: str) -> None:
    r = fs.run("grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status", "--require-landlock", depth=depth)
    assert lines(r) == ["NoNewPrivs:\t1", "Seccomp:\t2"], r.stderr


TIOCSTI_DRIVER = textwrap.dedent("""\
    # On a real terminal: the command tries to type into it; print what the terminal received.
    import os, pty, sys, select, time
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(sys.argv[1], sys.argv[1:])
    out = b""
    while True:
        try:
            r, _, _ = select.select([fd], [], [], 20)
            chunk = os.read(fd, 1024) if r else b""
        except OSError:
            chunk = b""
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    print(out.decode(errors="replace").replace("\\r", ""))
    """)
INJECT = (
    "import fcntl, termios\n"
    "try:\n    [fcntl.ioctl(0, termios.TIOCSTI, bytes([c])) for c in b'INJECTED']; print('tiocsti=ok')\n"
    "except OSError as e:\n    print('tiocsti=' + e.strerror)\n"
)


@DEPTHS
def test_terminal_injection_fails(fs: Fs, depth: str) -> None:
    audit = fs.base / "tty.jsonl"
    cmd = ["python3", "-c", INJECT] if depth == "child" else ["sh", "-c", 'python3 -c "$SG_SCRIPT"']
    inside = fs.world.run(
        [sys.executable, "-c", TIOCSTI_DRIVER, *fs.sg.argv(audit=audit, cmd=cmd)],
        cwd=fs.ws,
        env={**env(), "SG_SCRIPT": INJECT},
        timeout=60,
    )
    assert "tiocsti=Operation not permitted" in inside.stdout, inside
    bare = fs.world.run([sys.executable, "-c", TIOCSTI_DRIVER, *cmd], cwd=fs.ws, env={**env(), "SG_SCRIPT": INJECT})
    assert "tiocsti=ok" in bare.stdout  # the control: this machine allows TIOCSTI (legacy_tiocsti=1)
    assert "INJECTED" in bare.stdout and "INJECTED" not in inside.stdout  # what the terminal received


def make_wheel(dest: Path) -> Path:
    """A minimal pure-Python wheel, so the test needs no package from the real registry."""
    name, version = "sgdemo", "0.1"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    record += f"{name}-{version}.dist-info/RECORD,,\n"
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return wheel


def test_pip_install_target_from_a_local_index_works_under_the_default_policy(fs: Fs) -> None:
    root = fs.base / "index"
    (root / "simple" / "sgdemo").mkdir(parents=True)
    wheel = make_wheel(root / "simple" / "sgdemo")
    (root / "simple" / "sgdemo" / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    fs.world.add_host("pypi.test", "198.51.100.70")
    server = fs.world.popen(
        [sys.executable, "-m", "http.server", "80", "--bind", "198.51.100.70", "-d", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            if fs.world.run(["curl", "-s", "-o", "/dev/null", "http://pypi.test/simple/"]).returncode == 0:
                break
            time.sleep(0.1)
        pip = Path(sys.executable).with_name("pip")
        r = fs.run(
            f"{pip} install --isolated --no-cache-dir --disable-pip-version-check --target ./vendor "
            '--index-url http://pypi.test/simple --trusted-host pypi.test sgdemo && python3 -c \'import sys; sys.path.insert(0, "vendor"); '
            "import sgdemo; print(sgdemo.VALUE)'",
            timeout=120,
        )
        assert r.returncode == 0 and lines(r)[-1] == "42", r.stdout + r.stderr
        assert (fs.ws / "vendor" / "sgdemo" / "__init__.py").exists()
    finally:
        server.terminate()
        server.wait(10)


@DEPTHS
def test_outside_processes_are_invisible_and_untouchable(fs: Fs, depth: str) -> None:
    ptrace = (
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
        'print("ptrace", libc.ptrace(16, 1, 0, 0), os.strerror(ctypes.get_errno()))'
    )  # PTRACE_ATTACH to init
    r = fs.run(f"ls /proc | grep -c '^[0-9]'; kill -0 1; echo kill=$?; python3 -c '{ptrace}'", depth=depth)
    out = lines(r)
    assert int(out[0]) <= 6, out  # only the sandbox's own few processes, not the host's
    assert out[1:] == ["kill=1", "ptrace -1 Operation not permitted"], (out, r.stderr)


def test_inherited_file_descriptors_are_closed(fs: Fs) -> None:
    fd = os.open(fs.outside / "victim.txt", os.O_RDWR)  # a descriptor the caller leaks into sandgate
    try:
        r = fs.sg.run(
            audit=fs.base / "fd.jsonl",
            cmd=[
                "python3",
                "-c",
                f"import os\ntry:\n    os.write({fd}, b'hijack'); print('w=ok')\n"
                "except OSError as e:\n    print('w=' + e.strerror)",
            ],
            env={**env(), "HOME": str(fs.home)},
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    assert lines(r) == ["w=Bad file descriptor"], r
    assert (fs.outside / "victim.txt").read_text() == "original\n"

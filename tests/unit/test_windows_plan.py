"""The policy -> Windows plan mapping, job flags, the platform seam, and the Win32 binding table."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fsguard import policy as fspolicy
from fsguard.windows import envblock, job, winpath
from launcher.config.load import Policy
from launcher.run import seam
from launcher.run.windows import plan
from netguard.policy import NetworkPolicy
from sgbase.windows import win32

from ..support.importgraph import imports_of, module_name, top

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"
HOST = plan.Host(SID, r"C:\src\proj", r"C:\Users\me", frozenset({winpath.key(r"C:\Users\me\.ssh")}))
ROOT = Path(__file__).resolve().parent.parent.parent
#: Where the Windows modules live: the binding below both guards, each guard's, the launch's, the probes'.
WINDOWS_DIRS = tuple(ROOT / d / "windows" for d in ("sgbase", "netguard", "fsguard", "launcher/run", "selftest"))


def _policy(fs: fspolicy.FsPolicy | None = None) -> Policy:
    return Policy(NetworkPolicy(), ("test",), filesystem=fs or fspolicy.FsPolicy())


def test_explicit_proxy_is_the_default() -> None:
    p = plan.plan(_policy(), HOST)
    assert p.divert is None and p.dynamic == ()
    env = dict(p.env)
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == "http://127.0.0.1:3128" and env["NO_PROXY"] == ""
    assert len({n.casefold() for n in env}) == len(env)  # one spelling per name (issue 28, W1)
    permits = {
        c.value for f in p.filters.filters if f.action == "permit" for c in f.conditions if c.field == "remote_port"
    }
    assert permits == {3128}  # the transparent port is not even reachable
    assert [r.remote_ports for r in p.rules if r.protocol == "tcp"] == [("1-3127", "3129-65535")]


def test_transparent_capture_adds_the_loop_and_its_dynamic_permits() -> None:
    p = plan.plan(_policy(), plan.Host(**{**HOST.__dict__, "transparent": True}))
    assert p.divert is not None and len(p.dynamic) == 2
    permits = {
        c.value for f in p.filters.filters if f.action == "permit" for c in f.conditions if c.field == "remote_port"
    }
    assert permits == {3128, 3129}


def test_the_filesystem_section_reaches_the_acls() -> None:
    p = plan.plan(_policy(fspolicy.FsPolicy(write=(".", r"D:\out"))), HOST)
    assert [s.path for s in p.acls.steps if s.why == "write"] == [r"C:\src\proj", r"D:\out"]
    assert [s.path for s in p.acls.steps if s.why == "read_deny"] == [r"C:\Users\me\.ssh"]


def test_job_kills_the_tree_and_never_lets_it_break_away() -> None:
    limits = job.plan_job()
    assert limits.limit_flags & job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    assert not limits.limit_flags & job.BREAKAWAY_FLAGS
    assert limits.ui_restrictions == 0  # UI limits cannot nest (issue 28, W4): the private desktop instead
    assert job.plan_job(64).limit_flags & job.JOB_OBJECT_LIMIT_ACTIVE_PROCESS
    for bad in (
        job.JobLimits(job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | job.JOB_OBJECT_LIMIT_BREAKAWAY_OK, 0, 0),
        job.JobLimits(0, 0, 0),
    ):
        with pytest.raises(job.JobPlanError):
            job.check_job(bad)
    create = job.plan_create()
    assert create.creation_flags & job.CREATE_SUSPENDED and not create.creation_flags & job.CREATE_BREAKAWAY_FROM_JOB


@dataclass
class Recorder:
    name: seam.PlatformName = "linux"
    calls: list[str] = field(default_factory=list)
    fail_start: bool = False

    def make(self, request: seam.SandboxRequest) -> seam.Sandbox:
        self.calls.append("make")
        return Made(request)

    def start(self, sandbox: seam.Sandbox) -> None:
        self.calls.append("start")
        if self.fail_start:
            raise RuntimeError("start failed")

    def wait(self, sandbox: seam.Sandbox) -> int:
        self.calls.append("wait")
        return 7

    def teardown(self, sandbox: seam.Sandbox) -> None:
        self.calls.append("teardown")


@dataclass(frozen=True)
class Made:
    request: seam.SandboxRequest


def test_the_seam_always_tears_down() -> None:
    req = seam.SandboxRequest(("true",), "/w", {}, _policy(), "t")
    ok = Recorder()
    assert seam.run_in(ok, req) == 7 and ok.calls == ["make", "start", "wait", "teardown"]
    bad = Recorder(fail_start=True)
    with pytest.raises(RuntimeError):
        seam.run_in(bad, req)
    assert bad.calls == ["make", "start", "teardown"]


def test_platform_names() -> None:
    assert seam.platform_name("linux") == "linux" and seam.platform_name("win32") == "windows"
    with pytest.raises(NotImplementedError):
        seam.platform_name("darwin")  # refused, never run unconfined


def test_win32_imports_here_and_calls_nothing() -> None:
    assert len(win32.BY_NAME) == len(win32.CALLS)
    for call in win32.CALLS:
        assert call.doc.startswith("https://learn.microsoft.com/") and call.name.lower() in call.doc.replace("-", "")
    if sys.platform != "win32":
        with pytest.raises(win32.Win32Error):
            win32.fn("CreateJobObjectW")
    else:  # on the Windows runner the binding is real: its DLL loads and the name resolves
        assert callable(win32.fn("CreateJobObjectW"))


def test_only_win32_calls_windows() -> None:
    """The pure plans do no I/O: no ctypes, os, subprocess or socket outside the win32* bindings."""
    paths = [p for d in WINDOWS_DIRS for p in d.glob("*.py")] + [ROOT / "launcher" / "run" / "windowsbackend.py"]
    assert len(paths) > 40, "the Windows modules moved: update WINDOWS_DIRS"
    for path in paths:
        if path.name.startswith("win32") or path.name == "realapi.py":  # the bindings, the real WinApi
            continue
        module, rel = module_name(ROOT, path), str(path.relative_to(ROOT))
        names = {top(i.dst) for i in imports_of(module, rel, path.read_text(encoding="utf-8"), set())}
        assert not names & {"ctypes", "os", "subprocess", "socket", "pydivert", "shutil"}, path.name


def test_environment_block_is_sorted_terminated_and_cannot_be_smuggled_into() -> None:
    assert envblock.build({"b": "2", "A": "1", "HTTPS_PROXY": "http://127.0.0.1:3128"}) == (
        "A=1\0b=2\0HTTPS_PROXY=http://127.0.0.1:3128\0\0"
    )
    assert envblock.build({}) == "\0\0"  # an empty block is still two NULs (issue 28, M2)
    for bad in ({"A=B": "x"}, {"A": "x\0SECRET=1"}, {"": "x"}, {"Path": "a", "PATH": "b"}):
        with pytest.raises(envblock.EnvBlockError):
            envblock.build(bad)


def test_dpapi_is_only_reached_on_windows() -> None:
    if sys.platform != "win32":
        with pytest.raises(win32.Win32Error):
            win32.protect(b"password")
    else:  # the Windows runner: the sealed-password round trip setup and every run rely on (user scope)
        sealed = win32.protect(b"sandgate-password")
        assert sealed != b"sandgate-password" and win32.unprotect(sealed) == b"sandgate-password"


def _shared_probe_order() -> tuple[str, ...]:
    """selftest/probes/core.py's ORDER, read from its source: importing selftest.probes loads the Linux probes
    (process.py imports fcntl), which CPython on Windows lacks, and the workflow runs this module there."""
    tree = ast.parse((ROOT / "selftest" / "probes" / "core.py").read_text(encoding="utf-8"))
    (value,) = [
        n.value for n in tree.body if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["ORDER"]
    ]
    order = ast.literal_eval(value)
    assert isinstance(order, tuple) and order and all(isinstance(name, str) for name in order)  # a literal, read whole
    return order


def test_every_shared_probe_has_a_windows_decision() -> None:
    from selftest.windows import probes

    assert set(probes.PROBES) == set(_shared_probe_order()), "a probe added for Linux needs a Windows decision here"
    gaps = [name for name, (cov, _) in probes.PROBES.items() if cov == "gap"]
    doc = (ROOT / "docs" / "windows.md").read_text(encoding="utf-8")
    assert gaps and all(name in doc for name in gaps), "every gap is stated in docs/windows.md"


def test_every_called_function_is_in_the_documented_table() -> None:
    """A call not listed in win32.CALLS would have no argtypes and no documentation page."""
    for name in ("sgbase/windows/win32.py", "netguard/windows/win32wfp.py", "fsguard/windows/win32job.py"):
        tree = ast.parse((ROOT / name).read_text(encoding="utf-8"))
        called = {
            n.args[0].value
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "fn"
            if n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
        }
        assert called and called <= set(win32.BY_NAME), (name, sorted(called - set(win32.BY_NAME)))

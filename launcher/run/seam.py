"""The platform seam: one interface for "make a sandbox, start CMD, wait, tear down", one per OS.

Why an interface and not an `if windows:` in the launch sequence: the policy, proxy and audit code
must never learn which OS they run on (architecture.md), so everything OS-specific hides behind
these four steps, and `run_in` is the one order they are taken in on every platform. Both
platforms go through it: Linux with `launcher.run.linuxbackend.LinuxBackend` (namespaces,
Landlock, seccomp, the per-user daemon), called by `launcher.run.launch.main`; Windows with
`launcher.run.windowsbackend.WindowsBackend` (sandbox user, WFP, ACLs, job), called by
`launcher.run.windows.runner.run`. The contract: teardown runs whatever happened after make,
and a make that fails tears down what it had made before it raises, so a failed start never
leaves filters, ACLs, placeholders or run state behind. What only one OS needs goes into that
backend's constructor, never into the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:  # the policy types only: importing the loader would cost every run its parse
    from launcher.config.load import Policy

PlatformName = Literal["linux", "windows"]


@dataclass(frozen=True)
class SandboxRequest:
    """What every backend gets: the command, where it runs, its environment, the policy, the run's task id.

    `env` is filtered by `policy.env` exactly once, where the names it drops are recorded: the
    Windows runner filters it before the request; on Linux it is the launcher's own environment,
    filtered by confinement.plan inside make (under the run lock, into the run's policy record).
    """

    cmd: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    policy: Policy
    task: str


class Sandbox(Protocol):
    """A made sandbox: what `start`, `wait` and `teardown` act on (each backend has its own record)."""

    @property
    def request(self) -> SandboxRequest: ...


class Backend(Protocol):
    """One OS's way to confine a command. Every method may raise; `teardown` must be idempotent."""

    name: PlatformName

    def make(self, request: SandboxRequest) -> Sandbox:
        """Everything before CMD: boundaries installed (namespaces / WFP, ACLs, job), nothing running yet."""
        ...

    def start(self, sandbox: Sandbox) -> None:
        """CMD started inside the finished boundary (Windows: suspended, put in the job, then resumed)."""
        ...

    def wait(self, sandbox: Sandbox) -> int:
        """CMD's exit status; signals forwarded meanwhile."""
        ...

    def teardown(self, sandbox: Sandbox) -> None:
        """Every trace removed or restored (placeholders, DACLs, dynamic filters), also after a failed start."""
        ...


def run_in(backend: Backend, request: SandboxRequest) -> int:
    """The order every platform follows: make, start, wait; teardown whatever happened after make."""
    sandbox = backend.make(request)
    try:
        backend.start(sandbox)
        return backend.wait(sandbox)
    finally:
        backend.teardown(sandbox)


def platform_name(sys_platform: str) -> PlatformName:
    """The backend for `sys.platform`; anything else is refused rather than run unconfined."""
    if sys_platform.startswith("linux"):
        return "linux"
    if sys_platform == "win32":
        return "windows"
    raise NotImplementedError(f"sandgate has no sandbox backend for {sys_platform!r} (Linux and Windows only)")

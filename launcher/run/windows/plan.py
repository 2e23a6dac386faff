"""sandgate's typed policy -> the Windows plan: every filter, rule, ACE, job flag and variable one
run needs, computed before anything is touched (and so shown, tested and diffed as data).

The network policy itself is not translated: the same daemon enforces it, by name, on every
platform. What this maps is the boundary around it: which ports reach the daemon, which paths the
sandbox user may write, what the environment tells well-behaved clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsguard.windows import acl, job, profileenv
from fsguard.windows.acl import AclPlan
from fsguard.windows.job import CreateProcess, JobLimits
from netguard.windows import divertfilter, firewall, wfp
from netguard.windows.divertfilter import DivertFilters
from netguard.windows.firewall import FirewallRule
from netguard.windows.wfp import WfpFilter, WfpPlan

if TYPE_CHECKING:
    from launcher.config.load import Policy


@dataclass(frozen=True)
class Host:
    """What the caller learned about this machine and run (I/O is the caller's, not this module's)."""

    sid: str  # the sandbox user's SID (from `sandgate setup`)
    cwd: str  # the workspace, a Windows path
    home: str  # the real user's profile: `~` in policies means it, as on Linux
    existing: frozenset[str]  # winpath.key() of the protected/denied paths that exist
    explicit_port: int = 3128
    transparent_port: int = 3129
    transparent: bool = False  # optional pydivert reflect capture (docs/windows.md)
    read_grants: tuple[str, ...] = ()  # directories the task must read (its toolchain)
    extra_protect: tuple[str, ...] = ()  # e.g. the run's audit log when it lies in a writable root
    user: str = ""  # the sandbox user's account name: its own profile variables (W7)


@dataclass(frozen=True)
class WindowsPlan:
    filters: WfpPlan  # persistent (installed by `sandgate setup`, checked by every run)
    dynamic: tuple[WfpFilter, ...]  # the redirect loop's session only
    rules: tuple[FirewallRule, ...]
    acls: AclPlan
    limits: JobLimits
    create: CreateProcess
    env: tuple[tuple[str, str], ...]  # set over the filtered environment
    divert: DivertFilters | None


def proxy_env(port: int) -> tuple[tuple[str, str], ...]:
    """Explicit proxy for every client that reads the usual variables; NO_PROXY empty, so no host
    is sent around it (those that ignore the variables get nothing: WFP blocks them). One spelling
    each: Windows names are case-insensitive, `http_proxy` IS `HTTP_PROXY` there, and a block with
    both is refused (issue 28, W1); getenv("http_proxy") finds it either way."""
    url = f"http://127.0.0.1:{port}"
    return (*((n, url) for n in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")), ("NO_PROXY", ""))


def _profile(host: Host) -> tuple[tuple[str, str], ...]:
    if not host.user:
        return ()
    return profileenv.profile_env(profileenv.profile_dir(host.home, host.user), host.user)


def plan(policy: Policy, host: Host) -> WindowsPlan:
    ports = (host.explicit_port, host.transparent_port) if host.transparent else (host.explicit_port,)
    return WindowsPlan(
        filters=wfp.plan_filters(host.sid, ports),
        dynamic=wfp.transparent_permits(host.sid) if host.transparent else (),
        rules=firewall.plan_rules(host.sid, ports),
        acls=acl.plan_acls(
            policy.filesystem,
            sid=host.sid,
            cwd=host.cwd,
            home=host.home,
            existing=host.existing,
            read_grants=host.read_grants,
            extra_protect=host.extra_protect,
        ),
        limits=job.plan_job(),
        create=job.plan_create(),
        env=(*proxy_env(host.explicit_port), *_profile(host)),
        divert=divertfilter.plan_filters(host.transparent_port) if host.transparent else None,
    )

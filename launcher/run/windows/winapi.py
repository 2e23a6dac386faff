"""`WinApi`: every OS effect the Windows backend and `sandgate setup` take, behind one Protocol.

Why one small seam: nothing here can run on this workplace's Linux, so the order of effects (setup
checked before anything, the ACL journal written before each ACE, CMD resumed only inside its job,
teardown after any failure) is only testable if every effect goes through one interface that a fake
can record and fail at any step. The real implementation (realapi.py) wraps the guards' bindings;
the fake lives in the tests. Every method raises WinApiError (one line for the user), nothing else.
The part fsguard's ACL code needs on its own is sgbase.windows.api.FileApi.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fsguard.windows.desktop import DesktopPlan
from fsguard.windows.job import JobLimits
from fsguard.windows.launch import Launch
from fsguard.windows.reparse import Link
from fsguard.windows.sweep import SweepApi
from netguard.windows.firewall import FirewallRule
from netguard.windows.wfp import WfpFilter, WfpPlan
from sgbase.windows.api import FileApi, Proc

if TYPE_CHECKING:  # the transparent path's types only: run without --transparent never loads it
    from netguard.windows.divertfilter import DivertFilters
    from netguard.windows.owners import Opened
    from netguard.windows.win32divert import Handle, ResolverServer, TransparentPath


class WinApi(FileApi, SweepApi, Protocol):
    """The effects, grouped by what they touch (FileApi's: who and where, files and DACLs; SweepApi's:
    the teardown sweep as the sandbox user, fsguard/windows/sweep.py). Paths are Windows paths."""

    # the sandbox user and its sealed password (DPAPI, user scope)
    def user_sid(self, name: str) -> str | None: ...
    def create_user(self, name: str, password: str) -> str: ...
    def set_password(self, name: str, password: str) -> None: ...
    def delete_user(self, name: str) -> None: ...
    def delete_profile(self, sid: str) -> None: ...  # DeleteProfileW (M10); no profile is fine
    def deny_logon_rights(self, sid: str, rights: tuple[str, ...]) -> None: ...  # LsaAddAccountRights (H3)
    def undeny_logon_rights(self, sid: str, rights: tuple[str, ...]) -> None: ...  # LsaRemoveAccountRights
    def wmi_namespace_sd(self, namespace: str) -> str: ...  # __SystemSecurity GetSD as SDDL (H3, servicedeny)
    def set_wmi_namespace_sd(self, namespace: str, sd: str) -> None: ...  # SetSD: needs WRITE_DAC (admin)
    def com_restriction_sd(self, value: str) -> str | None: ...  # HKLM\...\Ole Machine*Restriction; None: absent
    def set_com_restriction_sd(self, value: str, sd: str) -> None: ...
    def protect(self, data: bytes) -> bytes: ...
    def unprotect(self, sealed: bytes) -> bytes: ...

    # persistent boundary: WFP filters, firewall rules
    def wfp_installed(self, plan: WfpPlan) -> bool: ...
    def wfp_install(self, plan: WfpPlan) -> None: ...
    def wfp_remove(self, plan: WfpPlan) -> None: ...
    def firewall_has(self, name: str) -> bool: ...
    def firewall_add(self, rule: FirewallRule) -> None: ...
    def firewall_remove(self, name: str) -> None: ...

    # processes: the job, CMD, the proxy
    def create_job(self, limits: JobLimits) -> int: ...
    def close_job(self, job: int) -> None: ...  # KILL_ON_JOB_CLOSE: the tree dies with the handle
    def create_desktop(self, plan: DesktopPlan) -> tuple[int, str]: ...  # (handle, lpDesktop): H1, R16
    def close_desktop(self, handle: int) -> None: ...
    def deny_logon_reach(self, sid: str, pids: tuple[int, ...]) -> int: ...  # our station/desktop/pids deny sid (U3)
    def start_suspended(self, launch: Launch) -> Proc: ...  # CreateProcessWithLogonW, CREATE_SUSPENDED
    def assign(self, job: int, proc: Proc) -> None: ...
    def resume(self, proc: Proc) -> None: ...
    def terminate(self, proc: Proc) -> None: ...
    def wait(self, proc: Proc) -> int: ...
    def close_process(self, proc: Proc) -> None: ...
    def start_proxy(self, argv: tuple[str, ...]) -> Proc: ...
    def await_proxy(self, proc: Proc, timeout: float) -> None: ...  # its ready line, or WinApiError
    def system_roots(self) -> tuple[str, ...]: ...  # the machine's TLS roots as PEM (inspection's bundle, U2)
    def hold_port(self, port: int) -> int: ...  # loopback port bound, not listening (a run without proxy, U4)
    def release_port(self, handle: int) -> None: ...
    def stop_proxy(self, proc: Proc) -> None: ...

    # the links below a writable root, none followed (fsguard/windows/reparse.py: r4-run N1)
    def reparse_points(self, root: str) -> tuple[Link, ...]: ...

    # the optional transparent path (`run --transparent`, win32divert.py): elevated only
    def divert_open(self, filters: DivertFilters) -> tuple[Handle, Handle]: ...  # (NETWORK, SOCKET sniff)
    def wfp_open_dynamic(self, plan: WfpPlan, filters: tuple[WfpFilter, ...]) -> int: ...  # the permits' session
    def wfp_close_dynamic(self, session: int) -> None: ...  # BFE deletes the session's filters
    def debug_privilege(self, enable: bool) -> bool: ...  # SeDebugPrivilege in our token; was it on before
    def owner_open(self, pid: int) -> Opened: ...  # OpenProcess + TokenUser, the handle kept (0: refused)
    def job_pids(self, job: int) -> frozenset[int]: ...  # QueryInformationJobObject(BasicProcessIdList)
    def owner_release(self, handle: int) -> None: ...  # that handle closed: the pid may be reused
    def serve_resolver(self, path: TransparentPath) -> ResolverServer: ...  # 127.0.0.1:8085, before the proxy

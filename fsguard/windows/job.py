"""The job object and process-creation flags: CMD's whole tree lives and dies with sandgate.

Threats answered: a long-lived child (a `start /b` daemon, a detached process) outliving the run
and its proxy, or leaving the job. KILL_ON_JOB_CLOSE ends every process of the job when the last
handle closes, also when sandgate is killed (the kernel closes its handles); no BREAKAWAY flag
is ever set, so CREATE_BREAKAWAY_FROM_JOB fails for every descendant. CMD starts suspended and is
resumed only after it is in the job: no instruction of it runs outside. Values are winnt.h's.
"""

from __future__ import annotations

from dataclasses import dataclass

JOB_OBJECT_LIMIT_ACTIVE_PROCESS = 0x00000008
JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION = 0x00000400
JOB_OBJECT_LIMIT_BREAKAWAY_OK = 0x00000800
JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK = 0x00001000
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
#: Never set: each lets a descendant leave the job (and so the kill, the accounting, the pid set
#: the redirect loop trusts).
BREAKAWAY_FLAGS = JOB_OBJECT_LIMIT_BREAKAWAY_OK | JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK

# JOBOBJECT_BASIC_UI_RESTRICTIONS: never set (issue 28, W4). A job with UI limits cannot take a
# process that is already in a job (AssignProcessToJobObject; "Nested Jobs"), and CMD may well be:
# the Secondary Logon service makes sandgate CMD's parent process (it opens the caller with
# PROCESS_CREATE_PROCESS), and a child starts in its parent's job, which sandgate has under CI agents
# and IDE terminals. What the limits were for (clipboard, other windows, SendInput, hooks, atoms) is
# answered by the private window station and desktop (desktop.py).
JOB_OBJECT_UILIMIT_HANDLES = 0x00000001  # no USER handles of processes outside the job
JOB_OBJECT_UILIMIT_READCLIPBOARD = 0x00000002  # the clipboard may hold the user's secrets
JOB_OBJECT_UILIMIT_DESKTOP = 0x00000040  # no new desktops / switching

# Process creation (CreateProcessWithLogonW dwCreationFlags).
CREATE_SUSPENDED = 0x00000004
# CreateProcessWithLogonW acts as if CREATE_NEW_CONSOLE and CREATE_NEW_PROCESS_GROUP were always set:
# CMD has a console of its own, so no Ctrl+C/Ctrl+Break of sandgate's console reaches it; Ctrl+C ends
# the run through the sliced wait and the job (win32proc.wait_exit), never by a console event.
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_UNICODE_ENVIRONMENT = 0x00000400
CREATE_BREAKAWAY_FROM_JOB = 0x01000000  # never set (and refused by the job anyway)
LOGON_WITH_PROFILE = 0x00000001  # the sandbox user's own profile: its caches, not the real user's
# STARTUPINFOW.dwFlags: without it CreateProcessWithLogonW gives CMD a new console and its output
# never reaches the caller (W6); with it, CMD's std handles are sandgate's pipes.
STARTF_USESTDHANDLES = 0x00000100


@dataclass(frozen=True)
class JobLimits:
    limit_flags: int  # JOBOBJECT_BASIC_LIMIT_INFORMATION.LimitFlags
    ui_restrictions: int  # JOBOBJECT_BASIC_UI_RESTRICTIONS.UIRestrictionsClass
    active_process_limit: int  # 0: no limit


@dataclass(frozen=True)
class CreateProcess:
    creation_flags: int
    logon_flags: int


class JobPlanError(ValueError):
    """Flags that would let the tree leave the job or run before it is confined."""


def plan_job(max_processes: int = 0) -> JobLimits:
    flags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
    if max_processes:
        flags |= JOB_OBJECT_LIMIT_ACTIVE_PROCESS  # fork bombs; 0 leaves builds their parallelism
    return check_job(JobLimits(flags, 0, max_processes))


def check_job(limits: JobLimits) -> JobLimits:
    """Refuse a job that lets anything out: the one place every job passes before win32 sets it."""
    if limits.limit_flags & BREAKAWAY_FLAGS:
        raise JobPlanError("a breakaway flag would let descendants leave the job")
    if not limits.limit_flags & JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE:
        raise JobPlanError("without KILL_ON_JOB_CLOSE the tree outlives sandgate")
    if limits.ui_restrictions:
        raise JobPlanError("a job with UI limits cannot take CMD, which is already in a job (nested jobs)")
    return limits


def plan_create() -> CreateProcess:
    flags = CREATE_SUSPENDED | CREATE_NEW_PROCESS_GROUP | CREATE_UNICODE_ENVIRONMENT
    return CreateProcess(flags, LOGON_WITH_PROFILE)

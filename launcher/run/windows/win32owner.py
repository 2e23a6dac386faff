"""Who owns a connect, for the redirect loop (netguard/windows/owners.py decides; this only
marshals): one process's token user, read through a handle kept open, and the run's job's pid list.
Here, not in netguard, because it reuses the sweep's token reader (fsguard) and the guards do not
import each other; realapi.RealWinApi.owner_open / job_pids are its callers.

Membership comes from the job itself, not from the process: QueryInformationJobObject
(JobObjectBasicProcessIdList) on the job handle sandgate created (all access), asked at each
lookup (a list kept from earlier could name a pid that has since exited and been reused). So the
job's own processes are recognised without opening them at all.

The token user: OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION), then OpenProcessToken(TOKEN_QUERY)
+ GetTokenInformation(TokenUser) through that handle (fsguard/windows/win32sweep.token_user). The
handle is returned open and is taken before the job's list is asked: while it is open the pid is
not reused (PROCESS_INFORMATION docs: valid "until all handles to the process are closed and the
process object is freed; at this point, the identifier may be reused"), so the list's answer is
about the process whose SID was read, and the loop may keep both until it closes the handle. The
loop enables SeDebugPrivilege while it runs (win32debug.py: without it another user's process is
refused by its DACL); the System process and CSRSS are refused anyway. What cannot be read is said
so (handle 0, sid None), never guessed: owners.judge drops such a flow unless the job lists it.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_uint32, c_uint64

from fsguard.windows import win32sweep
from netguard.windows.owners import Opened
from sgbase.windows.win32 import Win32Error, check, close, fn

PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
INFO_PROCESS_ID_LIST = 3  # JOBOBJECTINFOCLASS JobObjectBasicProcessIdList
ERROR_MORE_DATA = 234
_FIRST_GUESS, _TRIES = 64, 4


class JOBOBJECT_BASIC_PROCESS_ID_LIST(Structure):  # ProcessIdList[1]: ULONG_PTR, as many as fit follow
    _fields_ = [
        ("NumberOfAssignedProcesses", c_uint32),
        ("NumberOfProcessIdsInList", c_uint32),
        ("ProcessIdList", c_uint64 * 1),
    ]


def open_owner(pid: int) -> Opened:
    """`pid`'s process handle, kept open, and its token user (handle 0: gone or refused)."""
    h = fn("OpenProcess")(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not h:
        return Opened()  # gone, or refused: nothing pinned, nothing cached
    try:
        sid: str | None = win32sweep.token_user(int(h))
    except Win32Error:
        sid = None  # the token's own DACL refused TOKEN_QUERY: unreadable
    except BaseException:
        close(int(h))
        raise
    return Opened(int(h), sid)


def job_pids(job: int) -> frozenset[int]:
    """Every process id in the job now (its child jobs' too: "all processes associated with the
    job and its child jobs", JOBOBJECT_BASIC_PROCESS_ID_LIST docs); the buffer grows until all fit."""
    room = _FIRST_GUESS
    head_size = JOBOBJECT_BASIC_PROCESS_ID_LIST.ProcessIdList.offset
    for _ in range(_TRIES):
        buf = ctypes.create_string_buffer(head_size + 8 * room)
        ok = fn("QueryInformationJobObject")(job, INFO_PROCESS_ID_LIST, buf, ctypes.sizeof(buf), None)
        err = 0 if ok else int(getattr(ctypes, "get_last_error", lambda: 0)())
        if not ok and err != ERROR_MORE_DATA:
            check("QueryInformationJobObject", False)
        head = JOBOBJECT_BASIC_PROCESS_ID_LIST.from_buffer(buf)
        if ok and head.NumberOfProcessIdsInList >= head.NumberOfAssignedProcesses:
            ids = (c_uint64 * head.NumberOfProcessIdsInList).from_buffer(buf, head_size)
            return frozenset(int(i) for i in ids)
        room = max(room * 2, int(head.NumberOfAssignedProcesses) + 16)
    raise Win32Error(ERROR_MORE_DATA, "QueryInformationJobObject: the job's process list kept growing")


def release(handle: int) -> None:
    """The pid may be reused from now on."""
    close(handle)

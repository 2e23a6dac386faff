"""Who owns a connect, for the redirect loop (netguard/windows/owners.py decides; this only
marshals): the run's job membership and the token user of one process, read through one handle.
Here, not in netguard, because it reuses the sweep's token reader (fsguard) and the guards do not
import each other; realapi.RealWinApi.owner_look is its one caller.

OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION), then IsProcessInJob against the run's job and
OpenProcessToken(TOKEN_QUERY) + GetTokenInformation(TokenUser) (fsguard/windows/win32sweep.py's
reader, the sweep's, reused) through that same handle, so both answers are one process's. The
handle is returned open: while it is, the pid is not reused (PROCESS_INFORMATION docs: valid
"until all handles to the process are closed and the process object is freed; at this point, the
identifier may be reused"), so the loop may keep the answer for that pid until it closes the handle. What cannot be read is said so
(membership "unknown", sid None), never guessed: owners.judge drops such a flow.

The loop runs elevated (WinDivert needs it). OpenProcess checks the process's security descriptor
(only "if the caller has enabled the SeDebugPrivilege privilege, the requested access is granted
regardless", OpenProcess docs; sandgate does not enable it), and the System process and CSRSS are
always refused: whichever of those an elevated
administrator cannot open is dropped (availability, never a leak; unverified on Windows).
"""

from __future__ import annotations

import ctypes

from fsguard.windows import win32sweep
from netguard.windows.owners import Held, Membership, Owner
from sgbase.windows.win32 import Win32Error, close, fn

PROCESS_QUERY_LIMITED_INFORMATION = 0x1000


def look(job: int, pid: int) -> Held:
    """The owner of `pid` as the loop sees it, with the process handle kept open (0: none)."""
    h = fn("OpenProcess")(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not h:
        return Held(Owner("unknown", None))  # gone, or refused: nothing pinned, nothing cached
    try:
        flag = ctypes.c_int32()
        member = bool(fn("IsProcessInJob")(h, job, ctypes.byref(flag)))
        membership: Membership = ("job" if flag.value else "outside") if member else "unknown"
        try:
            sid: str | None = win32sweep._token_user(int(h))
        except Win32Error:
            sid = None  # the token's own DACL refused TOKEN_QUERY: unreadable, so dropped
        return Held(Owner(membership, sid), int(h))
    except BaseException:
        close(int(h))
        raise


def release(handle: int) -> None:
    """The pid may be reused from now on."""
    close(handle)

"""The sandbox user's profile removal (`sandgate setup --remove`, M10): one binding, no decision.

Why: NetUserDel deletes the account but not its profile (C:\\Users\\sandgate-..., its registry
hive, its caches), which would stay behind, owned by a SID nobody can log on as any more. Only
DeleteProfileW removes it, elevated: https://learn.microsoft.com/en-us/windows/win32/api/userenv/nf-userenv-deleteprofilew
"""

from __future__ import annotations

import ctypes

from sgbase.windows.win32 import Win32Error, fn

#: No profile for that SID (never logged on, or already deleted): nothing to remove.
ERROR_FILE_NOT_FOUND, ERROR_NOT_FOUND = 2, 1168


def delete_profile(sid: str) -> None:
    """The profile of `sid`, its folder and registry entries; missing is fine. A profile still
    loaded (a run in progress) fails, and the caller keeps its record to try again."""
    if fn("DeleteProfileW")(sid, None, None):  # lpComputerName must be NULL since Vista
        return
    err = getattr(ctypes, "get_last_error", lambda: 0)()
    if err not in (ERROR_FILE_NOT_FOUND, ERROR_NOT_FOUND):
        raise Win32Error(err, f"DeleteProfileW failed (error {err}); is a run of the sandbox user still active?")

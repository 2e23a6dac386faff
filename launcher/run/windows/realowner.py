"""The real WinApi's owner read and take-back (sgbase.windows.api.FileApi.owner/set_owner), for the ACL
plan's owners (fsguard/windows/aclapply.take_owners, win-acl A3, r2-fixes F3): calls into
win32fileowner.py. Apart from realapi.py for its size. Never run yet.
"""

from __future__ import annotations

from fsguard.windows import win32fileowner, win32sweep
from sgbase.windows import win32
from sgbase.windows.api import WinApiError


class RealOwnerApi:
    """Mixed into RealWinApi."""

    def owner(self, path: str) -> str | None:
        try:
            return win32fileowner.owner_sid(path)
        except OSError as e:
            raise WinApiError(  # access denied: the sandbox user, its owner, may have shut the real user out
                f"cannot read the owner of {path} ({e.strerror or e}); if a sandboxed run made it, "
                f'take it back as administrator: takeown /F "{path}" /R'
            ) from None

    def set_owner(self, path: str) -> None:
        try:
            me = win32sweep.token_user(win32.fn("GetCurrentProcess")())  # sandgate's own token user
            win32fileowner.set_owner(path, me)
        except OSError as e:  # no WRITE_OWNER there (a drive-root workspace, a DACL the sandbox user rewrote)
            raise WinApiError(f"cannot take ownership of {path} ({e.strerror or e})") from None

"""The real WinApi's owner read (sgbase.windows.api.FileApi.owner), for the ACL plan's owners
(fsguard/windows/aclapply.owner_rights, win-acl A3): calls into
win32fileowner.py. Apart from realapi.py for its size. Never run yet.
"""

from __future__ import annotations

from fsguard.windows import win32fileowner
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

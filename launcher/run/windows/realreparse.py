"""The real WinApi's listing of the links below a writable root (fsguard/windows/reparse.py, r4-run N1):
one call, os.scandir as the real user, no link followed. Apart from realapi.py for its size.
"""

from __future__ import annotations

from fsguard.windows import win32reparse
from fsguard.windows.reparse import Link


class RealReparseApi:
    """Mixed into RealWinApi."""

    def reparse_points(self, root: str) -> tuple[Link, ...]:
        return win32reparse.walk(root)

"""What every Windows effect shares: the one-line error, the started-process record, and the file
effects both the launch and fsguard's ACL code take (`FileApi`).

Why here, below both guards: fsguard/windows/aclapply.py writes its journal and DACLs through these
methods, and the launch's whole `WinApi` (launcher/run/windows/winapi.py) extends them; a guard must
not import the launcher to name the seam it is handed. Every method raises WinApiError, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class WinApiError(Exception):
    """One OS effect failed; the text is one line naming what and, where known, what to do."""


@dataclass(frozen=True)
class Proc:
    """A started process: its id and the handles the real API holds for it (opaque here)."""

    pid: int
    handle: int
    thread: int = 0


class FileApi(Protocol):
    """Who and where, and the file effects (the journal, the sealed password, placeholders; DACLs)."""

    # who and where
    def is_admin(self) -> bool: ...
    def current_user_sid(self) -> str: ...
    def session_user_sid(self) -> str | None: ...  # this terminal session's user (None: no user, M13)
    def local_appdata(self) -> str: ...
    def home(self) -> str: ...
    def cwd(self) -> str: ...
    def environ(self) -> Mapping[str, str]: ...
    def python(self) -> str: ...
    def code_dirs(self) -> tuple[str, ...]: ...  # folders sandgate's own code loads from (r2-ci C3)

    # files: the journal, the sealed password, placeholders; DACLs
    def exists(self, path: str) -> bool: ...
    def read_file(self, path: str) -> bytes | None: ...
    def write_file(self, path: str, data: bytes) -> None: ...
    def append_line(self, path: str, line: str) -> None: ...  # durable (flushed) before it returns
    def remove_file(self, path: str) -> None: ...  # missing is fine
    def list_dir(self, path: str) -> list[str]: ...  # names; missing directory: []
    def make_dir(self, path: str) -> None: ...  # one directory (its parent exists): nothing unjournalled
    def remove_empty_dir(self, path: str) -> bool: ...  # False: not empty or gone (left alone)
    def dacl(self, path: str) -> str | None: ...  # SDDL "D:..."; None: the path does not exist
    def set_dacl(self, path: str, sddl: str, walk: bool = True) -> None: ...  # walk=False: this object only
    def owner(self, path: str) -> str | None: ...  # the owner's SID; None: the path does not exist

    # processes: whose journal is a live run's (aclapply.replay_left)
    def pid_alive(self, pid: int) -> bool: ...
    def own_pid(self) -> int: ...

"""How CMD is started as the sandbox user: the one record the backend hands the WinApi, and what a
failed start means in words a first Windows user can act on (pure).

Why a record: every field answers a documented CreateProcessWithLogonW behaviour that broke the
first design (issue 28): `application` (W5: without lpApplicationName the Secondary Logon service
searches its own PATH), `desktop` (H1: NULL shares the real user's desktop), `stdio` (W6: without
STARTF_USESTDHANDLES the command gets a new console and its output is lost), `env` (W1/W7: the
block Windows reads, profile variables the sandbox user's own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    user: str  # the sandbox user's account name
    password: str
    application: str  # lpApplicationName: the resolved executable, full path (exesearch.py)
    cmdline: str  # lpCommandLine, already quoted for `application`
    argv: tuple[str, ...]  # what the user typed (for messages and records)
    cwd: str
    env: Mapping[str, str]  # the whole block (envblock.build checks it)
    desktop: str  # lpDesktop, "winstation\\desktop": the run's private one (desktop.py)
    stdio: bool = True  # STARTF_USESTDHANDLES with sandgate's pipes: CMD's output reaches the caller


# Win32 error codes CreateProcessWithLogonW returns when the machine, not the command, is the
# problem (M14): each names what to do.
ERROR_FILE_NOT_FOUND, ERROR_ACCESS_DENIED, ERROR_SERVICE_DISABLED = 2, 5, 1058
ERROR_SERVICE_NOT_ACTIVE, ERROR_LOGON_FAILURE, ERROR_LOGON_TYPE_NOT_GRANTED = 1062, 1326, 1385
ERROR_ACCOUNT_DISABLED, ERROR_PASSWORD_EXPIRED = 1331, 1330

HINTS: dict[int, str] = {
    ERROR_SERVICE_DISABLED: "the Secondary Logon service (seclogon) is disabled; "
    "enable it (Set-Service seclogon -StartupType Manual) as administrator",
    ERROR_SERVICE_NOT_ACTIVE: "the Secondary Logon service (seclogon) is not running; start it (Start-Service seclogon)",
    ERROR_LOGON_TYPE_NOT_GRANTED: "the sandbox user may not log on locally on this machine; "
    "grant it 'Allow log on locally' (secpol.msc, or a domain policy) or run 'sandgate setup' again",
    ERROR_LOGON_FAILURE: "the sandbox user's password does not match; run 'sandgate setup' again as administrator",
    ERROR_ACCOUNT_DISABLED: "the sandbox user is disabled; run 'sandgate setup' again as administrator",
    ERROR_PASSWORD_EXPIRED: "the sandbox user's password expired; run 'sandgate setup' again as administrator",
    ERROR_FILE_NOT_FOUND: "the command was not found",
    ERROR_ACCESS_DENIED: "the sandbox user may not run it (is it under your own profile? "
    "install the tool for all users, e.g. under C:\\Program Files)",
}


def hint(code: int, what: str) -> str:
    """One line for a failed start: what failed, and what to do when the cause is known."""
    known = HINTS.get(code)
    return f"cannot start {what}: {known}" if known else f"cannot start {what} (Windows error {code})"

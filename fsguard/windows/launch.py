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


#: CreateProcessWithLogonW, lpCommandLine: "The maximum length of this string is 1024 characters"
#: (not CreateProcess' 32767; dotnet/core#5152 saw error 87 past about 2,000 through this call). This
#: many characters and the terminating NUL fit that bound.
MAX_CMDLINE = 1023
CPWL = "https://learn.microsoft.com/windows/win32/api/winbase/nf-winbase-createprocesswithlogonw"

# Win32 error codes CreateProcessWithLogonW returns when the machine, not the command, is the
# problem (M14): each names what to do.
ERROR_FILE_NOT_FOUND, ERROR_ACCESS_DENIED, ERROR_SERVICE_DISABLED = 2, 5, 1058
ERROR_SERVICE_NOT_ACTIVE, ERROR_LOGON_FAILURE, ERROR_LOGON_TYPE_NOT_GRANTED = 1062, 1326, 1385
ERROR_ACCOUNT_DISABLED, ERROR_PASSWORD_EXPIRED = 1331, 1330
ERROR_INVALID_PARAMETER, ERROR_DIRECTORY, ERROR_ACCOUNT_RESTRICTION, ERROR_ACCOUNT_LOCKED_OUT = 87, 267, 1327, 1909
ERROR_PATH_NOT_FOUND = 3
#: The exit status of a process that could not initialise user32/kernel32, e.g. with no access to its
#: window station or desktop (KB165194); CreateProcessWithLogonW itself succeeded.
STATUS_DLL_INIT_FAILED = 0xC0000142

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
    ERROR_ACCOUNT_LOCKED_OUT: "the sandbox user is locked out (too many failed logons); "
    "unlock it (lusrmgr.msc) or run 'sandgate setup' again as administrator",
    ERROR_ACCOUNT_RESTRICTION: "a policy restricts the sandbox user's logon (logon hours, workstations); "
    "lift it for that user or run 'sandgate setup' again as administrator",
    ERROR_PATH_NOT_FOUND: "the sandbox user cannot see that path "
    "(a mapped network drive letter is not visible to another logon: use a local folder)",
    ERROR_DIRECTORY: "the sandbox user cannot use the working directory "
    "(a mapped network drive is not visible to another logon: run from a local folder)",
    ERROR_INVALID_PARAMETER: f"Windows refused the start; a command line over {MAX_CMDLINE} characters "
    "is one cause (CreateProcessWithLogonW's limit): shorten it, e.g. with a script or a response file",
}


def hint(code: int, what: str) -> str:
    """One line for a failed start: what failed, and what to do when the cause is known."""
    known = HINTS.get(code)
    return f"cannot start {what}: {known}" if known else f"cannot start {what} (Windows error {code})"


class LaunchError(ValueError):
    """A start Windows would refuse or misread; the text says what to do."""


def check_cmdline(cmdline: str, what: str) -> str:
    """`cmdline` if CreateProcessWithLogonW may take it (counted in UTF-16 units, as Windows counts)."""
    units = len(cmdline.encode("utf-16-le", "surrogatepass")) // 2
    if units > MAX_CMDLINE:
        raise LaunchError(
            f"cannot start {what}: its command line is {units} characters and Windows starts a command as "
            f"another user with at most {MAX_CMDLINE} ({CPWL}); pass the long part in a file "
            "(a script, a response file) instead"
        )
    return cmdline


def exit_note(code: int) -> str | None:
    """What an exit status says about the start itself, or None: the status is the command's own."""
    if code != STATUS_DLL_INIT_FAILED:
        return None
    return (
        "the command ended with 0xC0000142 (a DLL failed to initialise): usually no access to its window "
        "station or desktop; the run's private desktop grants the sandbox user, so report it with your "
        "Windows version"
    )

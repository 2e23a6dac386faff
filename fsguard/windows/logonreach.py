"""What CMD could reach through the real user's logon SID, denied to the sandbox SID (pure).

Threat (session 38, r2-user U3; win-proc R9): CreateProcessWithLogonW "uses the logon SID in the
caller token, and the token for the "LocalSystem" account does not contain this SID" (its Remarks),
and since Windows XP it no longer adds the new user to the caller's window station and desktop,
yet runas'd programs reach WinSta0\\Default: so the token the Secondary Logon service builds very
likely holds the *real user's* logon SID. Whatever grants that SID is then CMD's: the interactive
window station and desktop (their DACLs grant the logon SID: SendInput into the user's terminal,
hooks, the clipboard), and objects made under the real user's default DACL, which commonly grants
the logon SID read and execute (for a process: PROCESS_VM_READ | PROCESS_QUERY_INFORMATION),
sandgate's own process (the real user's unfiltered environment) and the proxy child (the CA key,
brokered credentials) among them.

Answer: an explicit deny ACE for the sandbox SID, which a canonical DACL puts before every allow
(an explicit deny "is evaluated before" the allows: how-dacls-control-access-to-an-object), on
sandgate's own window station and desktop and on sandgate's and the proxy's processes, before CMD
starts. Idempotent; never removed from the station and desktop (they deny only the sandbox user and
end with the logon session). The real user's *other* processes cannot be fixed from here:
`sandgate verify`'s `logon_sid` row says whether CMD can read them (selftest/windows/probelogon.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# winuser.h / winnt.h: each object's own rights with STANDARD_RIGHTS_REQUIRED (DELETE, READ_CONTROL,
# WRITE_DAC, WRITE_OWNER): everything. PROCESS_ALL_ACCESS (0x1FFFFF) adds SYNCHRONIZE.
STANDARD_RIGHTS_REQUIRED = 0x000F0000
DENY_STATION = 0x037F | STANDARD_RIGHTS_REQUIRED
DENY_DESKTOP = 0x01FF | STANDARD_RIGHTS_REQUIRED
DENY_PROCESS = 0x001FFFFF


@dataclass(frozen=True)
class ReachDenial:
    """The three deny ACEs for one sandbox SID (SDDL, not inheritable: only the object itself)."""

    sandbox_sid: str

    def __post_init__(self) -> None:
        sid = self.sandbox_sid
        if not sid.startswith("S-1-") or not all(p.isdigit() for p in sid[4:].split("-")):
            raise ValueError(f"not a SID: {sid!r}")

    @property
    def station(self) -> str:
        return f"(D;;{DENY_STATION:#x};;;{self.sandbox_sid})"

    @property
    def desktop(self) -> str:
        return f"(D;;{DENY_DESKTOP:#x};;;{self.sandbox_sid})"

    @property
    def process(self) -> str:
        return f"(D;;{DENY_PROCESS:#x};;;{self.sandbox_sid})"

"""The run's private window station and desktop (issue 28, H1), planned purely.

Threat: with lpDesktop NULL, CreateProcessWithLogonW puts CMD on the real user's desktop
(WinSta0\\Default) and grants the sandbox user access to it: SendInput into the user's terminal,
low-level keyboard hooks, window messages, the clipboard and global atoms are all shared there,
and job UI limits cannot be used (they forbid nested jobs, job.py) and never stopped SendInput or
hooks anyway. A window station of its own is a separate clipboard, atom table and set of desktops;
it is not the interactive one, so it gets no input and can send none to the user's windows.

Naming (session 38, R16): CreateWindowStationW says "Only members of the Administrators group are
allowed to specify a name. If lpwinsta is NULL or an empty string, the system forms a window station
name using the logon session identifier". So an unelevated run may get the logon session's station,
which another program's sandbox (Chromium's alternate window station) can already hold; then the
DACL below is not applied to it, and only `station_grant` is added. The desktop is always the run's
own (its name is per run), with this DACL.
"""

from __future__ import annotations

from dataclasses import dataclass

# winuser.h access masks: everything on the run's own objects (it creates windows, its console).
WINSTA_ALL_ACCESS = 0x037F
DESKTOP_ALL_ACCESS = 0x01FF
GENERIC_ALL = 0x10000000


@dataclass(frozen=True)
class DesktopPlan:
    station: str  # CreateWindowStationW's name (elevated; unelevated Windows names it, see above)
    desktop: str  # CreateDesktopW's name, per run: unique also inside a shared station
    sddl: str  # both objects' security descriptor: the real user, SYSTEM, the sandbox SID
    sandbox_sid: str = ""

    @property
    def station_grant(self) -> str:
        """The ACE added to a station that already existed: what a process needs on its window
        station (WINSTA_ALL_ACCESS), not GA, whose WRITE_DAC/DELETE would let CMD lock out its owner."""
        return f"(A;;{WINSTA_ALL_ACCESS:#x};;;{self.sandbox_sid})"

    @property
    def lp_desktop(self) -> str:
        """STARTUPINFOW.lpDesktop: "station\\desktop" (NULL or empty would be the user's own)."""
        return f"{self.station}\\{self.desktop}"


def plan_desktop(task: str, real_sid: str, sandbox_sid: str) -> DesktopPlan:
    """Named per run (two concurrent runs never share one); a protected DACL, so nothing inherited
    from the session's defaults lets another process of the session in."""
    for sid in (real_sid, sandbox_sid):
        if not sid.startswith("S-1-") or not all(p.isdigit() for p in sid[4:].split("-")):
            raise ValueError(f"not a SID: {sid!r}")
    if not task or not all(c.isalnum() or c == "-" for c in task):
        raise ValueError(f"not a task id: {task!r}")  # a `\\` would split lpDesktop elsewhere
    name = f"sandgate-{task}"
    sddl = f"D:P(A;;GA;;;SY)(A;;GA;;;{real_sid})(A;;GA;;;{sandbox_sid})"
    return DesktopPlan(name, name, sddl, sandbox_sid)

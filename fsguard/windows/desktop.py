"""The run's private window station and desktop (issue 28, H1), planned purely.

Threat: with lpDesktop NULL, CreateProcessWithLogonW puts CMD on the real user's desktop
(WinSta0\\Default) and grants the sandbox user access to it: SendInput into the user's terminal,
low-level keyboard hooks, window messages, the clipboard and global atoms are all shared there,
and job UI limits cannot be used (they forbid nested jobs, job.py) and never stopped SendInput or
hooks anyway. A window station of its own is a separate clipboard, atom table and set of desktops;
it is not the interactive one, so it gets no input and can send none to the user's windows.
"""

from __future__ import annotations

from dataclasses import dataclass

# winuser.h access masks: everything on the run's own objects (it creates windows, its console).
WINSTA_ALL_ACCESS = 0x037F
DESKTOP_ALL_ACCESS = 0x01FF
GENERIC_ALL = 0x10000000


@dataclass(frozen=True)
class DesktopPlan:
    station: str  # CreateWindowStationW's name
    desktop: str  # CreateDesktopW's name, inside `station`
    sddl: str  # both objects' security descriptor: the real user, SYSTEM, the sandbox SID

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
    name = f"sandgate-{task}"
    sddl = f"D:P(A;;GA;;;SY)(A;;GA;;;{real_sid})(A;;GA;;;{sandbox_sid})"
    return DesktopPlan(name, "default", sddl)

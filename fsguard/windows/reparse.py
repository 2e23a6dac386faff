r"""Directory links inside the writable roots that lead out of them: the run is refused (r4-run N1).

Threat: the run's grant on a writable root is an inheritable ACE, and SetNamedSecurityInfoW "imposes the
current inheritance model on the ACLs of all objects in the hierarchy below the target object"
(learn.microsoft.com/windows/win32/secauthz/automatic-propagation-of-inheritable-aces). Whether that walk
enumerates through a directory junction is not documented. The sandbox user may make junctions in the
workspace (a mount point needs no privilege and no access to its target), so a junction planted in one run
(`proj\x` -> `C:\Users\me`, or the Startup folder), or a real user's own `npm link`, would hand the next
run's Modify ACE to whatever it points at, if the walk follows it. So the links below every writable root
are listed first (the walk never follows one) and one that leads outside every root refuses the run;
links that stay inside (npm workspaces) are fine. Pure: the listing is win32reparse.py's, through the WinApi.
"""

from __future__ import annotations

import ntpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fsguard.windows import winpath


@dataclass(frozen=True)
class Link:
    path: str  # the junction or directory symlink, below a writable root
    target: str  # as Windows reports it (os.readlink: `\\?\C:\...`, or relative); "" when unreadable


def resolved(link: Link) -> str | None:
    """The link's target as a plain drive path; None for a volume, UNC or unreadable target."""
    target = link.target
    nt = target.startswith(("\\\\?\\", "\\??\\"))  # an NT name: absolute, never relative
    target = target[4:] if nt else target
    if not target or target.startswith("\\\\") or target.upper().startswith("UNC\\"):
        return None
    if not nt and not ntpath.splitdrive(target)[0]:  # relative (a symlink): from the folder holding it
        target = ntpath.join(ntpath.dirname(link.path), target)
    drive = ntpath.splitdrive(target)[0]
    if len(drive) != 2 or drive[1] != ":":
        return None  # `Volume{guid}\` (a mounted volume) or anything else not a drive path
    return ntpath.normpath(target)


def _inside(path: str, root: str) -> bool:
    p, r = winpath.key(path).rstrip("\\"), winpath.key(root).rstrip("\\")
    return p == r or p.startswith(r + "\\")


def escaping(links: Iterable[Link], roots: Iterable[str]) -> Link | None:
    """The first link whose target is not inside one of `roots` (an unreadable target counts)."""
    kept = tuple(roots)
    for link in links:
        target = resolved(link)
        if target is None or not any(_inside(target, r) for r in kept):
            return link
    return None


def check(walk: Callable[[str], Iterable[Link]], roots: tuple[str, ...]) -> str | None:
    """The one refusal line for the run's writable `roots`, or None when no link leads out of them."""
    bad = escaping((link for r in roots for link in walk(r)), roots)
    if bad is None:
        return None
    return (
        f"{bad.path} is a link to {bad.target or 'an unreadable target'}, outside the folders the sandbox may "
        "write; the run's grant could follow it there: remove the link (rmdir, it keeps the target) or run "
        "from a folder without it"
    )

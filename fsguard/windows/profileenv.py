"""The sandbox user's own profile in CMD's environment (issue 28, W7), pure.

Why: the filtered environment is the real user's, so USERPROFILE, APPDATA, LOCALAPPDATA, TEMP...
point into a profile the sandbox user cannot read (profile ACLs): git dies on an unreadable
global config, pip and npm on an unwritable cache and TEMP. When lpEnvironment is given, Windows
fills in nothing, so the block must carry the sandbox user's own values.
"""

from __future__ import annotations

import ntpath
from collections.abc import Mapping

#: Variables Windows derives from the logged-on user (set from the sandbox user's profile).
PROFILE_VARS = ("USERPROFILE", "HOMEDRIVE", "HOMEPATH", "APPDATA", "LOCALAPPDATA", "TEMP", "TMP", "USERNAME")
#: The real user's identity and roaming locations: not the sandbox user's, so dropped.
DROPPED = ("HOME", "HOMESHARE", "USERDOMAIN_ROAMINGPROFILE", "ONEDRIVE", "ONEDRIVECONSUMER", "ONEDRIVECOMMERCIAL")


def profile_dir(real_home: str, user: str) -> str:
    """Where LOGON_WITH_PROFILE puts a new local user's profile: beside the real user's."""
    return ntpath.join(ntpath.dirname(real_home.rstrip("\\/")), user)


def profile_env(profile: str, user: str) -> tuple[tuple[str, str], ...]:
    drive, rest = ntpath.splitdrive(profile)
    local = ntpath.join(profile, "AppData", "Local")
    temp = ntpath.join(local, "Temp")
    values = (profile, drive, rest or "\\", ntpath.join(profile, "AppData", "Roaming"), local, temp, temp, user)
    return tuple(zip(PROFILE_VARS, values, strict=True))


def _under(value: str, home: str) -> bool:
    """A single path inside `home` (a `;` list such as PATH is kept whole: its other entries matter)."""
    if ";" in value:
        return False
    v, h = ntpath.normcase(value.strip().rstrip("\\/")), ntpath.normcase(home.rstrip("\\/"))
    return v == h or v.startswith(h + "\\")


def scrub(env: Mapping[str, str], real_home: str, keep_under: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment without what names the real user's profile: its identity variables, and any
    variable whose value is a path inside it (CARGO_HOME, XDG_CONFIG_HOME...: unreadable there), unless
    that path is inside one of `keep_under` (the run's workspace, usually itself in the profile: its
    VIRTUAL_ENV or CARGO_TARGET_DIR is the sandbox user's to use)."""
    gone = {n.casefold() for n in (*PROFILE_VARS, *DROPPED)}

    def unreadable(value: str) -> bool:
        return _under(value, real_home) and not any(_under(value, keep) for keep in keep_under)

    return {k: v for k, v in env.items() if k.casefold() not in gone and not unreadable(v)}

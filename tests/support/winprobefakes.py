"""What each Windows probe body would see on the fake machine: one simulation per probe name.

The end-to-end test (tests/unit/test_windows_e2e_fake.py) runs `sandgate verify` with every body
that has a simulation here; a body without one is listed by `unsimulated()`. Each part of issue
28 adds its bodies' simulations (win-acl: probeacl.py's, win-net: probenet.py's), modelled on
the contract the fake enforces, never on what the judge wants to read.
"""

from __future__ import annotations

import json
import ntpath
from collections.abc import Callable
from typing import Any

from fsguard.windows.launch import Launch
from selftest.windows import allbodies, probebody
from tests.support import winkernel

Simulation = Callable[[Any, Launch, str], dict[str, Any] | None]  # (FakeWinApi, launch, desktop) -> RESULT


def private_desktop(api: Any, launch: Launch, desk: str) -> dict[str, Any]:
    """The desktop CMD was put on (winkernel.check_desktop): the user's, or a private one."""
    shared = desk == winkernel.USER_DESKTOP
    # WinSta0 grants the real user's logon SID, which CMD's token holds (probelogon's model): refused
    # with ERROR_ACCESS_DENIED only where the run denied the sandbox SID there (winfake.deny_logon_reach)
    opens = shared or api.m.users[launch.user][0] not in api.reach_denied.get("WinSta0", set())
    return {
        "station": desk.split("\\")[0],
        "desktop": desk.split("\\")[-1],
        "winsta0": opens,
        "winsta0_error": 0 if opens else 5,
        "own_window": True,
        "sendinput": 2 if shared else 0,
    }


SIMULATIONS: dict[str, Simulation] = {"private_desktop": private_desktop}


def acl_probe(api: Any, launch: Launch, desk: str) -> dict[str, Any] | None:
    """probeacl.py's rows (win-acl): aclprobes' own bodies over the NTFS model of the machine,
    as the sandbox user, against the DACLs the run applied (tests/support/ntfsmodel.py)."""
    from tests.support import ntfsmodel

    return ntfsmodel.acl_probe_result(api.m, api.m.users[launch.user][0], launch.argv, launch.cwd)


SIMULATIONS |= dict.fromkeys(("git_rename", "alternate_data_stream", "case_variant", "short_name"), acl_probe)


def logon_sid(api: Any, launch: Launch, desk: str) -> dict[str, Any]:
    """probelogon.py (r2-user U3): CMD's token holds the real user's logon SID (winfake.deny_logon_reach's
    model), so sandgate's process and WinSta0\\Default open unless the sandbox SID is denied there."""
    from selftest.windows import probelogon

    sid = api.m.users[launch.user][0]
    pid = json.loads(api.m.files[ntpath.join(launch.cwd, probelogon.PID_FILE)])["pid"]

    def step(obj: str) -> dict[str, Any]:
        denied = sid in api.reach_denied.get(obj, set())
        return {"ok": not denied, "error": 5 if denied else 0}

    mine, station = {"ok": True, "error": 0}, step("WinSta0")
    default = step("WinSta0\\Default") if station["ok"] else None
    got = {"real_pid": pid, "own_pid": 1, "own_process": mine, "real_process": step(f"pid:{pid}")}
    return got | {"own_desktop": mine, "own_attach": mine, "winsta0": station, "default": default}


SIMULATIONS["logon_sid"] = logon_sid


def program(api: Any, launch: Launch, desk: str) -> int:
    """FakeWinApi.program: run the simulation of the probe named last in argv; write its RESULT.
    `python -I FILE NAME`: python exits 2 ("can't open file") when FILE is not there."""
    if len(launch.argv) > 2 and launch.argv[1] == "-I" and launch.argv[2] not in api.m.files:
        return 2
    sim = SIMULATIONS.get(launch.argv[-1])
    got = sim(api, launch, desk) if sim else None
    if got is not None:
        api.m.files[ntpath.join(launch.cwd, probebody.RESULT)] = json.dumps(got).encode()
    return 0


def simulated() -> list[str]:
    return [b.name for b in allbodies.bodies() if b.name in SIMULATIONS]


def unsimulated() -> list[str]:
    return [b.name for b in allbodies.bodies() if b.name not in SIMULATIONS]

r"""Which machine-wide security descriptors setup edits to deny the sandbox user WMI process
creation and out-of-process COM (issue 28, H3), purely: the plan and the SDDL edit and undo.

Threat: `Win32_Process.Create` (WmiPrvSE) and a COM server started out of process run outside
the run's job and outlive it; a COM class configured "RunAs Interactive User" runs as the real
user, outside every sandgate boundary. Both services check a security descriptor first:

- WMI namespaces `root` and `root\cimv2`: an explicit deny of Enable Account, Execute Methods and
  Remote Enable (WBEM_ENABLE | WBEM_METHOD_EXECUTE | WBEM_REMOTE_ACCESS) for the sandbox SID, with
  CONTAINER_INHERIT so child namespaces get it too. On `root\cimv2` as well as `root`: canonical
  order puts an explicit allow on the child before an inherited deny, so the inherited one alone
  could lose. https://learn.microsoft.com/en-us/windows/win32/wmisdk/namespace-access-rights-constants
  https://learn.microsoft.com/en-us/windows/win32/wmisdk/--systemsecurity-setsd
- DCOM's machine-wide limits, HKLM\SOFTWARE\Microsoft\Ole `MachineLaunchRestriction` (launch and
  activation) and `MachineAccessRestriction` (calls): "principals not given permissions here
  cannot obtain them", so an explicit deny there beats every per-class LaunchPermission.
  https://learn.microsoft.com/en-us/windows/win32/com/machinelaunchrestriction
  https://learn.microsoft.com/en-us/windows/win32/com/machineaccessrestriction

Each edit is one deny ACE added in canonical order (sddl.with_ace: denies first) and, at
`setup --remove`, exactly that ACE taken out again; everyone else's ACEs are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsguard.windows import sddl

WBEM_ENABLE, WBEM_METHOD_EXECUTE, WBEM_REMOTE_ACCESS = 0x1, 0x2, 0x20
WMI_DENIED = WBEM_ENABLE | WBEM_METHOD_EXECUTE | WBEM_REMOTE_ACCESS
#: COM_RIGHTS_* (objbase.h): EXECUTE 1, EXECUTE_LOCAL 2, EXECUTE_REMOTE 4, ACTIVATE_LOCAL 8, ACTIVATE_REMOTE 16.
COM_RIGHTS_EXECUTE, COM_RIGHTS_EXECUTE_LOCAL, COM_RIGHTS_EXECUTE_REMOTE = 0x1, 0x2, 0x4
COM_RIGHTS_ACTIVATE_LOCAL, COM_RIGHTS_ACTIVATE_REMOTE = 0x8, 0x10
COM_LAUNCH_DENIED = 0x1F  # every launch and activation right, local and remote
COM_ACCESS_DENIED = COM_RIGHTS_EXECUTE | COM_RIGHTS_EXECUTE_LOCAL | COM_RIGHTS_EXECUTE_REMOTE

WMI_NAMESPACES = ("root", "root\\cimv2")
OLE_KEY = r"HKLM\SOFTWARE\Microsoft\Ole"
OLE_VALUES = ("MachineLaunchRestriction", "MachineAccessRestriction")


@dataclass(frozen=True)
class SdEdit:
    """One deny ACE for one security descriptor: `kind` "wmi" (a namespace) or "com" (an Ole value)."""

    kind: str
    target: str
    ace: str


def plan(sid: str) -> tuple[SdEdit, ...]:
    """The edits for this sandbox SID, in the order setup applies them (remove: reversed)."""
    wmi = tuple(SdEdit("wmi", ns, f"(D;CI;{WMI_DENIED:#x};;;{sid})") for ns in WMI_NAMESPACES)
    com = (
        SdEdit("com", OLE_VALUES[0], f"(D;;{COM_LAUNCH_DENIED:#x};;;{sid})"),
        SdEdit("com", OLE_VALUES[1], f"(D;;{COM_ACCESS_DENIED:#x};;;{sid})"),
    )
    return wmi + com


def split(sd: str) -> tuple[str, str, str]:
    """`O:BAG:BAD:(...)S:(...)` -> ("O:BAG:BA", "D:(...)", "S:(...)"): the DACL edited alone."""
    at = sd.find("D:")
    if at < 0:
        raise sddl.SddlError("security descriptor without a DACL")
    end = _sacl_start(sd, at)
    return sd[:at], sd[at:end], sd[end:]


def _sacl_start(sd: str, at: int) -> int:
    depth = 0
    for i in range(at, len(sd)):
        depth += sd[i] == "("
        depth -= sd[i] == ")"
        if depth == 0 and sd.startswith("S:", i):
            return i
    return len(sd)


def applied(sd: str, edit: SdEdit) -> str:
    """`sd` with the deny ACE in canonical place; unchanged when it is already there (idempotent)."""
    head, dacl, tail = split(sd)
    return head + sddl.with_ace(dacl, edit.ace) + tail


def com_format_ok(sd: str) -> bool:
    """Whether a DCOM limit can take our ACE. COM ACLs come in two formats that "must not mix
    within a single ACL": COM_RIGHTS_EXECUTE alone (before XP SP2) or EXECUTE with LOCAL/REMOTE
    bits, ours; a mixed ACL is an invalid descriptor, and in a machine-wide limit that breaks every
    COM server. https://learn.microsoft.com/en-us/windows/win32/com/access-control-lists-for-com"""
    _, dacl, _ = split(sd)
    return all(sddl.parse_ace(a).mask & COM_LAUNCH_DENIED != COM_RIGHTS_EXECUTE for a in sddl.split_dacl(dacl)[1])


def has(sd: str, edit: SdEdit) -> bool:
    _, dacl, _ = split(sd)
    want = sddl.parse_ace(edit.ace)
    return any(sddl.parse_ace(a) == want for a in sddl.split_dacl(dacl)[1])


def undone(sd: str, edit: SdEdit) -> str:
    """`sd` without exactly our ACE (by meaning: Windows may respell it); nobody else's touched."""
    head, dacl, tail = split(sd)
    flags, aces = sddl.split_dacl(dacl)
    want = sddl.parse_ace(edit.ace)
    return head + flags + "".join(a for a in aces if sddl.parse_ace(a) != want) + tail

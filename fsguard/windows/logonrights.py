"""Which logon rights the sandbox user is denied at setup (issue 28, H3), purely.

Threat: work the sandbox user hands to a service runs outside the job and outlives the run. A
scheduled task registered with a stored password or as S4U ("do not store password") is started
by the Task Scheduler service through a *batch* logon; a service it could get installed, through
a *service* logon; its own SMB/WMI/RPC connections to this machine, through a *network* logon;
Remote Desktop, through a *remote interactive* one. Each is explicitly denied (a deny right beats
any grant, also through groups: https://learn.microsoft.com/en-us/windows/win32/secauthz/account-rights-constants).
Never denied: interactive logon, which every run's CreateProcessWithLogonW needs (M14).
"""

from __future__ import annotations

DENIED: tuple[str, ...] = (
    "SeDenyBatchLogonRight",  # scheduled tasks with a password or S4U (TASK_LOGON_PASSWORD/_S4U)
    "SeDenyServiceLogonRight",  # a service configured to run as the sandbox user
    "SeDenyNetworkLogonRight",  # \\localhost\share, remote WMI/DCOM/WinRM to this machine as itself
    "SeDenyRemoteInteractiveLogonRight",  # Remote Desktop as the sandbox user
)
#: What a run needs: denying it would refuse every `sandgate run` (ERROR_LOGON_TYPE_NOT_GRANTED).
REQUIRED_FOR_RUNS = "SeDenyInteractiveLogonRight"
assert REQUIRED_FOR_RUNS not in DENIED

r"""`sandgate verify` on Windows: the escapes that leave the job or the sandbox user's filters
through a service (issue 28, H3 and H4). Bodies only; each runs inside a real sandbox.

- scheduled_task: a task the sandbox user registers runs later in the Task Scheduler service,
  outside the job, after the run. Blocked: the task running (setup denies the sandbox user the
  batch logon right that S4U and stored-password tasks need; interactive-only tasks need a
  session it has not got). Permitted, in the same run: a child process of its own.
- wmi_process: Win32_Process.Create hands the command to WmiPrvSE, which starts it as the caller
  but outside the caller's job; an out-of-process COM server (ShellWindows: Explorer, as the real
  user) likewise. Blocked: both refused with access denied (setup's deny ACEs, servicedeny.py);
  a process outside the run's job fails the row (the probe kills any it made; "the job" is the
  probe's own immediate job, by its pid list: every process here is in some job), and so does a refusal
  for another reason (it says nothing about the denies). Permitted: its own child, which IS in
  the job (so the in-job check itself is shown to work).
- smb_webdav: the SMB redirector (kernel, SYSTEM) and the WebClient service (LOCAL SERVICE) open
  the TCP connections for `\\host\share` and `\\host@port\DavWWWRoot`, so the sandbox user's WFP
  filters and firewall rules never see them (a known gap, docs/windows.md). The body reports what
  the attempt returned and whether WebClient runs; judge_smb says what counts as refused. Its target is TEST-NET-2
  (198.51.100.7, never routed), so a leak reaches no one; the probe cannot see the SYN itself.
"""

from __future__ import annotations

from typing import Any

from selftest.windows.probebody import RESULT, ProbeBody, Verdict

_COMMON = f"""
import ctypes, json, os, subprocess, sys, time, uuid
def run(*a, timeout=60):
    try:  # schtasks/powershell/sc write the OEM code page, text=True reads the ANSI one: never strict;
        # backslashreplace, not replace: U+FFFD in a row's detail would not print to a cp1252 pipe
        r = subprocess.run(a, capture_output=True, text=True, errors="backslashreplace", timeout=timeout)
        return [r.returncode, (r.stdout + r.stderr)[-300:]]
    except (OSError, subprocess.TimeoutExpired) as e:
        return [-1, str(e)[-300:]]
def done(result):
    json.dump(result, open({RESULT!r}, "w"))
"""

TASK = (
    _COMMON
    + r"""
name, marker = "sandgate-probe-" + uuid.uuid4().hex[:8], os.path.abspath("sandgate-task-marker")
control = run("cmd", "/c", "exit", "0")
create = run("schtasks", "/create", "/tn", name, "/tr", f'cmd /c echo x > "{marker}"',
             "/sc", "once", "/st", "23:59", "/f")
started = None
if create[0] == 0:
    started = run("schtasks", "/run", "/tn", name)
    for _ in range(10):
        if os.path.exists(marker):
            break
        time.sleep(0.5)
    run("schtasks", "/delete", "/tn", name, "/f")
escaped = os.path.exists(marker)
if escaped:
    os.remove(marker)
done({"control": control[0], "create": create, "run": started, "escaped": escaped})
"""
)

WMI = (
    _COMMON
    + r"""
k = ctypes.WinDLL("kernel32", use_last_error=True)
k.OpenProcess.restype = ctypes.c_void_p
class PIDS(ctypes.Structure):  # JOBOBJECT_BASIC_PROCESS_ID_LIST, room for 1024 ids
    _fields_ = [("assigned", ctypes.c_uint32), ("listed", ctypes.c_uint32), ("ids", ctypes.c_size_t * 1024)]
def own_job():
    # NULL: "the immediate job of the calling process" (the run's job, nested in Secondary Logon's);
    # not IsProcessInJob(h, NULL), which says "in ANY job" (WmiPrvSE's own job would pass it).
    got = PIDS()
    ok = k.QueryInformationJobObject(None, 3, ctypes.byref(got), ctypes.sizeof(got), None)
    return set(got.ids[:got.listed]) if ok else set()
def in_job(pid):
    h = k.OpenProcess(0x1001, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION | PROCESS_TERMINATE
    if not h:
        return None
    return h, pid in own_job()
child = subprocess.Popen([sys.executable, "-I", "-c", "import time; time.sleep(5)"])  # alive, no network
control = in_job(child.pid)
child.kill()
ps = ("$r = Invoke-CimMethod -ClassName Win32_Process -MethodName Create "
      "-Arguments @{CommandLine='cmd /c ping -n 60 127.0.0.1'}; \"$($r.ReturnValue) $($r.ProcessId)\"")
made = run("powershell", "-NoProfile", "-NonInteractive", "-Command", ps)
pid, outside = 0, None
parts = made[1].split()
if made[0] == 0 and len(parts) >= 2 and parts[-2] == "0" and parts[-1].isdigit():
    pid = int(parts[-1])
    seen = in_job(pid)
    if seen:
        outside = not seen[1]
        k.TerminateProcess(ctypes.c_void_p(seen[0]), 1)  # never leave it behind
# ShellWindows: served by Explorer, "RunAs Interactive User": the real user, outside every boundary.
# The failure's HRESULT printed on one line of its own: PowerShell's error record puts it ~300
# characters before the end (its position and category lines follow), past what `run` keeps.
com = run("powershell", "-NoProfile", "-NonInteractive", "-Command",
          "$ErrorActionPreference='Stop'; $t = [type]::GetTypeFromCLSID('9BA05972-F6A8-11CF-A442-00A0C90A8F39'); "
          "try { $o = [Activator]::CreateInstance($t); 'SANDGATE-COM-MADE' } "
          "catch { $e = $_.Exception; while ($e.InnerException) { $e = $e.InnerException }; "
          "'SANDGATE-COM-FAILED 0x{0:X8} {1}' -f $e.HResult, $e.GetType().Name }")
done({"control_in_job": bool(control and control[1]), "created": made, "pid": pid, "outside_job": outside,
      "com": com})
"""
)

SMB = (
    _COMMON
    + r"""
import threading
def attempt(path):
    out = []
    def go():
        try:
            os.listdir(path)
            out.append([0, "listed"])
        except OSError as e:
            out.append([getattr(e, "winerror", None) or e.errno, str(e)[-200:]])
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(15)
    return out[0] if out else [-1, "no answer within 15 s"]
own = os.path.abspath("sandgate-own")
os.mkdir(own)
control = os.path.isdir(own)
os.rmdir(own)
smb = attempt(r"\\198.51.100.7\sandgate-probe")
dav = attempt(r"\\198.51.100.7@80\DavWWWRoot\sandgate-probe")
webclient = run("sc", "query", "WebClient")
done({"control": control, "smb": smb, "webdav": dav, "webclient_running": "RUNNING" in webclient[1]})
"""
)

ACCESS_DENIED = 5


def judge_task(code: int, got: dict[str, Any] | None) -> Verdict:
    if got is None:
        return Verdict(False, f"the probe wrote no result (exit {code}): it did not run")
    if got.get("control") != 0:
        return Verdict(False, "could not start its own child process: the probe proves nothing")
    if got.get("escaped"):
        return Verdict(False, "a scheduled task ran as the sandbox user outside the job (it outlives the run)")
    created = (got.get("create") or [1])[0] == 0
    how = "registered but never ran" if created else "registration refused"
    return Verdict(True, f"scheduled task {how}; own child ran")


#: How WMI and COM say "denied": WBEM_E_ACCESS_DENIED, E_ACCESSDENIED, their texts (setup's H3 denies).
DENIED_MARKS = ("0x80041003", "80070005", "access denied", "access is denied")


def _denied(result: object) -> bool:
    text = str(result[1] if isinstance(result, list) and len(result) > 1 else "").lower()
    return any(mark in text for mark in DENIED_MARKS)


def judge_wmi(code: int, got: dict[str, Any] | None) -> Verdict:
    """Passes only when Win32_Process.Create and the out-of-process COM server were refused with
    access denied (setup's namespace and DCOM denies, servicedeny.py), or what WMI made stayed in
    the job; any other failure proves nothing about the denies."""
    if got is None:
        return Verdict(False, f"the probe wrote no result (exit {code}): it did not run")
    if not got.get("control_in_job"):
        return Verdict(False, "its own child was not seen in the job: the in-job check proves nothing")
    if got.get("outside_job"):
        return Verdict(False, f"Win32_Process.Create started pid {got.get('pid')} outside the job (killed)")
    if got.get("pid") and got.get("outside_job") is None:
        return Verdict(False, f"Win32_Process.Create started pid {got.get('pid')}, which could not be inspected")
    if not got.get("pid") and not _denied(got.get("created")):
        return Verdict(False, f"Win32_Process.Create failed, but not with access denied: {got.get('created')}")
    com = got.get("com")
    if "SANDGATE-COM-MADE" in str(com):
        return Verdict(False, "an out-of-process COM server (ShellWindows, the real user's Explorer) answered")
    if not _denied(com):
        return Verdict(False, f"the COM activation failed, but not with access denied: {com}")
    return Verdict(True, "Win32_Process.Create and out-of-process COM refused (access denied); own child in the job")


def judge_smb(code: int, got: dict[str, Any] | None) -> Verdict:
    """Decision (docs/windows.md, H4): SMB counts as refused only on ERROR_ACCESS_DENIED. Any other
    failure (bad net path, timeout, no answer) is what an unanswered SYN to the unrouted target looks
    like, and also what a machine firewall block on 445/139 looks like: the probe cannot tell them
    apart, so it is never counted as a refusal (fail closed). WebDAV counts as refused on access
    denied, or when the attempt failed and WebClient is still not running after it (the attempt
    would have trigger-started it: no service, no connection)."""
    if got is None:
        return Verdict(False, f"the probe wrote no result (exit {code}): it did not run")
    if not got.get("control"):
        return Verdict(False, "could not make a directory in its workspace: the probe proves nothing")
    smb, dav = got.get("smb") or [None], got.get("webdav") or [None]
    smb_ok = smb[0] == ACCESS_DENIED
    dav_ok = dav[0] == ACCESS_DENIED or (dav[0] not in (0, None) and not got.get("webclient_running"))
    if smb_ok and dav_ok:
        return Verdict(True, "SMB refused to the sandbox user (access denied); WebDAV refused or WebClient stopped")
    why = "" if smb_ok else " (not access denied: a firewall block on 445 cannot be told from an unanswered leak)"
    return Verdict(
        False,
        f"known gap (H4, docs/windows.md): the SMB redirector / WebClient act as SYSTEM / LOCAL SERVICE, "
        f"outside the sandbox user's filters (smb {smb}{why}, webdav {dav}, "
        f"WebClient running: {got.get('webclient_running')})",
        gap=True,  # what would close it is machine-wide and breaks the real user's shares: the user's choice
    )


BODIES = (
    ProbeBody("scheduled_task", "process", TASK, judge_task),
    ProbeBody("wmi_process", "process", WMI, judge_wmi),
    ProbeBody("smb_webdav", "network", SMB, judge_smb),
)

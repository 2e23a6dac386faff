"""The job object's bindings: the tree dies with sandgate and cannot leave (kill on close, no breakaway).

Apart from sgbase/windows/win32.py because the limits are this guard's plan (job.py, checked by
job.check_job before any call); the loader and the error type are the shared binding's.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_size_t, c_uint64

from fsguard.windows import job
from sgbase.windows.win32 import BY_NAME, DWORD, Win32Error, check, fn

JobObjectExtendedLimitInformation = 9  # JOBOBJECTINFOCLASS


class IO_COUNTERS(Structure):
    _fields_ = [(n + c, c_uint64) for c in ("OperationCount", "TransferCount") for n in ("Read", "Write", "Other")]


class JOBOBJECT_BASIC_LIMIT_INFORMATION(Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", c_uint64),
        ("PerJobUserTimeLimit", c_uint64),
        ("LimitFlags", DWORD),
        ("MinimumWorkingSetSize", c_size_t),
        ("MaximumWorkingSetSize", c_size_t),
        ("ActiveProcessLimit", DWORD),
        ("Affinity", c_size_t),
        ("PriorityClass", DWORD),
        ("SchedulingClass", DWORD),
    ]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(Structure):
    _fields_ = [
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", c_size_t),
        ("JobMemoryLimit", c_size_t),
        ("PeakProcessMemoryUsed", c_size_t),
        ("PeakJobMemoryUsed", c_size_t),
    ]


def make_job(limits: job.JobLimits) -> int:
    """A job with the checked limits (kill on close, no breakaway, no UI limits)."""
    limits = job.check_job(limits)
    h = fn("CreateJobObjectW")(None, None)
    check("CreateJobObjectW", h)
    info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    info.BasicLimitInformation.LimitFlags = limits.limit_flags
    info.BasicLimitInformation.ActiveProcessLimit = limits.active_process_limit
    ok = fn("SetInformationJobObject")(h, JobObjectExtendedLimitInformation, ctypes.byref(info), ctypes.sizeof(info))
    if not ok:
        err = getattr(ctypes, "get_last_error", lambda: 0)()  # read before CloseHandle can change it
        fn("CloseHandle")(h)  # not left open behind a refused run (r3-sdk S1)
        raise Win32Error(
            err, f"SetInformationJobObject failed (error {err}); see {BY_NAME['SetInformationJobObject'].doc}"
        )
    # No JobObjectBasicUIRestrictions (W4): a job with UI limits cannot take CMD, which the
    # Secondary Logon service already put in a job; the private desktop answers those threats.
    return int(h)


def assign(job_handle: int, process: int) -> None:
    check("AssignProcessToJobObject", fn("AssignProcessToJobObject")(job_handle, process))


def close_job(job_handle: int) -> None:
    """TerminateJobObject, then the last handle closed (KILL_ON_JOB_CLOSE would do it too)."""
    try:
        check("TerminateJobObject", fn("TerminateJobObject")(job_handle, 1))
    finally:
        fn("CloseHandle")(job_handle)

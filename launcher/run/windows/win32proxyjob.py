"""The proxy child, started in a job of its own that ends it when sandgate ends (session 38, r3-day D2).

Threat (availability, and before D1 a policy mix-up): Windows does not end a process's children when
it dies. A sandgate killed mid-run (TerminateProcess, its terminal window closed, a crash in teardown
before "stop the proxy") left the proxy child listening on the filters' port with the dead run's
policy: every later run was refused ("the port is taken") until the user found a python.exe in Task
Manager, and `sandgate cleanup` knew nothing of it. The job has JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE and
one handle, sandgate's: "closing the last job object handle terminates all associated processes"
(learn.microsoft.com/windows/win32/api/jobapi2/nf-jobapi2-createjobobjectw), and the kernel closes a
dead process's handles. The job is made before the child; the child runs outside it only between
CreateProcess and AssignProcessToJobObject (Popen cannot keep a suspended child's thread to resume).
Effects only; never run on Windows.
"""

from __future__ import annotations

import subprocess

from fsguard.windows import job, win32job
from sgbase.windows.api import WinApiError

CREATE_NO_WINDOW = 0x08000000
#: Kill on close only: no breakaway (job.check_job), no UI limits (they would not nest, W4).
LIMITS = job.JobLimits(job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, 0, 0)
NOT_IN_JOB = (
    "the proxy could not join its job ({}); if sandgate itself runs inside a job with UI limits "
    "(some CI agents and sandboxed terminals), run it from an ordinary terminal"
)

_JOBS: dict[int, int] = {}  # the child's pid -> its job's only handle


def start(argv: tuple[str, ...]) -> subprocess.Popen[bytes]:
    """The proxy started and put in its kill-on-close job; refused (the child ended) if it cannot join."""
    try:
        held = win32job.make_job(LIMITS)
    except (OSError, ValueError) as e:
        raise WinApiError(f"cannot make the proxy's job (CreateJobObjectW): {e}") from None
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, creationflags=CREATE_NO_WINDOW)
    except OSError as e:
        _close(held)
        raise WinApiError(f"cannot start the proxy: {e.strerror}") from None
    try:
        win32job.assign(held, int(vars(child)["_handle"]))  # Popen's process handle (PROCESS_ALL_ACCESS)
    except (OSError, KeyError) as e:
        child.kill()  # never a proxy that would outlive a killed sandgate
        child.wait()
        _close(held)
        raise WinApiError(NOT_IN_JOB.format(f"AssignProcessToJobObject: {e}")) from None
    _JOBS[child.pid] = held
    return child


def stop(child: subprocess.Popen[bytes]) -> None:
    """The proxy terminated (killed after 10 s), then its job closed."""
    try:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
    finally:
        held = _JOBS.pop(child.pid, None)
        if held is not None:
            _close(held)


def _close(held: int) -> None:
    try:
        win32job.close_job(held)
    except OSError:
        pass  # TerminateJobObject refused: CloseHandle ran anyway (close_job's finally), and kill-on-close ends it

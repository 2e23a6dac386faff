"""Run a probe in a forked child and bring back what the kernel did: the harness of the kernel tests.

Landlock, a seccomp filter and dropped capabilities can never be undone in a process, so the tests of
fsguard.landlock, fsguard.seccomp and fsguard.caps run every probe in a forked child and pytest itself
stays unconfined. A child reports one JSON document through a pipe and leaves only through os._exit:
it never returns into pytest's frames. Only our own children are ever killed (after a timeout).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import pytest


def _read_all(fd: int, timeout: float) -> bytes:
    """Everything until EOF on `fd`; TimeoutError if the writer has not closed it in time."""
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("child did not finish in time")
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reap(pid: int, timeout: float = 5.0) -> int:
    """Wait status of our child `pid`; SIGKILLed if it has not exited within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # our own child only
            return os.waitpid(pid, 0)[1]
        time.sleep(0.005)


def _collect(pid: int, r: int, timeout: float) -> tuple[int, bytes]:
    """(wait status, what the child wrote) for a child whose pipe end `r` we hold; fails the test on a hang."""
    try:
        raw = _read_all(r, timeout)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)  # our own child only
        pytest.fail(f"child {pid} did not finish within {timeout:.0f} s", pytrace=False)
    finally:
        os.close(r)
        status = _reap(pid)
    return status, raw


def in_child(body: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Run body() in a forked child and return its JSON-able result; the child never returns to pytest."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never leave this block except through os._exit
        code = 1
        try:
            os.close(r)
            try:
                payload = {"ok": True, "result": body()}
                code = 0
            except BaseException:
                payload = {"ok": False, "error": traceback.format_exc()}
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(w, data) :]
        finally:
            os._exit(code)
    os.close(w)
    status, raw = _collect(pid, r, timeout)
    if not raw:
        pytest.fail(f"child died without reporting (wait status {status:#x})")
    payload = json.loads(raw)
    if not payload["ok"]:
        pytest.fail("child failed:\n" + payload["error"], pytrace=False)
    return payload["result"]


def exec_in_child(prepare: Callable[[], Sequence[str]], timeout: float = 10.0) -> tuple[int, bytes]:
    """Fork; in the child run prepare(), which returns the argv to exec with stdout on a pipe.

    Returns (wait status, stdout): what the exec'd program really got, after an execve the
    confinement must survive. A failure before the exec leaves its traceback as the output.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.dup2(w, 1)
            argv = list(prepare())
            os.execv(argv[0], argv)
        except BaseException:
            os.write(w, traceback.format_exc().encode())
        finally:
            os._exit(1)
    os.close(w)
    return _collect(pid, r, timeout)


def attempt(action: Callable[[], object]) -> str:
    """'ok', or the errno name the action failed with."""
    try:
        action()
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e.errno))
    return "ok"

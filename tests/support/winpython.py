"""This interpreter made to look like CPython on Windows, as far as a Linux test can (issue 28, win-py).

`become_windows()` is run first thing in a throwaway interpreter (`python -c PRELUDE ...`): every name
below is one CPython on Windows does not have, so code on the Windows path that reaches one fails
here as it would there (AttributeError, ModuleNotFoundError), not only at import time
(tests/unit/test_windows_imports.py) but at the call. Then sys.platform is "win32", asyncio's default
loop is one that refuses add_reader/add_writer/add_signal_handler as Windows' ProactorEventLoop does,
and setsockopt(SO_RCVLOWAT) fails as Windows' TCP/IP provider fails it.

Sources: docs.python.org/3/library/os.html, select.html, signal.html, socket.html ("Availability:
Unix/Linux" on each name); docs.python.org/3/library/asyncio-platforms.html#windows ("ProactorEventLoop
... add_reader() and add_writer() are not supported"; "loop.add_signal_handler() and
loop.remove_signal_handler() are not supported"); learn.microsoft.com/windows/win32/winsock/
sol-socket-socket-options (SO_RCVLOWAT: "If this option is used on Windows Vista and later, the
getsockopt and setsockopt functions fail with WSAEINVAL").
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import selectors
import signal
import socket
import sys
from typing import Any

MODULES = ("pwd", "grp", "fcntl", "termios", "resource", "tty", "pty")
OS = (
    "pipe2",
    "splice",
    "O_NOFOLLOW",
    "O_CLOEXEC",
    "O_NONBLOCK",
    "O_NOCTTY",
    "O_PATH",
    "O_DIRECTORY",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getpgid",
    "killpg",
    "fork",
    "setsid",
    "memfd_create",
    "eventfd",
    "pidfd_open",
    "setns",
    "unshare",
    "statvfs",
    "fchown",
    "fchmod",
    "chown",
    "lchown",
    "mkfifo",
    "openpty",
    "ttyname",
    "getgroups",
    "setuid",
    "setgid",
    "initgroups",
    "posix_spawn",
    "waitid",
    "wait3",
    "wait4",
    "WNOHANG",
    "ST_RDONLY",
    "sysconf",
    "getpgrp",
    "setpgid",
    "getsid",
    "sched_getaffinity",
    "SPLICE_F_MOVE",
    "SPLICE_F_NONBLOCK",
    "fchdir",
    "tcgetpgrp",
    "tcsetpgrp",
)
SELECT = ("poll", "epoll", "POLLIN", "POLLOUT", "POLLRDHUP", "POLLHUP", "POLLERR", "kqueue")
SIGNAL = (
    "SIGKILL",
    "SIGHUP",
    "SIGTSTP",
    "SIGWINCH",
    "SIGCHLD",
    "SIGQUIT",
    "SIGCONT",
    "SIGSTOP",
    "SIGUSR1",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTTIN",
    "SIGTTOU",
    "pthread_kill",
    "pthread_sigmask",
    "siginterrupt",
    "setitimer",
    "alarm",
    "sigwait",
)
SOCKET = (
    "AF_UNIX",
    "SCM_RIGHTS",
    "SO_PEERCRED",
    "MSG_DONTWAIT",
    "MSG_CMSG_CLOEXEC",
    "SOCK_CLOEXEC",
    "SOCK_NONBLOCK",
    "SOCK_SEQPACKET",
    "send_fds",
    "recv_fds",
    "CMSG_SPACE",
    "CMSG_LEN",
    "SO_PASSCRED",
    "MSG_NOSIGNAL",
)

#: What a test runs before anything else in the child interpreter.
PRELUDE = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from tests.support import winpython; winpython.become_windows()"
)


class ProactorLikeLoop(asyncio.SelectorEventLoop):
    """Asyncio's default loop on Windows, as far as what it lacks: these raise NotImplementedError there."""

    def add_reader(self, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("add_reader: not on Windows' ProactorEventLoop")

    def add_writer(self, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("add_writer: not on Windows' ProactorEventLoop")

    def add_signal_handler(self, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("add_signal_handler: not on Windows' ProactorEventLoop")


#: CPython on Windows builds select() with FD_SETSIZE 512 (Modules/selectmodule.c: "#if defined(MS_WINDOWS) &&
#: !defined(FD_SETSIZE) #define FD_SETSIZE 512"); a set with more raises ValueError "too many file descriptors
#: in select()". On Linux the limit is by fd number (1024), so it is enforced here by count, as there.
WINDOWS_FD_SETSIZE = 512


class WindowsSelectSelector(selectors.SelectSelector):
    """selectors.DefaultSelector on Windows (no poll, no epoll): select() and its 512-socket sets."""

    def _select(self, r: Any, w: Any, x: Any, timeout: float | None = None) -> Any:
        if max(len(r), len(w), len(x)) > WINDOWS_FD_SETSIZE:
            raise ValueError("too many file descriptors in select()")
        return super()._select(r, w, x, timeout)  # type: ignore[misc]


class SelectorLikeLoop(asyncio.SelectorEventLoop):
    """Windows' SelectorEventLoop: add_reader on sockets, but no signal handlers (BaseEventLoop's NotImplementedError),
    waiting with select() (WindowsSelectSelector)."""

    def __init__(self, selector: selectors.BaseSelector | None = None) -> None:
        super().__init__(selector or WindowsSelectSelector())

    def add_signal_handler(self, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("add_signal_handler: not on Windows")


class _Policy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return ProactorLikeLoop()


_setsockopt = socket.socket.setsockopt


def _windows_setsockopt(self: socket.socket, level: int, name: int, *value: Any) -> None:
    if level == socket.SOL_SOCKET and name == socket.SO_RCVLOWAT:
        raise OSError(errno.EINVAL, "WSAEINVAL: SO_RCVLOWAT is not supported by the Windows TCP/IP provider")
    _setsockopt(self, level, name, *value)


#: Standard modules that choose their implementation by sys.platform when imported (shutil: _winapi, ...):
#: imported first, as Linux builds them, so only the code under test sees "win32".
STDLIB = (
    "shutil",
    "tempfile",
    "importlib.resources",
    "importlib.metadata",
    "subprocess",
    "ssl",
    "uuid",
    "platform",
    "getpass",
    "mimetypes",
    "urllib.request",
    "http.client",
    "logging",
    "concurrent.futures",
    "selectors",
    "socketserver",
    "zipfile",
    "locale",
    "ctypes",
    "ctypes.util",
    "ctypes.wintypes",
    "asyncio.subprocess",
    "multiprocessing",
    "webbrowser",
    "sysconfig",
    "site",
    # and libraries that import winreg or msvcrt when sys.platform is win32 (dnspython reads the registry there,
    # click, under mitmproxy's addons, its console API): they exist there, not here. sandgate's own modules are
    # never imported ahead: their platform branches are what the tests are for.
    "dns.resolver",
    "mitmproxy.addons",
    "mitmproxy.master",
    "mitmproxy.options",
    "mitmproxy.proxy.mode_servers",
)


def _loopback_socketpair(
    family: int = socket.AF_INET, type: int = socket.SOCK_STREAM, proto: int = 0
) -> tuple[socket.socket, socket.socket]:
    """socket.socketpair as CPython defines it where _socket has none (Windows): two TCP sockets over loopback."""
    with socket.socket(family, type, proto) as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        a = socket.socket(family, type, proto)
        a.connect(lsock.getsockname())
        b, _ = lsock.accept()
    return a, b


def become_windows() -> None:
    """Take away what CPython on Windows lacks; call before importing the code under test. On Windows
    itself (the workflow runs tests/unit/test_windows_*.py there) nothing is simulated: the real thing runs."""
    import importlib

    if os.name == "nt":
        return

    for name in STDLIB:
        importlib.import_module(name)
    for module, names in ((os, OS), (select, SELECT), (signal, SIGNAL), (socket, SOCKET)):
        for name in names:
            if hasattr(module, name):
                delattr(module, name)
    for name in [n for n in dir(os) if n.startswith("SPLICE_")]:
        delattr(os, name)
    for name in MODULES:
        sys.modules[name] = None  # type: ignore[assignment]  # "import of fcntl halted": what Windows says, in effect
    socket.socketpair = _loopback_socketpair  # type: ignore[assignment]
    socket.socket.setsockopt = _windows_setsockopt  # type: ignore[assignment,method-assign]
    asyncio.set_event_loop_policy(_Policy())
    asyncio.SelectorEventLoop = SelectorLikeLoop
    sys.platform = "win32"

"""A running canary server of the world (selftest/canary/, run as
``python -m selftest.canary``): its JSON-lines log is the evidence of what reached a fake host."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selftest.nsexec import kill_group

CANARY_MODULE = "selftest.canary"
#: The directory holding the `selftest` package (and `launcher` beside it): put on the canaries' PYTHONPATH,
#: since the interpreter running them need not have sandgate installed (a checkout, a test run).
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
SERVER_KINDS = ("http", "https", "dns", "udp", "tcp", "upstream", "git")
TLS_KINDS = ("https", "upstream", "git")  # served with a certificate from the world's CA
UNIX_KINDS = ("unix", "abstract")
READY_TIMEOUT = 10.0


class Server:
    """A running canary (selftest/canary/); its JSON-lines log is the evidence of what reached this host.

    IP kinds have ip/port (path ""); unix/abstract kinds have path (the socket path, or the abstract
    name without its NUL), ip "" and port 0.
    """

    def __init__(
        self,
        kind: str,
        ip: str,
        port: int,
        name: str,
        log_path: Path,
        stderr_path: Path,
        proc: subprocess.Popen[bytes],
        path: str = "",
    ) -> None:
        self.kind = kind
        self.ip = ip
        self.port = port
        self.path = path
        self.name = name
        self.log_path = log_path
        self.stderr_path = stderr_path
        self.proc = proc
        self._socket_id: tuple[int, int] | None = None  # (dev, ino) of a unix socket file we created

    def __repr__(self) -> str:
        return f"<Server {self.kind} {self.name} {self.address} pid={self.pid}>"

    @property
    def address(self) -> str:
        """ "ip:port", a unix socket path, or "@name" for an abstract socket."""
        if self.kind == "abstract":
            return "@" + self.path
        if self.kind == "unix":
            return self.path
        return f"{self.ip}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_records(self, kind: str | None = None) -> list[dict[str, Any]]:
        """All records so far (optionally only one "kind"); a partial last line (mid-write) is skipped."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        records = []
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if i == len(lines) - 1:
                    break  # being written right now
                raise
            if kind is None or rec.get("kind") == kind:
                records.append(rec)
        return records

    def wait_for(
        self, pred: Callable[[dict[str, Any]], bool] | None = None, timeout: float = 5.0, kind: str | None = None
    ) -> dict[str, Any]:
        """First record matching `pred` (and `kind`), polling until `timeout`; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            for rec in self.log_records(kind):
                if pred is None or pred(rec):
                    return rec
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self!r}: no matching record in {timeout}s; have {self.log_records()}")
            time.sleep(0.02)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Terminate the server (idempotent); a unix socket file it created is removed."""
        kill_group(self.proc, grace=2.0)
        if self.proc.stdout:
            self.proc.stdout.close()
        if self._socket_id is not None:  # the canary unlinks it on SIGTERM, but not when SIGKILLed
            with contextlib.suppress(OSError):
                st = os.lstat(self.path)
                if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._socket_id:
                    os.unlink(self.path)
            self._socket_id = None

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    break
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
        if buf.startswith(b"ready\n"):
            if self.kind == "unix":
                with contextlib.suppress(OSError):
                    st = os.lstat(self.path)
                    self._socket_id = (st.st_dev, st.st_ino)
            return
        self.stop()
        raise RuntimeError(
            f"canary {self.kind} {self.name} on {self.address} not ready within {timeout}s "
            f"(exit {self.proc.returncode}, stdout {buf!r}); stderr:\n{self.stderr()}"
        )

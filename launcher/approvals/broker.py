"""Human approval of `ask` destinations: the launcher's side.

The proxy sends questions over a unix socket in sandgate's run directory (root-only, and
hidden from the sandbox by the mount namespace). The broker asks ONE of:
  - an embedding tool over `--approvals unix:PATH` (JSON lines, see README), or
  - the human on sandgate's own terminal (/dev/tty opened here, not the sandbox's stdin),
and answers the proxy: once | run | always | deny | timeout. Fail closed: no terminal, no
client, a closed channel or no answer within the timeout is a refusal.

A process in the sandbox shares the terminal and could print a fake prompt; every real prompt
carries this run's code, printed by sandgate before the command started and never given to
the sandbox, so a prompt without it is not sandgate's.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher import amend
from netguard.audit import AuditLog, approval_record

CHOICES = {"o": "once", "r": "run", "a": "always", "d": "deny"}


class Broker:
    def __init__(
        self,
        internal_path: Path,
        audit: AuditLog,
        task: str,
        timeout: float,
        *,
        channel: str | None = None,
        policy_file: Path | None = None,
        who: Callable[[str, int], str | None] = lambda ip, port: None,
    ) -> None:
        self.audit, self.task, self.timeout = audit, task, timeout
        self.policy_file, self.who = policy_file, who
        self.code = uuid.uuid4().hex[:4].upper()  # shown before the command starts; authenticates prompts
        self._internal = _listen(internal_path)
        self._channel = _listen(Path(channel)) if channel else None
        self._channel_path = Path(channel) if channel else None
        self._clients: list[socket.socket] = []
        self._answers: dict[str, str] = {}
        self._cond = threading.Condition()
        self._human = threading.Lock()  # one prompt on the terminal at a time
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def banner(self) -> str:
        where = f"on {self._channel_path}" if self._channel_path else "on this terminal"
        return f"sandgate: approvals {where}; genuine prompts carry the code [{self.code}]"

    def start(self) -> None:
        """Start serving; call only after the sandbox was forked (threads and fork do not mix)."""
        self._spawn(self._accept_proxy)
        if self._channel is not None:
            self._spawn(self._accept_clients)

    def stop(self) -> None:
        self._stop.set()
        for s in (self._internal, self._channel, *self._clients):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        with self._cond:
            self._cond.notify_all()
        if self._channel_path is not None:
            self._channel_path.unlink(missing_ok=True)

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    # ---- the proxy's questions -----------------------------------------------------------

    def _accept_proxy(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._internal.accept()
            except OSError:
                return
            self._spawn(self._serve_proxy, conn)

    def _serve_proxy(self, conn: socket.socket) -> None:
        lock = threading.Lock()
        with conn, conn.makefile("rb") as f:
            for line in f:
                try:
                    q = json.loads(line)
                    qid, host, port = str(q["id"]), str(q["host"]), int(q["port"])
                except (ValueError, KeyError, TypeError):
                    continue
                self._spawn(self._answer_proxy, conn, lock, qid, host, port, q.get("kind"), q.get("peer"))

    def _answer_proxy(
        self,
        conn: socket.socket,
        lock: threading.Lock,
        qid: str,
        host: str,
        port: int,
        kind: str | None,
        peer: list[Any] | None,
    ) -> None:
        asked_by = self.who(str(peer[0]), int(peer[1])) if peer else None
        self.audit.write(approval_record(self.task, id=qid, stage="question", host=host, port=port, asked_by=asked_by))
        answer, by = self._ask(qid, host, port, kind or "connect", asked_by)
        if answer == "always":
            self._remember(host, port)
        self.audit.write(
            approval_record(
                self.task, id=qid, stage="answer", host=host, port=port, asked_by=asked_by, answer=answer, by=by
            )
        )
        with lock:
            try:
                conn.sendall((json.dumps({"id": qid, "answer": answer}) + "\n").encode())
            except OSError:
                pass

    def _ask(self, qid: str, host: str, port: int, kind: str, asked_by: str | None) -> tuple[str, str]:
        if self._channel is not None:
            return self._ask_client(qid, host, port, kind, asked_by)
        return self._ask_terminal(host, port, kind, asked_by)

    # ---- an embedding tool over --approvals unix:PATH ------------------------------------

    def _accept_clients(self) -> None:
        assert self._channel is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._channel.accept()
            except OSError:
                return
            with self._cond:
                self._clients.append(conn)
                self._cond.notify_all()
            self._spawn(self._read_client, conn)

    def _read_client(self, conn: socket.socket) -> None:
        try:
            with conn.makefile("rb") as f:
                for line in f:
                    try:
                        msg = json.loads(line)
                        if msg.get("type") == "decision" and msg.get("decision") in ("once", "run", "always", "deny"):
                            with self._cond:
                                self._answers[str(msg["id"])] = str(msg["decision"])
                                self._cond.notify_all()
                    except (ValueError, AttributeError):
                        continue
        except OSError:
            pass
        with self._cond:
            if conn in self._clients:
                self._clients.remove(conn)
            self._cond.notify_all()

    def _ask_client(self, qid: str, host: str, port: int, kind: str, asked_by: str | None) -> tuple[str, str]:
        request = (
            json.dumps(
                {
                    "type": "request",
                    "id": qid,
                    "host": host,
                    "port": port,
                    "kind": kind,
                    "asked_by": asked_by,
                    "timeout": self.timeout,
                }
            )
            + "\n"
        ).encode()
        deadline = time.monotonic() + self.timeout
        sent: set[int] = set()
        with self._cond:
            while True:
                for c in list(self._clients):  # a client that connects late still gets pending questions
                    if id(c) not in sent:
                        try:
                            c.sendall(request)
                            sent.add(id(c))
                        except OSError:
                            self._clients.remove(c)
                if qid in self._answers:
                    return self._answers.pop(qid), "socket"
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return "timeout", "timeout"
                self._cond.wait(min(left, 0.5))

    # ---- the human on sandgate's terminal ------------------------------------------------

    def _ask_terminal(self, host: str, port: int, kind: str, asked_by: str | None) -> tuple[str, str]:
        with self._human:
            try:
                fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError:
                return "deny", "no-terminal"
            try:
                who = f" asked by {asked_by}" if asked_by else ""
                prompt = (
                    f"\r\nsandgate [{self.code}] allow {host}:{port} ({kind}){who}? "
                    f"[o]nce, for this [r]un, [a]lways, [d]eny ({self.timeout:.0f}s): "
                )
                os.write(fd, prompt.encode())
                deadline = time.monotonic() + self.timeout
                buf = b""
                while time.monotonic() < deadline:
                    ready, _, _ = select.select([fd], [], [], min(0.5, max(0.0, deadline - time.monotonic())))
                    if self._stop.is_set():
                        break
                    if ready:
                        chunk = os.read(fd, 64)
                        if not chunk:
                            break
                        buf += chunk
                        if b"\n" in buf or b"\r" in buf:
                            choice = CHOICES.get(buf.strip()[:1].decode(errors="replace").lower())
                            if choice:
                                os.write(fd, f"sandgate [{self.code}] {choice}\r\n".encode())
                                return choice, "terminal"
                            buf = b""
                            os.write(fd, b"o, r, a or d: ")
                os.write(fd, f"\r\nsandgate [{self.code}] no answer: denied\r\n".encode())
                return "timeout", "timeout"
            finally:
                os.close(fd)

    def _remember(self, host: str, port: int) -> None:
        """'always': add the allow entry to the policy file, or tell the user the line to add."""
        line = amend.allow_entry(host, port)
        if self.policy_file is not None:
            try:
                text = self.policy_file.read_text()
                new = amend.add_allow(text, host, port)
                if new is not None:
                    self.policy_file.write_text(new)
                    print(f"sandgate: added {host}:{port} to {self.policy_file}", file=sys.stderr)
                    return
            except OSError:
                pass
        where = f" under network.allow in {self.policy_file}" if self.policy_file else " to your policy (network.allow)"
        print(f"sandgate: to always allow {host}:{port}, add  - {line}{where}", file=sys.stderr)


def _listen(path: Path) -> socket.socket:
    """A unix socket only its owner (root) can connect to; an old file at the path is replaced."""
    path.unlink(missing_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        s.bind(str(path))
    finally:
        os.umask(old)
    s.listen(16)
    return s

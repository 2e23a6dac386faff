"""Human approval of `ask` destinations: the launcher's broker between the daemon and one answerer.

The daemon sends questions over a unix socket in sandgate's run directory (root-only, and
hidden from the sandbox by the mount namespace). The broker asks ONE of:
  - an embedding tool over `--approvals unix:PATH` (netguard.approval's messages, see README), or
  - the human on sandgate's own terminal (prompt.py),
and answers the daemon: once | run | always | deny | timeout. Fail closed: no terminal, no
client, a closed channel or no answer within the timeout is a refusal. Every question and
answer is an audit record; "always" is written into the policy file through launcher.config.amend.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Literal

from launcher.approvals.channel import ClientChannel, DaemonChannel
from launcher.approvals.prompt import TerminalPrompt, open_tty
from launcher.config import amend
from netguard.approval import Answer, By, Decision, Request
from netguard.audit import AuditLog, approval_record


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
        tty: Callable[[], int] = open_tty,
    ) -> None:
        self.audit, self.task, self.timeout = audit, task, timeout
        self.policy_file, self.who = policy_file, who
        self.code = uuid.uuid4().hex[:4].upper()  # shown before the command starts; authenticates prompts
        self._stop = threading.Event()
        self._daemon = DaemonChannel(internal_path, self.answer)
        self._clients = ClientChannel(Path(channel)) if channel else None
        self._prompt = TerminalPrompt(self.code, timeout, self._stop, tty)

    def banner(self) -> str:
        where = f"on {self._clients.path}" if self._clients else "on this terminal"
        return f"sandgate: approvals {where}; genuine prompts carry the code [{self.code}]"

    def start(self) -> None:
        """Start serving; call only after the sandbox was forked (threads and fork do not mix)."""
        self._daemon.start()
        if self._clients is not None:
            self._clients.start()

    def prompting(self) -> bool:
        """Whether a prompt holds the terminal now: the pty relay leaves its answer to it."""
        return self._prompt.busy()

    def stop(self) -> None:
        self._stop.set()
        self._daemon.close()
        if self._clients is not None:
            self._clients.close()

    def answer(self, req: Request) -> Decision:
        """Ask the one answerer about `req`, record question and answer, remember "always"."""
        asked_by = self.who(*req.peer) if req.peer else None
        req = replace(req, asked_by=asked_by, timeout=self.timeout)
        self._record(req, "question")
        answer, by = self._ask(req)
        if answer == "always":
            self._remember(req.host, req.port)
        self._record(req, "answer", answer, by)
        return Decision(req.id, answer)

    def _record(
        self, req: Request, stage: Literal["question", "answer"], answer: Answer | None = None, by: By | None = None
    ) -> None:
        self.audit.write(
            approval_record(
                self.task,
                id=req.id,
                stage=stage,
                host=req.host,
                port=req.port,
                asked_by=req.asked_by,
                answer=answer,
                by=by,
            )
        )

    def _ask(self, req: Request) -> tuple[Answer, By]:
        if self._clients is None:
            return self._prompt.ask(req)
        choice = self._clients.ask(req, self.timeout)
        return (choice, "socket") if choice is not None else ("timeout", "timeout")

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

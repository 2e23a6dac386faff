"""The proxy's side of human approval: ask the launcher, wait, remember "for this run".

The proxy never talks to a human itself: it sends one `approval.Request` line per question over
a unix socket that only root can reach (in sandgate's run directory, hidden from the sandbox) and
holds the connection until the `approval.Decision` comes back. Fail closed: no channel, a closed
channel, a malformed answer or no answer in time all mean "deny".
Concurrent connections to the same destination share one question.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from netguard.approval import Answer, Decision, ProtocolError, Request, decode, encode

#: Open questions one sandbox may have at once: a human answers a few at a time; 300 distinct hosts in
#: a second (a flood, or a forged "pip" asking) would bury the real one and cost 600 records (issue 22).
QUESTIONS = 16

#: Told of every question refused for the cap: (why) -> a limit record in the sandbox's log.
Refused = Callable[[str], None]


class Approver:
    def __init__(self, socket_path: str | None, timeout: float, refused: Refused | None = None) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._refused = refused
        self.for_run: set[tuple[str, int]] = set()  # "allow for this run" (and "always")
        self._pending: dict[tuple[str, int], asyncio.Future[Answer]] = {}
        self._waiting: dict[str, asyncio.Future[Answer]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def ask(self, host: str, port: int, kind: str, peer: tuple[str, int] | None, reason: str) -> Answer:
        """The human's answer for (host, port); a second asker of the same destination waits for the same one."""
        key = (host, port)
        if key in self.for_run:
            return "run"
        if key in self._pending:
            return await asyncio.shield(self._pending[key])
        if len(self._pending) >= QUESTIONS:  # denied at once, never asked: the human sees no flood
            if self._refused is not None:
                self._refused(f"more than {QUESTIONS} approval questions open at once")
            return "deny"
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            answer = await self._ask(host, port, kind, peer, reason)
            if answer in ("run", "always"):
                self.for_run.add(key)
            fut.set_result(answer)
            return answer
        finally:
            if not fut.done():  # the first asker was cancelled (its client left): the others are denied
                fut.set_result("deny")
            del self._pending[key]

    async def _ask(self, host: str, port: int, kind: str, peer: tuple[str, int] | None, reason: str) -> Answer:
        if self.socket_path is None:
            return "deny"
        qid = uuid.uuid4().hex[:12]
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[qid] = waiter
        try:
            writer = await self._connect()
            writer.write(encode(Request(qid, host, port, kind, reason, peer, timeout=self.timeout)))
            await writer.drain()
            # The launcher enforces the timeout and answers "timeout"; the margin covers a stuck launcher.
            return await asyncio.wait_for(asyncio.shield(waiter), self.timeout + 5)
        except (TimeoutError, OSError, ConnectionError):
            return "deny"
        finally:
            self._waiting.pop(qid, None)

    async def _connect(self) -> asyncio.StreamWriter:
        async with self._lock:
            if self._writer is None or self._writer.is_closing():
                assert self.socket_path is not None
                reader, self._writer = await asyncio.open_unix_connection(self.socket_path)
                asyncio.get_running_loop().create_task(self._read_answers(reader))
            return self._writer

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                qid: str | None
                answer: Answer
                try:
                    msg = decode(line)
                except ProtocolError as e:  # a malformed answer to a question we can name denies it
                    qid, answer = e.id, "deny"
                else:
                    if not isinstance(msg, Decision):
                        continue
                    qid, answer = msg.id, msg.decision
                fut = self._waiting.get(qid) if qid is not None else None
                if fut is not None and not fut.done():
                    fut.set_result(answer)
        finally:
            for fut in self._waiting.values():  # channel closed: everything still waiting is denied
                if not fut.done():
                    fut.set_result("deny")
            self._writer = None

"""One binding's audit records to its run's OpenTelemetry collector, off the event loop (issue 27).

`ExportingLog` is the binding's AuditLog: every record is written to the run's log first, as ever,
then offered to an `Exporter`, which costs the event loop one append under a lock that no I/O ever
holds. The exporter's own thread batches (config.batch records or config.delay seconds), encodes
(netguard.otlplogs) and POSTs with http.client; a collector that hangs, refuses or is slow delays
only that thread: never a decision, and never another run (each binding has its own thread).

Losses are counted, never silent: a record that finds the queue full is dropped (the newest, as the
OTel batch processor does: what is queued stays in order), a batch the collector refused or that
failed after its tries is lost; every loss goes into the run's audit log as `limit` records
(limit "export", one per kind and reason, at most once a second), written through a duplicate of the run's log
descriptor that the thread owns, so the run's own descriptor closes on time. Retries follow the
OTLP spec: 429, 502, 503 and 504 and network errors are tried again with exponential backoff and
jitter (Retry-After honoured), within config.deadline per batch; anything else is final.
When the binding ends the thread sends what is queued within one more config.deadline and exits
(the daemon's exit waits for it, bounded the same way).
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time

from netguard.audit import AuditLog, Kind, Record, limit_record
from netguard.daemon import otlpsend
from netguard.otlp import OtlpConfig

MAX_TRIES = 5
FIRST_BACKOFF = 0.5  # seconds, doubled per try (the OTel SDKs' 1 s, halved: a run's end waits on it)
MAX_BACKOFF = 8.0
RETRYABLE = frozenset({429, 502, 503, 504})
LOSS_EVERY = 1.0  # seconds between two loss records of one kind


def audit_log(fd: int, config: OtlpConfig | None, task: str) -> AuditLog:
    """A binding's log on the run's descriptor `fd`: exporting to the run's collector when it configured one."""
    return AuditLog.from_fd(fd) if config is None else ExportingLog(fd, config, task)


class ExportingLog(AuditLog):
    """A binding's audit log whose records also go to its run's collector (see the module docstring)."""

    def __init__(self, fd: int, config: OtlpConfig, task: str) -> None:
        super().__init__(None)
        self._fd = fd
        self.exporter = Exporter(config, task, os.dup(fd))

    def write(self, record: Record) -> None:
        super().write(record)  # the run's log first: an export never stands in for it
        self.exporter.offer(record)

    def close(self) -> None:
        self.exporter.finish()  # never waits: the thread sends the rest on its own time
        super().close()


class Exporter:
    """The queue and the thread of one binding's export; `offer` and `finish` are for the event loop."""

    def __init__(self, config: OtlpConfig, task: str, fd: int) -> None:
        self.config, self.task = config, task
        self.sent = 0
        self.lost: dict[Kind, int] = {}  # every loss so far, by kind (the log says it too)
        self._log = AuditLog.from_fd(fd)  # the thread's own descriptor of the run's log, for loss records
        self._queue: collections.deque[Record] = collections.deque()
        self._cond = threading.Condition()
        self._full_kinds: dict[Kind, int] = {}  # dropped at the queue since the thread last looked
        self._closing = False
        self._pending: dict[tuple[Kind, str], int] = {}  # losses not yet written, by kind and why
        self._written_at = 0.0
        self._sender = otlpsend.Sender(config)
        self._thread = threading.Thread(target=self._run, name=f"sandgate-otlp-{task[:40]}", daemon=False)
        self._thread.start()

    # ---- the event loop's side --------------------------------------------------------------

    def offer(self, record: Record) -> None:
        """Queue one record; a full queue drops it (counted). Never blocks on I/O."""
        with self._cond:
            if self._closing:
                return
            if len(self._queue) >= self.config.queue:
                self._full_kinds[record["kind"]] = self._full_kinds.get(record["kind"], 0) + 1
                return
            self._queue.append(record)
            if len(self._queue) >= self.config.batch:
                self._cond.notify()

    def finish(self) -> None:
        """The binding is gone: send what is queued (within one more deadline), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (tests; the daemon's exit does it through threading's shutdown)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        final: float | None = None  # the deadline of the sending that follows finish()
        try:
            while True:
                batch, closing = self._next()
                if closing and final is None:
                    final = time.monotonic() + self.config.deadline
                if batch and final is not None and time.monotonic() >= final:
                    for r in batch:
                        self._lose(r["kind"], 1, "the run ended before the collector took them")
                    return  # the rest too, in `finally`
                if batch:
                    self._export(batch, final)
                self._note_full()
                self._write_losses(force=closing and not batch)
                if closing and not batch:
                    return
        finally:
            self._give_up_rest()
            self._sender.close()
            self._log.close()

    def _next(self) -> tuple[list[Record], bool]:
        """The next batch: config.batch records, or what config.delay gathered, or the rest at the end."""
        with self._cond:
            if not self._closing and len(self._queue) < self.config.batch:
                self._cond.wait(self.config.delay)
            n = min(len(self._queue), self.config.batch)
            return [self._queue.popleft() for _ in range(n)], self._closing

    def _note_full(self) -> None:
        with self._cond:
            full, self._full_kinds = self._full_kinds, {}
        for kind, n in full.items():
            self._lose(kind, n, f"the export queue ({self.config.queue} records) was full")

    def _give_up_rest(self) -> None:
        """Whatever is still queued when the thread ends (an error, or past the final deadline) is lost, and said."""
        with self._cond:
            self._closing = True
            rest = list(self._queue)
            self._queue.clear()
        for r in rest:
            self._lose(r["kind"], 1, "the run ended before the collector took them")
        self._note_full()
        self._write_losses(force=True)

    def _export(self, batch: list[Record], final: float | None) -> None:
        from netguard import otlplogs

        try:
            body = otlplogs.request_body(self.config, [otlplogs.entry(r) for r in batch], time.time_ns())
        except Exception as e:  # a bug must cost this batch, said in the log, not the export of the whole run
            for r in batch:
                self._lose(r["kind"], 1, f"sandgate could not encode them ({type(e).__name__})")
            return
        deadline = time.monotonic() + self.config.deadline
        if final is not None:
            deadline = min(deadline, final)
        why = self._send(body, deadline)
        if isinstance(why, int):  # accepted; `why` records rejected by the collector itself
            self.sent += len(batch) - why
            for r in batch[:why]:
                self._lose(r["kind"], 1, "the collector rejected them (partial success)")
            return
        for r in batch:
            self._lose(r["kind"], 1, why)

    def _send(self, body: bytes, deadline: float) -> int | str:
        """POST one batch with the spec's retries: the count the collector rejected, or why it failed."""
        from netguard import otlplogs

        why = "no try fitted in the export deadline"
        for attempt in range(MAX_TRIES):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            answer = self._sender.post(body, min(self.config.timeout, left))
            if answer.status is not None and 200 <= answer.status < 300:
                return otlplogs.rejected(self.config, answer.data)
            why = answer.why
            if answer.status is not None and answer.status not in RETRYABLE:
                return why  # the spec: other answers are final
            wait = otlpsend.backoff(attempt, answer.retry_after, FIRST_BACKOFF, MAX_BACKOFF, random.random())
            if time.monotonic() + wait >= deadline:
                break
            time.sleep(wait)
        return f"{why} (tried until the export deadline of {self.config.deadline:g} s)"

    # ---- loss records -----------------------------------------------------------------------

    def _lose(self, kind: Kind, n: int, why: str) -> None:
        self.lost[kind] = self.lost.get(kind, 0) + n
        self._pending[kind, why] = self._pending.get((kind, why), 0) + n

    def _write_losses(self, force: bool) -> None:
        """The pending loss counts into the run's log, at most once per LOSS_EVERY unless `force`."""
        now = time.monotonic()
        if not self._pending or (not force and now - self._written_at < LOSS_EVERY):
            return
        self._written_at = now
        pending, self._pending = self._pending, {}
        for (kind, why), count in pending.items():
            reason = f"the collector at {self.config.origin()}: {why}"
            try:
                self._log.write(limit_record(self.task, kind, "export", count, reason))
            except OSError:
                pass  # a full disk must not end the export; the count is still in self.lost

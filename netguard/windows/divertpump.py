"""A blocking pydivert handle as the redirect loop's `recv(timeout=...)`: one reader thread per handle.

Why: the pydivert Windows gets is the one mitmproxy allows there (its win32 pin, `pydivert<=3.1.3`;
pyproject.toml follows it), and pydivert 3.1.3's `WinDivert.recv(bufsize)` blocks and takes no
timeout, while the loop (redirect.Redirector) polls two handles and must see a stop. So a reader
thread does the blocking `recv()` and hands each packet over a bounded queue (when it is full the
reader stops reading and WinDivert's own queue holds the rest, bounded by its QUEUE_* parameters).
Threat answered: a loop that cannot run (TypeError on the first recv) or cannot stop. A reader that
fails (a closed handle, the driver unloaded) makes every later recv raise that error, so the loop
ends and removes its permits first (fail closed, win32divert.TransparentPath). Closing the handle
ends a reader blocked in recv: WinDivert's cleanup purges the pending reads (sys/windivert.c v2.2.2,
windivert_cleanup -> WdfIoQueuePurge). A send from the loop's thread while the reader waits in recv
is safe: WinDivert.dll's calls use a per-thread event (dll/windivert.c WinDivertIoControl, TLS).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

#: Packets taken from the driver but not yet handled by the loop (then WinDivert queues the rest).
DEPTH = 4096
ERROR_INVALID_HANDLE = 6


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class Pumped:
    """`inner` (a pydivert.WinDivert, open) with `recv(timeout=...)`; TimeoutError when nothing came."""

    def __init__(self, inner: Any, name: str, depth: int = DEPTH) -> None:
        self.inner = inner
        self._queue: queue.Queue[object] = queue.Queue(depth)
        self._failed: BaseException | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name=f"sandgate-divert-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                item: object = self.inner.recv()  # blocking; no timeout in pydivert 3.1.3
            except BaseException as e:  # the handle failed or was closed: the loop must hear it
                self._put(_Failed(e))
                return
            self._put(item)

    def _put(self, item: object) -> None:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue  # the loop is behind: wait (and let WinDivert queue), unless closed

    def recv(self, bufsize: int = 0, timeout: float | None = None) -> Any:
        """The next packet; TimeoutError after `timeout` (None: wait); OSError once closed or failed."""
        if self._failed is not None:
            raise self._failed
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            try:
                item = self._queue.get(timeout=left)
                break
            except queue.Empty:
                if self._closed.is_set():  # what pydivert says for a closed handle: never a silent wait
                    raise OSError(ERROR_INVALID_HANDLE, "The handle is invalid (the divert handle is closed)") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError from None
        if isinstance(item, _Failed):
            self._failed = item.error
            raise item.error
        return item

    def send(self, packet: Any, recalculate_checksum: bool = True) -> int:
        sent: int = self.inner.send(packet, recalculate_checksum)
        return sent

    def close(self) -> None:
        """Close the handle (which ends the reader); pydivert raises on closing a closed handle."""
        self._closed.set()
        if getattr(self.inner, "is_open", True):
            self.inner.close()

    def reader_alive(self) -> bool:
        return self._thread.is_alive()

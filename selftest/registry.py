"""Live things to close at exit or on SIGTERM: the Worlds, and the tests' throwaway users."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import threading
from typing import Any, Protocol


class Closable(Protocol):
    def close(self) -> None: ...


class Registry[C: Closable]:
    """Live things to close at exit or on SIGTERM (Worlds here; the tests' throwaway users too),
    and a counter for unique names. Each registry chains to the SIGTERM handler installed before it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entered by the SIGTERM handler on the main thread
        self.items: list[C] = []
        self.counter = itertools.count()
        self.hooked = False
        self.prev_sigterm: Any = None

    def next_id(self) -> int:
        with self.lock:
            return next(self.counter)

    def add(self, item: C) -> None:
        with self.lock:
            self.items.append(item)
            if not self.hooked:
                self.hooked = True
                atexit.register(self.close_all)
                self._hook_sigterm()

    def remove(self, item: C) -> None:
        with self.lock:
            if item in self.items:
                self.items.remove(item)

    def close_all(self) -> None:
        with self.lock:
            items = list(reversed(self.items))
        for item in items:
            with contextlib.suppress(Exception):
                item.close()

    def _hook_sigterm(self) -> None:
        """Clean up then die as SIGTERM would have; only if nobody else handles or ignores SIGTERM."""
        if threading.current_thread() is not threading.main_thread():
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN or prev is None:
            return
        self.prev_sigterm = prev
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.close_all()
        prev = self.prev_sigterm
        if callable(prev):
            prev(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

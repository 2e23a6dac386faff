"""CMD's standard streams, relayed between sandgate's own and the pipes CMD was given (W6).

Why: CreateProcessWithLogonW gives CMD a console of its own (on the run's private desktop, where
nobody sees it); only the pipes passed with STARTF_USESTDHANDLES carry its output back. Threads,
because Windows pipes cannot be select()ed. Works on any file descriptors (tested on Linux).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

CHUNK = 65536


def _copy(src: int, dst: int, close_dst: bool) -> None:
    try:
        while data := os.read(src, CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view) :]
    except OSError:
        pass  # a closed reader or writer on either side ends the stream, nothing more
    finally:
        with contextlib.suppress(OSError):
            os.close(dst if close_dst else src)


class Relay:
    """stdin -> CMD (closed at sandgate's EOF, so CMD sees its end); CMD's stdout/stderr -> ours."""

    def __init__(self, to_child: int, from_out: int, from_err: int, ours: tuple[int, int, int] = (0, 1, 2)) -> None:
        self._in = threading.Thread(target=_copy, args=(ours[0], to_child, True), daemon=True)
        self._out = [
            threading.Thread(target=_copy, args=(src, dst, False), daemon=True)
            for src, dst in ((from_out, ours[1]), (from_err, ours[2]))
        ]
        for t in (self._in, *self._out):
            t.start()

    def finish(self, timeout: float = 5.0) -> None:
        """After CMD exited: its last output is written before sandgate says anything more. A process
        of the job that outlives CMD holding the pipes keeps the copies open until the teardown closes
        the job, which comes after this: so `timeout` bounds both streams together, not each."""
        deadline = time.monotonic() + timeout
        for t in self._out:
            t.join(max(0.0, deadline - time.monotonic()))

"""The one accept loop of the unit tests' fake TCP upstreams: each connection served in its own thread."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def serve_in_threads(sock: socket.socket, serve: Callable[[socket.socket], None]) -> None:
    """Accept on `sock` until it is closed; `serve` runs per connection in a daemon thread."""

    def accept() -> None:
        while True:
            try:
                c, _ = sock.accept()
            except OSError:
                return  # closed: the fake is done
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

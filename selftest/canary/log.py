"""The canaries' evidence: an append-only JSON-lines log, one write() per record."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

DATA_LIMIT = 100
RAW_LIMIT = 512  # dns: per record text, and of an unparsable message


def fmt_peer(addr: Any) -> str:
    """ "ip:port" string; the tests compare peers as plain strings."""
    return f"{addr[0]}:{addr[1]}"


class JsonLog:
    """Append-only JSON-lines log; one write() per record so a crash leaves at most a partial last line."""

    def __init__(self, path: str, server: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.server = server
        self.lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        record = {**record, "server": self.server, "t": time.time()}
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)

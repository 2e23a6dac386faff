"""Where a chunked body ends, in a byte stream read piece by piece. Pure.

The front door's plain-HTTP path (netguard.daemon.plainhttp) forwards a chunked response as it reads
it, byte for byte, and must know where it ends: the next bytes on a kept-alive connection are the next
response's. Anything malformed raises ValueError, and the connection ends: a guessed end would hand a
later request the wrong response.
"""

from __future__ import annotations

import re

LINE_MAX = 4096  # a chunk-size line (with extensions) or a trailer line
TRAILER_MAX = 32 * 1024
_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[\t\x20-\x7e\x80-\xff]*)?")


class Chunked:
    """Feed the body's bytes in order; `feed` says where in a piece the body ended. `data`: payload bytes so far."""

    def __init__(self, trailers: bool = True) -> None:
        self.trailers = trailers  # False (a request body): a trailer field raises; no rule reads them
        self.data = 0
        self._state = "size"  # size, data, crlf, trailer, done
        self._line = b""
        self._left = 0
        self._trailer = 0

    def feed(self, piece: bytes) -> int | None:
        """The offset in `piece` just past the body's end, or None if the body goes on."""
        i, n = 0, len(piece)
        while i < n:
            if self._state == "data":
                take = min(self._left, n - i)
                self._left -= take
                self.data += take
                i += take
                if self._left == 0:
                    self._state = "crlf"
                continue
            j = piece.find(b"\n", i)
            line = self._line + piece[i : n if j < 0 else j + 1]
            if j < 0:
                if len(line) > LINE_MAX:
                    raise ValueError("chunked body: line too long")
                self._line = line
                return None
            self._line, i = b"", j + 1
            if self._line_done(line):
                return i
        return None

    def _line_done(self, line: bytes) -> bool:
        """One whole line (with its LF) in the current state; True once the body is complete."""
        if not line.endswith(b"\r\n"):
            raise ValueError("chunked body: bare LF")
        text = line[:-2]
        if self._state == "crlf":
            if text:
                raise ValueError("chunked body: no CRLF after a chunk")
            self._state = "size"
            return False
        if self._state == "size":
            m = _SIZE.fullmatch(text)
            if m is None:
                raise ValueError("chunked body: bad chunk size")
            self._left = int(m.group(1), 16)
            self._state = "data" if self._left else "trailer"
            return False
        # trailer fields, then the empty line that ends the body
        self._trailer += len(line)
        if self._trailer > TRAILER_MAX:
            raise ValueError("chunked body: trailer too large")
        if not text:
            self._state = "done"
            return True
        if not self.trailers:  # e.g. `X-HTTP-Method-Override: DELETE` after the last chunk, past the judgement
            raise ValueError("chunked body: trailer fields in a request (not forwarded: no rule reads them)")
        return False

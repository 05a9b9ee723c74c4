"""A chunked HTTP body (``Transfer-Encoding: chunked``) decoded as it arrives, each byte looked at once.

:meth:`ChunkedBody.feed` takes what came in since the last call and returns
how much of it was used; what it leaves (at most a part of a chunk-size or
trailer line) is given again, with more after it, on the next call. The
chunks' data is appended to :attr:`ChunkedBody.body`.
"""

from __future__ import annotations

from .faults import FramingError

__all__ = ["ChunkedBody"]

# A chunk-size or trailer line longer than this is refused (RFC 9112 sets no limit; real ones are short:
# hex digits and, rarely, an extension).
MAX_LINE_BYTES = 4096
_HEX = frozenset(b"0123456789abcdefABCDEF")
# A chunk size of more hex digits than this (64 bits) is refused unread.
MAX_SIZE_DIGITS = 16

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedBody:
    """The decoder of one chunked body; ``limit`` bounds the body (past it, a :class:`FramingError`)."""

    __slots__ = ("_left", "_state", "body", "limit", "origin")

    def __init__(self, limit: int, origin: str) -> None:
        self.body = bytearray()
        self.limit = limit
        self.origin = origin
        self._state = _SIZE
        self._left = 0

    @property
    def done(self) -> bool:
        """The last chunk and the trailers are in."""
        return self._state == _DONE

    def feed(self, data: bytearray, end: int) -> int:
        """Decode ``data[:end]``; returns the bytes used (the rest is an unfinished line)."""
        pos = 0
        while pos < end and self._state != _DONE:
            state = self._state
            if state == _DATA:
                take = min(self._left, end - pos)
                self.body += memoryview(data)[pos : pos + take]
                self._left -= take
                pos += take
                if self._left == 0:
                    self._state = _DATA_END
            elif state == _DATA_END:
                closing = data[pos : min(pos + 2, end)]
                if closing != b"\r\n"[: len(closing)]:  # (a lone LF fails at once: no CR is coming)
                    raise FramingError(f"{self.origin} sent a chunk without its closing CRLF (a bare LF, or data)")
                if len(closing) < 2:
                    break
                pos += 2
                self._state = _SIZE
            else:
                line_end = data.find(b"\r\n", pos, end)
                if line_end < 0:
                    if end - pos > MAX_LINE_BYTES:
                        raise FramingError(f"{self.origin} sent a chunk line over {MAX_LINE_BYTES} bytes")
                    if data.find(b"\n", pos, end) >= 0:  # a line ended by a bare LF: no CRLF may come to end it
                        raise FramingError(f"{self.origin} sent a chunk line ending in a bare LF, not CRLF")
                    break
                line = bytes(data[pos:line_end])
                pos = line_end + 2
                if state == _SIZE:
                    self._size(line)
                elif not line:  # the empty line after the trailers
                    self._state = _DONE
        return pos

    def _size(self, line: bytes) -> None:
        digits = line.split(b";", 1)[0].strip()
        if not digits or not _HEX.issuperset(digits) or len(digits) > MAX_SIZE_DIGITS:
            raise FramingError(f"{self.origin} sent a malformed chunk size {line[:40]!r}")
        size = int(digits, 16)
        if len(self.body) + size > self.limit:
            raise FramingError(f"{self.origin} sent a chunked body over {self.limit} bytes")
        if size == 0:
            self._state = _TRAILER
        else:
            self._left, self._state = size, _DATA

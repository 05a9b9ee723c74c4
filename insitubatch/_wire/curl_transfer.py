"""One libcurl easy handle, reused GET after GET: its answer's head, its body in one buffer, and what they mean.

A :class:`Transfer` keeps one ``pycurl.Curl`` (its options are set once)
and runs one GET (a ``connection.Ask``) at a time. libcurl hands the
answer's header lines and body pieces to two callbacks: the head gives the
status, ``Content-Length``, ``Content-Range`` and, for a redirect,
``Location`` and S3's ``x-amz-bucket-region``; the body is copied into a
``bytearray`` allocated once at the announced length (grown only when none
was announced). :meth:`Transfer.outcome` judges the finished GET as the
engine's own client (``connection``) does, with the same fault types
(``faults``): the body, a :class:`Redirect` for the backend to follow, or
the exception ``read_policy.classify`` sorts. A 200 to a ranged GET is cut
to the range, and refused (``RangeIgnoredError``) when more than
``connection.IGNORED_RANGE_SLACK_BYTES`` would come before it, without
receiving the object.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pycurl

from .connection import IGNORED_RANGE_SLACK_BYTES, Ask
from .faults import (
    ERROR_QUOTE_BYTES,
    FramingError,
    HttpStatusError,
    RangeIgnoredError,
    RangeMismatchError,
    TlsRefusedError,
)

__all__ = ["Redirect", "Transfer"]

_REDIRECT = range(300, 400)
# libcurl's codes for a connection that broke or a body that stopped short (a transient fault).
_CUT = (pycurl.E_RECV_ERROR, pycurl.E_PARTIAL_FILE, pycurl.E_GOT_NOTHING, pycurl.E_SEND_ERROR)
# ... and for an answer its parser refused (a status line, a header); a bad chunk size is a receive error
# whose message names the chunk.
_UNFRAMED = (pycurl.E_UNSUPPORTED_PROTOCOL, pycurl.E_FTP_WEIRD_SERVER_REPLY)  # (pycurl's name for WEIRD_SERVER_REPLY)
# The largest Content-Length libcurl can hold (a curl_off_t); a longer one is a framing fault.
MAX_CONTENT_LENGTH = (1 << 63) - 1


class Redirect(NamedTuple):
    """A 3xx answer: for the backend to follow, hand to obstore, or refuse (``redirects.next_hop``)."""

    status: int
    location: str | None
    region: str | None


class Transfer:
    """One easy handle and the state of the GET it runs now."""

    def __init__(self, easy: Any, connect_timeout_s: float) -> None:
        self.easy = easy
        self.connect_timeout_s = connect_timeout_s
        self.future: Any = None
        self.ask: Ask | None = None
        self.origin = ""
        self._span: str | None = None
        self._region: str | None = None  # the S3 region this handle signs for (None: the store's own)
        self._reset()
        easy.setopt(pycurl.HEADERFUNCTION, self._header)
        easy.setopt(pycurl.WRITEFUNCTION, self._write)

    def _reset(self) -> None:
        self._status = 0
        self._length = -1
        self._answered: bytes | None = None
        self._location: bytes | None = None
        self._bucket_region: bytes | None = None
        self._body: bytearray | None = None
        self._view: memoryview | None = None
        self._got = 0
        self._cap: int | None = None  # a 200 to a range: keep at most this many bytes
        self._stopped = False  # ... and they are in: the rest was not received
        self._failure: BaseException | None = None  # what a callback refused the answer for

    def start(self, url: str, origin: str, ask: Ask, future: Any) -> None:
        """Set the handle up for ``GET url`` (``origin``: its ``scheme://host:port``) answering ``future``."""
        easy = self.easy
        easy.setopt(pycurl.URL, url)
        if ask.span != self._span:
            easy.setopt(pycurl.RANGE, ask.span)
            self._span = ask.span
        self.ask, self.origin, self.future = ask, origin, future
        self._reset()

    def sign_for(self, region: str | None, sigv4: str | None) -> None:
        """Sign this handle's GETs for ``region`` (``sigv4``: libcurl's string for it; None: the store's own)."""
        if region != self._region and sigv4 is not None:
            self.easy.setopt(pycurl.AWS_SIGV4, sigv4)
            self._region = region

    def release(self) -> None:
        """Drop the finished GET's buffers (the handle stays for the next one)."""
        self.future = self.ask = None
        self._body = self._view = None

    # -- libcurl's callbacks (on the loop thread, inside socket_action) ------------------------------------------
    def _header(self, line: bytes) -> int | None:
        if line[:5] == b"HTTP/":  # a new answer (an interim 1xx, a proxy's CONNECT): start over
            try:
                self._status = int(line.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self._failure = FramingError(f"{self.origin} sent a malformed status line {line[:80]!r}")
                return 0
            self._length, self._answered, self._location, self._bucket_region = -1, None, None, None
            return None
        if line == b"\r\n":
            return self._head_done()
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                self._length = int(value)
            except ValueError:
                self._length = -1
            if not 0 <= self._length <= MAX_CONTENT_LENGTH:
                self._failure = FramingError(f"{self.origin} sent Content-Length {value.strip()[:40]!r}")
                return 0
        elif name == b"content-range":
            self._answered = value.strip()
        elif name == b"location":
            self._location = value.strip()
        elif name == b"x-amz-bucket-region":
            self._bucket_region = value.strip()
        return None

    def _head_done(self) -> int | None:
        """The head is in: a 200 to a ranged GET is cut to the range, or refused if much would come first."""
        ask = self.ask
        if self._status != 200 or ask is None or ask.want is None:
            return None
        start, stop = ask.want
        length = self._length if self._length >= 0 else None
        if start >= 0:
            before = start
            if length is None or length - stop > IGNORED_RANGE_SLACK_BYTES:
                self._cap = stop  # stop once the range is in
        elif length is not None:
            before = max(0, length + start)
        else:  # a suffix of a body of unknown length: bounded
            before, self._cap = 0, -start + IGNORED_RANGE_SLACK_BYTES + 1
        if before > IGNORED_RANGE_SLACK_BYTES:
            size = "" if length is None else f" of {length} bytes"
            self._failure = RangeIgnoredError(
                f"GET {ask.target}: asked bytes={ask.span}, {self.origin} answered 200 with the whole object{size}: "
                "the server ignores Range requests (obstore refuses it too); serve the store from one that honours "
                "them"
            )
            return 0  # libcurl aborts the transfer: the object is not received
        return None

    def _write(self, data: bytes) -> int | None:
        got = self._got
        end = got + len(data)
        view = self._view
        if view is None:
            if self._body is None:
                status, length, cap = self._status, self._length, self._cap
                if 200 <= status < 300 and length >= 0:
                    self._body = bytearray(length if cap is None else min(length, cap))
                    self._view = view = memoryview(self._body)
                else:
                    self._body = bytearray()
            if view is None:  # no length announced (or an error body): grow; an error body only to its quote
                if self._cap is not None and end > self._cap:
                    return self._cut(data, self._cap - got)
                if 200 <= self._status < 300 or got < ERROR_QUOTE_BYTES:
                    self._body += data
                self._got = end
                return None
        if end > len(view):
            if self._cap is not None and len(view) == self._cap:
                return self._cut(data, self._cap - got)
            self._failure = FramingError(f"{self.origin} sent more than its Content-Length")
            return 0
        view[got:end] = data
        self._got = end
        if end == self._cap and end < self._length:  # the range is in: the rest is not needed
            self._stopped = True
            return 0
        return None

    def _cut(self, data: bytes, room: int) -> int:
        """Keep ``room`` more bytes of a 200 to a range and stop receiving (a suffix that overflows is refused)."""
        ask = self.ask
        assert ask is not None and ask.want is not None
        if ask.want[0] < 0:
            self._failure = RangeIgnoredError(
                f"GET {ask.target}: asked bytes={ask.span}, {self.origin} answered 200 with more than "
                f"{self._cap} bytes: the server ignores Range requests"
            )
            return 0
        if self._view is not None:
            self._view[self._got :] = data[:room]
        else:
            self._body += data[:room]  # type: ignore[operator]
        self._got += room
        self._stopped = True
        return 0  # libcurl stops the transfer (and closes its connection)

    # -- the result ------------------------------------------------------------------------------------------------
    def outcome(self, errno: int, message: str) -> tuple[Any, BaseException | Redirect | None]:
        """The finished GET's body (a ``bytearray``), a :class:`Redirect`, or its exception."""
        ask = self.ask
        assert ask is not None
        if self._failure is not None:
            return None, self._failure
        if errno and not (errno == pycurl.E_WRITE_ERROR and self._stopped):
            return None, self._transport_error(errno, message)
        status, body = self._status, self._body if self._body is not None else bytearray()
        if 200 <= status < 300:
            if self._view is not None and self._got != len(body):
                return None, ConnectionResetError(f"GET {ask.target}: {self._got} of {len(body)} body bytes arrived")
            if status == 206 and ask.want is not None:
                return self._ranged(ask, body)
            if status == 200 and ask.want is not None:  # a server that ignored the Range header: cut to it
                start, stop = ask.want
                body = body[start:stop] if start >= 0 else body[start:]
            return body, None
        if status in _REDIRECT and status != 304:
            location = None if self._location is None else self._location.decode("latin-1")
            region = None if self._bucket_region is None else self._bucket_region.decode("latin-1")
            return None, Redirect(status, location, region)
        if status == 404:
            return None, FileNotFoundError(f"GET {ask.target}: status code: 404")
        if status in (401, 403):
            return None, PermissionError(f"GET {ask.target}: status code: {status}: {bytes(body[:200])!r}")
        return None, HttpStatusError(status, ask.target, bytes(body))

    def _ranged(self, ask: Ask, body: bytearray) -> tuple[Any, BaseException | None]:
        """A 206's ``Content-Range`` and length against the range asked for (as ``connection`` checks them)."""
        assert ask.want is not None
        start, stop = ask.want
        answered = self._answered
        try:
            assert answered is not None
            unit, _, rest = answered.partition(b" ")
            span, _, total_text = rest.partition(b"/")
            first_text, _, last_text = span.partition(b"-")
            first, last = int(first_text), int(last_text)
            total = None if total_text.strip() == b"*" else int(total_text)
            if unit.lower() != b"bytes":
                raise ValueError(unit)
        except (AssertionError, ValueError):
            sent = "no Content-Range" if answered is None else f"Content-Range {answered[:80].decode('latin-1')!r}"
            return None, self._mismatch(ask, sent)
        if start >= 0:
            end = stop if total is None else min(stop, total)
            right = first == start and (last == end - 1 if total is not None else last < stop)
        elif total is not None:
            right = first == max(0, total + start) and last == total - 1
        else:
            right = last - first + 1 <= -start
        right = right and first <= last and (total is None or last < total)
        if not right or len(body) != last - first + 1:
            return None, self._mismatch(ask, f"Content-Range {answered.decode('latin-1')!r} and {len(body)} body bytes")
        return body, None

    def _mismatch(self, ask: Ask, sent: str) -> RangeMismatchError:
        return RangeMismatchError(f"GET {ask.target}: asked bytes={ask.span}, {self.origin} sent {sent}")

    def _transport_error(self, errno: int, message: str) -> BaseException:
        target = "?" if self.ask is None else self.ask.target
        text = f"GET {target} on {self.origin}: {message or 'libcurl error'} (libcurl code {errno})"
        if errno == pycurl.E_OPERATION_TIMEDOUT:
            tls = self.origin.startswith("https:")
            connected = self.easy.getinfo(pycurl.APPCONNECT_TIME if tls else pycurl.CONNECT_TIME) > 0
            if not connected:  # (as the engine's pool words it)
                return TimeoutError(f"connecting to {self.origin} took over {self.connect_timeout_s:g}s ({message})")
            return TimeoutError(text)
        if errno in _UNFRAMED or (errno == pycurl.E_RECV_ERROR and "chunk" in message):
            return FramingError(f"{self.origin} sent an answer libcurl cannot frame: {message} (GET {target})")
        if errno == pycurl.E_COULDNT_CONNECT:
            return ConnectionRefusedError(text)
        if errno == pycurl.E_PEER_FAILED_VERIFICATION:
            return TlsRefusedError(f"{self.origin} presented a certificate that does not verify: {message}")
        if errno in _CUT:
            return ConnectionResetError(text)
        return ConnectionError(text)

"""One libcurl easy handle, reused GET after GET: its answer's head, its body in one buffer, and what it means.

A :class:`Transfer` keeps one ``pycurl.Curl`` (so its options are set
once) and is started for one GET at a time. libcurl hands the answer's
header lines and body pieces to two callbacks: the head says the status,
``Content-Length`` and ``Content-Range``; the body is copied into a
``bytearray`` allocated once at the announced length (grown only when no
length was announced). :meth:`Transfer.outcome` turns the finished GET into
its body or the exception ``read_policy.classify`` sorts: 404
``FileNotFoundError``, 401/403 ``PermissionError``, any other non-2xx
``HttpStatusError`` (``status code: NNN``), a transport failure
``ConnectionError`` or ``TimeoutError``, an unverifiable certificate
``ssl.SSLCertVerificationError``, and an answered range other than the one
asked for :class:`RangeAnswerError`.
"""

from __future__ import annotations

import ssl
from typing import Any

import pycurl

from .http import HttpStatusError

__all__ = ["RangeAnswerError", "TooManyRedirectsError", "Transfer"]

# How much of an error body is kept for the exception's message (as _wire.http quotes it).
ERROR_QUOTE_BYTES = 512
_REDIRECTS = (301, 302, 303, 307, 308)


class RangeAnswerError(OSError, ValueError):
    """A 206 whose ``Content-Range`` is not the range asked for (a server or proxy fault; trying again will not help)."""


class TooManyRedirectsError(OSError, ValueError):
    """A GET redirected more than ``curl_config.MAX_REDIRECTS`` times (a loop, as a rule)."""


class Transfer:
    """One easy handle and the state of the GET it runs now."""

    def __init__(self, easy: Any) -> None:
        self.easy = easy
        self.future: Any = None
        self.url = ""
        self._span: str | None = None
        self._want: tuple[int, int] | None = None
        self._status = 0
        self._length = -1
        self._answered: bytes | None = None
        self._body: bytearray | None = None
        self._view: memoryview | None = None
        self._got = 0
        self._overflow = False
        easy.setopt(pycurl.HEADERFUNCTION, self._header)
        easy.setopt(pycurl.WRITEFUNCTION, self._write)

    def start(self, url: str, query: str, span: str | None, want: tuple[int, int] | None, future: Any) -> None:
        """Set the handle up for ``GET url?query`` with ``Range: bytes=span`` (None: no range) answering ``future``.

        ``want`` is the range as ``(start, stop)`` (``stop`` exclusive, past
        the end for "to the end"), or ``(-suffix, 0)``: what a 206 must
        answer. Messages name ``url`` only: a query may carry a token.
        """
        easy = self.easy
        easy.setopt(pycurl.URL, url + query if query else url)
        if span != self._span:
            easy.setopt(pycurl.RANGE, span)
            self._span = span
        self.url, self._want, self.future = url, want, future
        self._status, self._length, self._answered = 0, -1, None
        self._body = self._view = None
        self._got, self._overflow = 0, False

    def release(self) -> None:
        """Drop the finished GET's buffers (the handle stays for the next one)."""
        self.future = None
        self._body = self._view = None

    # -- libcurl's callbacks (on the loop thread, inside socket_action) ------------------------------------------
    def _header(self, line: bytes) -> None:
        if line[:5] == b"HTTP/":  # a new answer (an interim 1xx, a redirect, a proxy's CONNECT): start over
            try:
                self._status = int(line.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self._status = 0
            self._length, self._answered, self._body, self._view, self._got = -1, None, None, None, 0
            return
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                self._length = int(value)
            except ValueError:
                self._length = -1
        elif name == b"content-range":
            self._answered = value.strip()

    def _write(self, data: bytes) -> int | None:
        got = self._got
        end = got + len(data)
        view = self._view
        if view is None:
            if self._body is None:
                if 200 <= self._status < 300 and self._length >= 0:
                    self._body = bytearray(self._length)
                    self._view = view = memoryview(self._body)
                else:
                    self._body = bytearray()
            if view is None:  # no length announced (or an error body): grow; an error body only to its quote
                if 200 <= self._status < 300 or got < ERROR_QUOTE_BYTES:
                    self._body += data
                self._got = end
                return None
        if end > len(view):
            self._overflow = True
            return 0  # libcurl aborts the transfer (a write error)
        view[got:end] = data
        self._got = end
        return None

    # -- the result ------------------------------------------------------------------------------------------------
    def outcome(self, errno: int, message: str) -> tuple[Any, BaseException | None]:
        """The finished GET's body (a ``bytearray``) or its exception, from libcurl's code and the answer."""
        if errno:
            return None, self._transport_error(errno, message)
        status, body = self._status, self._body if self._body is not None else bytearray()
        if 200 <= status < 300:
            if self._view is not None and self._got != len(body):
                return None, ConnectionResetError(f"GET {self.url}: {self._got} of {len(body)} body bytes arrived")
            if status == 206 and self._want is not None:
                return self._ranged(body)
            if status == 200 and self._want is not None:  # a server that ignored the Range header
                start, stop = self._want
                body = body[start:stop] if start >= 0 else body[start:]
            return body, None
        if status == 404:
            return None, FileNotFoundError(f"GET {self.url}: status code: 404")
        if status in (401, 403):
            return None, PermissionError(f"GET {self.url}: status code: {status}: {bytes(body[:200])!r}")
        return None, HttpStatusError(status, self.url, bytes(body))

    def _ranged(self, body: bytearray) -> tuple[Any, BaseException | None]:
        """Check a 206's ``Content-Range`` against the range asked for."""
        assert self._want is not None
        start, stop = self._want
        answered = self._answered or b""
        try:
            unit, _, rest = answered.partition(b" ")
            span, _, total = rest.partition(b"/")
            first, _, last = span.partition(b"-")
            a, b = int(first), int(last)
            size = None if total.strip() == b"*" else int(total)
        except ValueError:
            return None, RangeAnswerError(f"GET {self.url}: a 206 with Content-Range {answered[:80]!r}")
        if start >= 0:
            end = stop if size is None else min(stop, size)
            good = a == start and (b == end - 1 if size is not None else b <= end - 1)
        else:
            good = size is not None and a == max(0, size + start) and b == size - 1
        if unit != b"bytes" or not good or b - a + 1 != len(body):
            asked = f"{start}-{stop - 1}" if start >= 0 else f"the last {-start}"
            return None, RangeAnswerError(
                f"GET {self.url}: asked for bytes {asked}, answered Content-Range {answered[:80].decode('latin-1')!r} "
                f"with {len(body)} bytes"
            )
        return body, None

    def _transport_error(self, errno: int, message: str) -> BaseException:
        text = f"GET {self.url}: {message or 'libcurl error'} (libcurl code {errno})"
        if errno == pycurl.E_WRITE_ERROR and self._overflow:
            return ConnectionError(f"GET {self.url}: the server sent more than its Content-Length")
        if errno == pycurl.E_OPERATION_TIMEDOUT:
            return TimeoutError(text)
        if errno == pycurl.E_COULDNT_CONNECT:
            return ConnectionRefusedError(text)
        if errno == pycurl.E_PEER_FAILED_VERIFICATION:
            return ssl.SSLCertVerificationError(text)
        if errno == pycurl.E_TOO_MANY_REDIRECTS:
            return TooManyRedirectsError(text)
        if errno in (pycurl.E_RECV_ERROR, pycurl.E_PARTIAL_FILE, pycurl.E_GOT_NOTHING, pycurl.E_SEND_ERROR):
            return ConnectionResetError(text)
        return ConnectionError(text)

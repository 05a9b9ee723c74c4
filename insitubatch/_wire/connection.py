"""One kept-alive HTTP/1.1 connection on the event loop: a GET out, its answer framed, checked and received in place.

A connection is an asyncio ``BufferedProtocol``: a body of known length is
received straight into its own (uninitialised) buffer; a chunked body is
decoded as it arrives (``chunked``), an unframed one runs to the close (a
206's to the length its ``Content-Range`` names; over TLS, a close without
close_notify is no end but an error). What the answer must hold
is checked before its bytes are returned: a 206's ``Content-Range`` and
length against the range asked (:class:`~.faults.RangeMismatchError`
otherwise); a 200 to a ranged GET is used only where it provably is the
whole object (``ranges``), else refused
(:class:`~.faults.RangeIgnoredError`) without receiving its body, as is any
other 2xx to a ranged GET. Heads whose lines end in a bare LF are read as if
they ended in CRLF, and empty lines before a status line (a stray CRLF after
the last body) are skipped, as obstore's client does; a transfer coding
other than ``chunked`` is refused (:class:`~.faults.UnsupportedBodyError`).
A 3xx with ``Location`` goes to the request's backend
(``Ask.backend.redirected``), which follows it. Whatever goes wrong inside a
protocol callback fails the GET with one error and closes the connection;
nothing reaches asyncio's "Fatal error" log.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from typing import Any, Protocol

import numpy as np

from .chunked import ChunkedBody
from .faults import FramingError, HttpStatusError, NoSuchBucketError, RangeMismatchError, UnsupportedBodyError
from .ranges import IGNORED_RANGE_SLACK_BYTES, check_206, mismatch, not_a_range, whole_200, within

__all__ = ["IGNORED_RANGE_SLACK_BYTES", "Ask", "Connection"]

# Status line and headers must fit in HEAD_BYTES; a larger head is refused. obstore's client (hyper) reads a head of
# up to about 500 KB (obstore 0.12: one of 505,000 bytes read, one of 510,000 refused), so this one reads as far.
# The head buffer starts at FIRST_HEAD_BYTES and doubles as a head needs (back to its first size for the next GET);
# a chunked or unframed body passes through it in pieces of STREAM_BUFFER_BYTES.
HEAD_BYTES = 512 << 10
FIRST_HEAD_BYTES = 8 << 10
STREAM_BUFFER_BYTES = 256 << 10
# A Content-Length (or chunked body) past this is a corrupt or hostile answer, refused before any allocation:
# the largest object the loader reads whole is a stored chunk, at most io.arrays.MAX_CHUNK_BYTES (4 GiB) unless
# raised (the engine's client reads a read of any size itself, chunked or not).
MAX_BODY_BYTES = 1 << 36
# A Content-Length of more digits than this is refused unread (MAX_BODY_BYTES has 11).
MAX_LENGTH_DIGITS = 20
# An error answer's body is kept up to this (its message quotes the start); the rest is not received.
ERROR_BODY_BYTES = 64 << 10
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# A plain connection with at least LOWAT_FROM_BYTES of a body still to come asks the kernel to report it readable
# only once that much has arrived (SO_RCVLOWAT, at most LOWAT_MAX_BYTES at a time): a body paced by the link is
# then taken in one wake-up of the loop, not one per TCP segment. (Not over TLS: a record already read in part
# would hold bytes the socket never sees again.)
LOWAT_FROM_BYTES = 64 << 10
LOWAT_MAX_BYTES = 1 << 20
_LINE_ENDS = frozenset(b"\r\n")
# The status lines read: HTTP/1.x, as obstore's client (hyper) reads them (no other version, no lower case).
_VERSIONS = frozenset({b"HTTP/1.1", b"HTTP/1.0"})
# A header line: a name (an RFC 9110 token: no whitespace, no folding) and a colon.
_FIELD_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:")


def _header(head: bytes, name: bytes, lowered: bytes | None = None) -> bytes:
    """The value of header ``name`` (``b"\\r\\nname:"``, lowered) in ``head``, stripped; ``b""`` if absent.

    ``lowered`` is ``head`` lowered, where the name is looked for (``head`` itself when it is lowered already).
    """
    at = (head if lowered is None else lowered).find(name)
    if at < 0:
        return b""
    start = at + len(name)
    return head[start : head.index(b"\r\n", start)].strip()


class Pool(Protocol):
    """What a connection needs of its pool (``pool.HttpPool``)."""

    origin: str

    def send(self, request: bytes, future: asyncio.Future, ask: Ask, retried: bool = False) -> None: ...

    def idle_again(self, connection: Connection) -> None: ...

    def forget(self, connection: Connection) -> None: ...

    def keep_tls(self, connection: Connection) -> None: ...


class Ask:
    """One GET as its answer is checked: the path (messages name no query), the range, who follows redirects.

    ``want`` is ``(start, stop)`` (a suffix of ``n`` bytes is ``(-n, 0)``),
    or ``None`` for a plain GET; ``span`` the ``Range`` header's value.
    ``version``: None for an ordinary GET, else a versioned one, answered
    with ``(body, etag)``: ``""`` asks for the ETag, an ETag is the
    ``If-Match`` the GET carries; ``etag`` the one the answer named.
    """

    __slots__ = ("backend", "byte_range", "etag", "hops", "key", "span", "target", "version", "want")

    def __init__(
        self, backend: Any, key: str, byte_range: Any, target: str, span: str | None, want: tuple[int, int] | None
    ) -> None:
        self.backend = backend
        self.key = key
        self.byte_range = byte_range
        self.target = target
        self.span = span
        self.want = want
        self.hops = 0
        self.version: str | None = None
        self.etag: str | None = None


class Connection(asyncio.BufferedProtocol):
    """One kept-alive connection: at most one GET at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.origin = pool.origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # it has answered a GET (so a drop before any byte may be an idle close)
        self.idle_since = 0.0
        self._future: asyncio.Future | None = None
        self._ask: Ask | None = None
        self._request = b""
        self._head = bytearray(FIRST_HEAD_BYTES)
        self._head_view = memoryview(self._head)
        self._filled = 0
        self._socket: Any = None  # the plain connection's socket (its SO_RCVLOWAT is set), None over TLS
        self._lowat = 1
        self._reset()

    def _reset(self) -> None:
        # a body of known length is received into an uninitialised numpy array (a bytearray would be zeroed first:
        # a pass over every byte, a GET's worth of cache, for nothing); a streamed one grows in a bytearray
        self._body: bytearray | np.ndarray | None = None
        self._body_view: memoryview | None = None
        self._got = 0
        self._status = 0
        self._keep = True
        self._chunks: ChunkedBody | None = None
        self._until_eof = False
        self._stop_at = MAX_BODY_BYTES  # body bytes after which the answer is complete (the rest is not read)
        self._expect: int | None = None  # a 206's length, checked at the end of a chunked or unframed body
        self._cut: tuple[int, int, int] | None = None  # the range within a 200's whole object, and its size
        self._location: bytes | None = None
        self._region: bytes | None = None

    # -- asyncio protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if getattr(self.pool, "ssl", None) is None and hasattr(socket, "SO_RCVLOWAT"):
            self._socket = transport.get_extra_info("socket")

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body_view is not None:
            return self._body_view[self._got :]
        if self._filled == len(self._head):  # a head still arriving: grow it (refused past HEAD_BYTES)
            self._regrow(2 * len(self._head))
        return self._head_view[self._filled :]

    def _regrow(self, size: int) -> None:
        """A new head buffer of ``size`` holding what has come so far (the old one may still be exported)."""
        head = bytearray(size)
        head[: self._filled] = self._head_view[: self._filled]
        self._head, self._head_view = head, memoryview(head)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._body_view is not None:
                self._got += nbytes
                if self._got == len(self._body_view):
                    self._complete()
                elif self._lowat > 1:
                    self._await_rest()
                return
            self._filled += nbytes
            if self._future is None:
                if bytes(self._head_view[: self._filled]).strip(b"\r\n"):
                    self._fail(FramingError(f"{self.origin} sent bytes nobody asked for"))
                self._filled = 0  # (empty lines after a body, as some servers send: dropped)
            elif self._status == 0:
                self._parse_head()
            else:
                self._stream()
        except Exception as exc:  # a fault here fails the GET; asyncio would log it and hang the read
            self._fail(exc if isinstance(exc, OSError) else FramingError(f"{self.origin}: {exc!r}"))

    def eof_received(self) -> bool:
        try:
            if self._until_eof and self._future is not None and self._status:
                if not self._closed_cleanly():
                    ask = self._ask
                    raise ConnectionResetError(
                        f"{self.origin} ended the TLS connection without close_notify during GET "
                        f"{'' if ask is None else ask.target}: a body framed by the close may be cut short"
                    )
                self._done_streaming()
        except Exception as exc:
            self._fail(exc if isinstance(exc, OSError) else FramingError(f"{self.origin}: {exc!r}"))
        return False

    def _closed_cleanly(self) -> bool:
        """Whether the server's close ends a body framed by it: over TLS, only with close_notify (RFC 9112 9.8).

        asyncio reports the end of a TLS stream alike with and without
        close_notify; its TLS object then reads ``b""`` after one, and wants
        more bytes after a bare close (a truncation, a middlebox's cut).
        """
        tls = None if self.transport is None else self.transport.get_extra_info("ssl_object")
        if tls is None:
            return True
        try:
            return tls.read(1) == b""
        except ssl.SSLError:  # (SSLWantReadError: no close_notify came)
            return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.pool.forget(self)
        future, self._future = self._future, None
        if future is None or future.done():
            return
        ask = self._ask
        if self.used and self._status == 0 and self._filled == 0 and ask is not None:
            self.pool.send(self._request, future, ask, retried=True)  # the server closed it while idle
            return
        target = "" if ask is None else f" during GET {ask.target}"
        future.set_exception(ConnectionResetError(f"{self.origin} closed the connection{target}"))

    # -- requests ----------------------------------------------------------------------------------------------
    def send(self, request: bytes, future: asyncio.Future, ask: Ask) -> None:
        self._future = future
        self._ask = ask
        self._request = request
        self._filled = 0
        if len(self._head) > FIRST_HEAD_BYTES:  # grown for a long head or a streamed body: back to its first size
            self._head = bytearray(FIRST_HEAD_BYTES)
            self._head_view = memoryview(self._head)
        self._reset()
        future.add_done_callback(self._abandoned)
        assert self.transport is not None
        self.transport.write(request)

    def _abandoned(self, future: asyncio.Future) -> None:
        if future.cancelled() and future is self._future:
            self._future = None
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None and not self.loop.is_closed():
                self.transport.abort()

    # -- the head ----------------------------------------------------------------------------------------------
    def _parse_head(self) -> None:
        buffer, filled = self._head, self._filled
        if filled and buffer[0] in _LINE_ENDS:  # empty lines before the status line (a stray CRLF after a body)
            skip = 0
            while skip < filled and buffer[skip] in _LINE_ENDS:
                skip += 1
            self._shift(skip)
            filled = self._filled
        # the head ends at an empty line: CRLF CRLF, or (bare-LF lines, which obstore's client reads too) LF LF
        end = buffer.find(b"\n\r\n", 0, filled)
        bare = buffer.find(b"\n\n", 0, filled if end < 0 else end + 1)
        if bare >= 0:
            end, skip = bare, bare + 2
        elif end >= 0:
            skip = end + 3
        else:
            if filled >= HEAD_BYTES:
                raise FramingError(f"{self.origin} sent a head over {HEAD_BYTES} bytes")
            return
        head = bytes(self._head_view[: end + 1])  # the status line and every header line, each ending in (CR)LF
        if bare >= 0 or head.count(b"\n") != head.count(b"\r\n"):
            head = head.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")  # each line ending in CRLF
        line = head[: head.find(b"\r\n")]
        try:
            version, code = line.split(b" ", 2)[:2]
            if version not in _VERSIONS or len(code) != 3 or not code.isdigit():  # (int() takes "+206", "0206")
                raise ValueError(line)
            self._status = int(code)
        except ValueError:
            raise FramingError(f"{self.origin} sent a malformed status line {line[:80]!r}") from None
        self._shift(skip)
        if 100 <= self._status < 200:  # an interim answer: drop it, the real one follows
            self._status = 0
            self._parse_head()
            return
        # headers by name, found in the lowered head (no whitespace may precede a header's colon: RFC 9112); the
        # rare ones only when present, so an ordinary answer costs a few searches and no call
        lowered = head.lower()
        at = lowered.find(b"\r\ncontent-length:")
        length = None if at < 0 else lowered[at + 17 : lowered.index(b"\r\n", at + 17)].strip()
        chunked = b"\r\ntransfer-encoding:" in lowered and self._chunked(_header(lowered, b"\r\ntransfer-encoding:"))
        if b"\r\nconnection:" in lowered:
            self._keep = b"close" not in _header(lowered, b"\r\nconnection:")
        else:
            self._keep = version == b"HTTP/1.1"
        if length is not None and (
            not length.isdigit() or len(length) > MAX_LENGTH_DIGITS or int(length) > MAX_BODY_BYTES
        ):
            raise FramingError(f"{self.origin} sent Content-Length {length[:40]!r} (at most {MAX_BODY_BYTES})")
        size = None if length is None or chunked else int(length)
        status, ask = self._status, self._ask
        assert ask is not None
        if ask.version is not None and status < 300:
            ask.etag = _header(head, b"\r\netag:", lowered).decode("latin-1") or None
        if status == 206 and ask.want is not None:
            at = lowered.find(b"\r\ncontent-range:")
            crange = None if at < 0 else lowered[at + 16 : lowered.index(b"\r\n", at + 16)].strip()
            start = ask.want[0]
            end = start + size if size else 0
            # the common answer: the range asked (of an object at least that long, or of unknown length), or an
            # open-ended read's rest of the object, at the length it says; anything else check_206 reads or refuses
            prefix = b"bytes %d-%d/" % (start, end - 1)
            total = crange[len(prefix) :] if size and start >= 0 and crange and crange.startswith(prefix) else b""
            if total == b"%d" % end or (
                end == ask.want[1] and total and (total == b"*" or (total.isdigit() and int(total) >= end))
            ):
                self._expect = size
            else:
                self._expect = check_206(ask.want, crange, size, self._asked(ask))
        elif status == 200 and ask.want is not None:
            self._one_length(lowered, length)
            at = lowered.find(b"\r\ncontent-range:")
            crange = None if at < 0 else lowered[at + 16 : lowered.index(b"\r\n", at + 16)].strip()
            cut = self._cut = whole_200(ask.want, crange, size, self._asked(ask), MAX_BODY_BYTES)
            if cut is not None and cut[0] >= 0 and cut[2] - cut[1] > IGNORED_RANGE_SLACK_BYTES:
                self._stop_at = cut[1]  # stop early (a few bytes more keep the connection for the next GET)
        elif status < 300 and ask.want is not None:  # a 203 or 204 to a range: refused, as obstore refuses it
            raise not_a_range(status, self._asked(ask))
        elif status >= 300:
            self._stop_at = ERROR_BODY_BYTES
            if status < 400:
                self._location = _header(head, b"\r\nlocation:", lowered) or None
                self._region = _header(head, b"\r\nx-amz-bucket-region:", lowered) or None
        if status in (204, 304):  # no body, whatever the headers say
            size, chunked = 0, False
            if self._filled:  # bytes after the head are no answer's: dropped, and the connection not reused
                self._filled, self._keep = 0, False
        if chunked:
            limit = MAX_BODY_BYTES if self._expect is None else self._expect
            self._chunks = ChunkedBody(limit, self.origin)
            self._stream_buffer()
            self._stream()
        elif size is not None:
            self._receive(size)
        else:  # framed by neither: the body runs to the close, or (a 206) to the length its Content-Range names
            self._no_framing(head)
            if self._expect is not None:
                self._stop_at = self._expect
            self._until_eof, self._keep = True, False
            self._body = bytearray()
            self._stream_buffer()
            self._stream()

    def _one_length(self, lowered: bytes, length: bytes | None) -> None:
        """Refuse Content-Length lines that differ (a 200's: which one frames the body cannot be known).

        (A 206's length is checked against its ``Content-Range``, which names its end.)
        """
        at = lowered.find(b"\r\ncontent-length:")
        while length is not None and (at := lowered.find(b"\r\ncontent-length:", at + 17)) >= 0:
            other = lowered[at + 17 : lowered.index(b"\r\n", at + 17)].strip()
            if other != length:
                raise FramingError(f"{self.origin} sent Content-Length {length[:40]!r} and {other[:40]!r}")

    def _chunked(self, codings: bytes) -> bool:
        """True for ``Transfer-Encoding: chunked``; any other coding is a body this client cannot read, refused."""
        if [c.strip() for c in codings.split(b",") if c.strip()] == [b"chunked"]:
            return True
        ask = self._ask
        raise UnsupportedBodyError(
            f"GET {'' if ask is None else ask.target}: {self.origin} sent Transfer-Encoding "
            f"{codings.decode('latin-1')[:60]!r}: a body this client cannot read (it decodes only 'chunked', obstore's "
            "client none for a range); not retried"
        )

    def _no_framing(self, head: bytes) -> None:
        """Refuse a head without framing where a header line is malformed: its framing may be in that line.

        (``Content-Length : 4``, a folded ``Transfer-Encoding``: obstore's
        client refuses them; read as unframed, a chunked body's framing would
        be taken for data.)
        """
        for line in head.split(b"\r\n")[1:]:
            if line and _FIELD_LINE.match(line) is None:
                raise FramingError(
                    f"{self.origin} sent the header line {line[:60]!r} (not 'name: value') in an answer without "
                    "Content-Length or chunked framing: where its body ends cannot be known"
                )

    def _receive(self, length: int) -> None:
        """A body of ``length`` bytes: received into its own buffer (only its first ``_stop_at`` bytes)."""
        size = min(length, self._stop_at)
        if size < length:
            self._keep = False  # the rest is never read: the connection cannot carry another GET
        elif self._filled > length and bytes(self._head_view[length : self._filled]).strip(b"\r\n"):
            raise FramingError(f"{self.origin} sent more than its Content-Length")  # (empty lines after it are dropped)
        try:
            body = np.empty(size, dtype=np.uint8)
        except (MemoryError, ValueError):
            raise FramingError(f"{self.origin} sent Content-Length {length}, more than this process can hold") from None
        have = min(self._filled, size)
        body[:have] = self._head_view[:have]
        self._got = have
        self._filled = 0
        self._body, self._body_view = body, body.data
        if self._got == size:
            self._complete()
        elif self._socket is not None and size - self._got >= LOWAT_FROM_BYTES:
            self._await_rest()

    def _await_rest(self) -> None:
        """Be woken when the rest of the body (up to ``LOWAT_MAX_BYTES`` of it) has arrived, not before."""
        assert self._body_view is not None
        want = min(len(self._body_view) - self._got, LOWAT_MAX_BYTES)
        if want != self._lowat:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            self._lowat = want

    def _shift(self, n: int) -> None:
        rest = self._filled - n
        self._head_view[:rest] = self._head_view[n : self._filled]
        self._filled = rest

    # -- streamed bodies ---------------------------------------------------------------------------------------
    def _stream_buffer(self) -> None:
        if len(self._head) < STREAM_BUFFER_BYTES:
            self._regrow(STREAM_BUFFER_BYTES)

    def _stream(self) -> None:
        """Take in what arrived of a chunked or unframed body."""
        chunks = self._chunks
        if chunks is not None:
            used = chunks.feed(self._head, self._filled)
            self._shift(used)
            body = chunks.body
        else:
            grown = self._body
            assert isinstance(grown, bytearray)  # (a body of known length is never streamed)
            grown += self._head_view[: self._filled]
            body = grown
            self._filled = 0
        if len(body) >= self._stop_at:
            del body[self._stop_at :]
            self._keep = False
            self._body = body
            self._done_streaming()
        elif chunks is not None and chunks.done:
            self._body = body
            self._done_streaming()

    def _done_streaming(self) -> None:
        ask, body = self._ask, self._body
        assert ask is not None and body is not None
        if self._expect is not None and len(body) != self._expect:
            self._fail(mismatch(self._asked(ask), f"{len(body)} body bytes for a range of {self._expect}"))
            return
        self._finish()

    # -- the answer --------------------------------------------------------------------------------------------
    def _complete(self) -> None:
        self._body_view = None
        if self._lowat > 1:  # the next answer's head is read as it comes
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            self._lowat = 1
        self._finish()

    def _finish(self) -> None:
        future, self._future = self._future, None
        if future is not None:  # answered: no cancellation can concern this connection now (one callback less)
            future.remove_done_callback(self._abandoned)
        body, status, ask, cut = self._body, self._status, self._ask, self._cut
        if body is None:
            body = bytearray()
        self._body = None
        if not self.used:
            self.used = True
            self.pool.keep_tls(self)
        if self._keep and not self.closed:
            self.pool.idle_again(self)
        else:
            self.close()
        if future is None or future.done() or ask is None:
            return
        if 200 <= status < 300:
            if cut is not None:  # a server that ignored the Range header: the range out of the whole object
                try:
                    body = within(body, cut, self._asked(ask))
                except RangeMismatchError as exc:
                    future.set_exception(exc)
                    return
            future.set_result(body if ask.version is None else (body, ask.etag))
        elif status in REDIRECT_STATUSES and self._location and ask.backend is not None:
            location = self._location.decode("latin-1")
            ask.backend.redirected(ask, future, status, location, self._region_name(), self.pool)
        elif status == 404 and b"<Code>NoSuchBucket</Code>" in bytes(body):  # (an error body: at most 64 KiB)
            future.set_exception(
                NoSuchBucketError(
                    f"GET {ask.target}: status code: 404: NoSuchBucket at {self.origin}: the bucket does not exist "
                    "there (not a missing chunk); check the bucket and the endpoint (endpoint=, AWS_ENDPOINT_URL_S3, "
                    "AWS_ENDPOINT_URL)"
                )
            )
        elif status == 404:
            future.set_exception(FileNotFoundError(f"GET {ask.target}: status code: 404"))
        elif status in (401, 403):
            future.set_exception(PermissionError(f"GET {ask.target}: status code: {status}: {bytes(body[:200])!r}"))
        elif 300 <= status < 400 and ask.backend is not None:
            ask.backend.redirected(ask, future, status, None, self._region_name(), self.pool)
        else:
            future.set_exception(HttpStatusError(status, ask.target, bytes(body)))

    def _asked(self, ask: Ask) -> str:
        """The GET as messages name it: its path (no query) and range, and the server."""
        return f"GET {ask.target}: asked bytes={ask.span}, {self.origin}"

    def _region_name(self) -> str | None:
        return None if self._region is None else self._region.decode("latin-1")

    def _fail(self, exc: BaseException) -> None:
        future, self._future = self._future, None
        self.close()
        if future is not None and not future.done():
            future.set_exception(exc)

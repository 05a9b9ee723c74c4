"""The emulator's scripted mode: a test says, per request, the exact bytes the server sends and what it does next.

A *script* is a callable ``script(request) -> Reply | bytes | None`` given to
:class:`~insitubatch.testing.emulator.Emulator` (``script=``). It sees every
request as a :class:`Request` (method, target, headers, which connection it
came on and how many came before it there) and answers with:

* ``None`` — the emulator answers as it always does (the file under its
  root, with its link model and injected faults): a script that only
  records, or one that changes a few keys (a token check, a redirect, a
  wrong range for one array), returns ``None`` for the rest;
* ``bytes`` — sent as they are, byte for byte; the connection then waits
  for the next request;
* a :class:`Reply` — bytes in parts with pauses between them, then the
  connection kept, closed, reset or held silent.

Nothing is checked or fixed: a head whose lines end in a bare LF, a stray
CRLF after a body, a chunked body, a ``Content-Range`` that is not the range
asked, a ``Content-Length`` longer than the body, go out as written. That is
what a client's tests need from a misbehaving server. :func:`answer` and
:func:`ranged` build the well-formed answers a script starts from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["AFTER", "CLOSE", "ConnectionRecord", "Reply", "Request", "answer", "ranged"]

# What a connection does once a Reply's parts are out.
AFTER = ("keep", "close", "reset", "hold")


@dataclass(frozen=True)
class Request:
    """One request as the emulator saw it (control requests excluded).

    ``headers`` has lower-cased names; ``connection`` numbers the server's
    connections from 1 in the order they were accepted, and ``nth`` counts
    the requests that came before this one on the same connection (0 for
    the first); ``head`` is the request line and header lines as received,
    re-joined with CRLF (what a script forwards to another server).
    """

    method: str
    target: str
    headers: Mapping[str, str]
    connection: int = 0
    nth: int = 0
    head: bytes = b""

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        """The target's query string (``""`` when it has none)."""
        return self.target.partition("?")[2]


@dataclass(frozen=True)
class Reply:
    """The exact answer to one request: ``parts`` go out in order, then the connection does ``after``.

    Each part is ``bytes`` (written as is) or a ``float`` (a pause of that
    many seconds before the next part). ``parts`` may be a generator, read
    as it is sent (a body of gigabytes never sits in memory; a client that
    stops reading ends it). ``after`` is one of :data:`AFTER`:

    ``"keep"``
        read the next request on the connection;
    ``"close"``
        a clean close (FIN): with fewer body bytes sent than announced, a
        body cut short; with no ``Content-Length``, the end of the body;
    ``"reset"``
        a TCP reset (``SO_LINGER`` 0);
    ``"hold"``
        nothing more until the client goes or the emulator closes (a stall).
    """

    parts: Iterable[bytes | float] = ()
    after: str = "keep"

    def __post_init__(self) -> None:
        if self.after not in AFTER:
            raise ValueError(f"after={self.after!r} is not one of {AFTER}")


# No answer at all: the connection is closed as the request arrives.
CLOSE = Reply(after="close")


@dataclass
class ConnectionRecord:
    """One connection the emulator accepted, kept when it runs with ``record=True``.

    Times are ``time.monotonic()`` seconds: ``answered_s`` when the last
    answer's last byte went out, ``closed_s`` when the connection ended
    (``None`` while open), so ``closed_s - answered_s`` is how long a client
    kept it idle before closing it. ``bytes_sent`` counts every byte written
    on it; ``session_reused`` says whether a TLS handshake resumed a session
    (``None`` over plain HTTP or before the handshake).
    """

    number: int
    opened_s: float = field(default_factory=time.monotonic)
    requests: int = 0
    bytes_sent: int = 0
    answered_s: float | None = None
    closed_s: float | None = None
    session_reused: bool | None = None


def answer(status: int, body: bytes = b"", **headers: str) -> bytes:
    """A whole HTTP/1.1 answer with ``Content-Length``; ``headers`` as ``Content_Range="..."`` (``_`` is ``-``)."""
    lines = [f"HTTP/1.1 {status} X"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def ranged(body: bytes, header: str | None, **headers: str) -> bytes:
    """The right answer to a GET of ``body`` with ``Range`` ``header`` (one range, or ``None``): 200, 206 or 416.

    ``headers`` go into the answer too (as :func:`answer` takes them).
    """
    if header is None:
        return answer(200, body, **headers)
    spec = header.split("=", 1)[1]
    first, _, last = spec.partition("-")
    if not first:
        start, stop = max(0, len(body) - int(last)), len(body)
    else:
        start, stop = int(first), min(len(body), int(last) + 1 if last else len(body))
    if start >= len(body):
        return answer(416, b"", Content_Range=f"bytes */{len(body)}", **headers)
    return answer(206, body[start:stop], Content_Range=f"bytes {start}-{stop - 1}/{len(body)}", **headers)

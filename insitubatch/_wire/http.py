"""HTTP/1.1 GETs on the event loop itself: kept-alive connections, bodies received straight into their buffer.

obstore answers each GET from its own runtime's threads, and the handoffs
between those threads and Python's cost more CPU per GET than the GET's
decode on a fast link (``bench.network``'s ``cpu`` scenario). A connection
here is an asyncio protocol on the loop that already runs the pass's reads:
no thread, task or copy per GET. :class:`HttpPool` keeps a host's idle
connections; :meth:`HttpPool.get` sends one GET and returns a future for its
body (a ``bytearray``). Cancelling the future aborts its connection.

Answers: a 2xx body; a 404 raises ``FileNotFoundError``; 401/403
``PermissionError``; any other status :class:`HttpStatusError`, whose
message carries the status (``status code: NNN``) and the start of the
body (an S3 ``SlowDown``), which ``read_policy.classify`` sorts. A
connection dropped before any byte of a reused connection's answer is
retried once on a fresh one (the server closed it while idle).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ipaddress
import socket
import ssl
import weakref
from typing import Any

__all__ = ["HttpPool", "HttpStatusError"]

# Status line and headers must fit in HEAD_BYTES; a larger head is refused. The head buffer starts at
# FIRST_HEAD_BYTES and doubles as needed (a chunked or unframed body is received there too).
HEAD_BYTES = 64 << 10
FIRST_HEAD_BYTES = 8 << 10
# Idle connections a pool keeps (more are closed as they come back).
MAX_IDLE = 512
# A host's addresses are looked up once per this many seconds, and new connections take them in turn.
ADDRESS_TTL_S = 60.0
# At exit, how long closing a pool's connections may wait for its loop.
EXIT_WAIT_S = 1.0
# How much of an error body the exception quotes.
ERROR_QUOTE_BYTES = 512


class HttpStatusError(OSError):
    """A GET answered with a status other than 2xx, 401, 403 or 404."""

    def __init__(self, status: int, target: str, body: bytes) -> None:
        text = body[:ERROR_QUOTE_BYTES].decode("utf-8", "replace").strip()
        super().__init__(f"GET {target}: status code: {status}" + (f": {text}" if text else ""))
        self.status = status


class _Connection(asyncio.BufferedProtocol):
    """One kept-alive connection: at most one GET at a time."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # it has answered a GET (so a drop before any byte may be an idle close)
        self._future: asyncio.Future | None = None
        self._target = ""
        self._head = bytearray(FIRST_HEAD_BYTES)
        self._head_view = memoryview(self._head)
        self._filled = 0
        self._body: bytearray | None = None
        self._body_view: memoryview | None = None
        self._got = 0
        self._status = 0
        self._keep = True
        self._until_eof = False
        self._chunked = False
        self._trim: tuple[int, int] | None = None
        self._retry: tuple[bytes, asyncio.Future] | None = None

    # -- asyncio protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body_view is not None:
            return self._body_view[self._got :]
        if self._filled == len(self._head):  # a chunked or unframed body, or a head still arriving: grow
            self._regrow(2 * len(self._head))
        return self._head_view[self._filled :]

    def _regrow(self, size: int) -> None:
        """A new head buffer of ``size`` holding what has come so far (the old one may still be exported)."""
        head = bytearray(size)
        head[: self._filled] = self._head_view[: self._filled]
        self._head, self._head_view = head, memoryview(head)

    def buffer_updated(self, nbytes: int) -> None:
        if self._body_view is not None:
            self._got += nbytes
            if self._got == len(self._body_view):
                self._complete()
            return
        self._filled += nbytes
        if self._future is None:
            self._fail(ConnectionError(f"{self.pool.origin} sent bytes nobody asked for"))
            return
        if self._status == 0:
            self._parse_head()
        elif self._chunked:
            self._parse_chunks()

    def eof_received(self) -> bool:
        if self._until_eof and self._future is not None and self._status:
            self._body = self._head[: self._filled]
            self._finish()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.pool._forget(self)
        future, self._future = self._future, None
        if future is None or future.done():
            return
        if self.used and self._filled == 0 and self._got == 0 and self._retry is not None:
            request, _ = self._retry
            self.pool._send(request, future, self._target, self._trim, retried=True)  # closed while idle
            return
        future.set_exception(ConnectionResetError(f"{self.pool.origin} closed the connection during {self._target}"))

    # -- requests ----------------------------------------------------------------------------------------------
    def send(self, request: bytes, future: asyncio.Future, target: str, trim: tuple[int, int] | None) -> None:
        self._future = future
        self._target = target
        self._trim = trim
        self._filled = self._got = self._status = 0
        if len(self._head) > FIRST_HEAD_BYTES:  # grown for a chunked body: back to its first size
            self._regrow(FIRST_HEAD_BYTES)
        self._body = self._body_view = None
        self._keep, self._until_eof, self._chunked = True, False, False
        self._retry = (request, future)
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

    # -- parsing -----------------------------------------------------------------------------------------------
    def _parse_head(self) -> None:
        end = self._head.find(b"\r\n\r\n", 0, self._filled)
        if end < 0:
            if self._filled >= HEAD_BYTES:  # (the buffer grows past it only for a body)
                self._fail(ConnectionError(f"{self.pool.origin} sent a head over {HEAD_BYTES} bytes"))
            return
        lines = bytes(self._head_view[:end]).split(b"\r\n")
        try:
            version, status = lines[0].split(b" ", 2)[:2]
            self._status = int(status)
        except ValueError:
            self._fail(ConnectionError(f"{self.pool.origin} sent a malformed status line {lines[0][:80]!r}"))
            return
        if 100 <= self._status < 200:  # an interim answer: drop it, the real one follows
            self._status = 0
            self._shift(end + 4)
            self._parse_head()
            return
        length = None
        self._keep = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self._fail(ConnectionError(f"{self.pool.origin} sent Content-Length {value[:40]!r}"))
                    return
            elif name == b"transfer-encoding":
                self._chunked = b"chunked" in value.lower()
            elif name == b"connection":
                self._keep = b"close" not in value.lower()
        self._shift(end + 4)
        if self._status in (204, 304):  # no body, whatever the headers say
            length, self._chunked = 0, False
        if self._chunked:
            self._parse_chunks()
        elif length is not None:
            self._body = bytearray(length)
            have = min(self._filled, length)
            self._body[:have] = self._head_view[:have]
            if self._filled > length:
                self._fail(ConnectionError(f"{self.pool.origin} sent more than its Content-Length"))
                return
            self._got = have
            self._body_view = memoryview(self._body)
            if self._got == length:
                self._complete()
        else:
            self._until_eof, self._keep = True, False

    def _shift(self, n: int) -> None:
        rest = self._filled - n
        self._head_view[:rest] = self._head_view[n : self._filled]
        self._filled = rest

    def _parse_chunks(self) -> None:
        """A chunked body is complete once its last chunk and trailers are in: then it is joined."""
        data, pos = self._head, 0
        pieces: list[memoryview] = []
        while True:
            line_end = data.find(b"\r\n", pos, self._filled)
            if line_end < 0:
                return
            size = int(bytes(data[pos:line_end]).split(b";", 1)[0], 16)
            start = line_end + 2
            if size == 0:
                if data.find(b"\r\n\r\n", line_end, self._filled) < 0 and data[start : start + 2] != b"\r\n":
                    return
                self._body = bytearray().join(pieces)
                self._filled = 0
                self._finish()
                return
            if start + size + 2 > self._filled:
                return
            pieces.append(self._head_view[start : start + size])
            pos = start + size + 2

    def _complete(self) -> None:
        self._body_view = None
        self._finish()

    def _finish(self) -> None:
        future, self._future = self._future, None
        body, status = self._body or bytearray(), self._status
        self._body = None
        self.used = True
        if self._keep and not self.closed:
            self.pool._idle_again(self)
        else:
            self.close()
        if future is None or future.done():
            return
        if 200 <= status < 300:
            if status == 200 and self._trim is not None:  # a server that ignored the Range header
                start, stop = self._trim
                body = body[start:stop] if start >= 0 else body[start:]
            future.set_result(body)
        elif status == 404:
            future.set_exception(FileNotFoundError(f"GET {self._target}: status code: 404"))
        elif status in (401, 403):
            future.set_exception(PermissionError(f"GET {self._target}: status code: {status}: {bytes(body[:200])!r}"))
        else:
            future.set_exception(HttpStatusError(status, self._target, bytes(body)))

    def _fail(self, exc: BaseException) -> None:
        future, self._future = self._future, None
        self.close()
        if future is not None and not future.done():
            future.set_exception(exc)


class HttpPool:
    """One origin's kept-alive connections, used from one event loop."""

    def __init__(self, scheme: str, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        self.origin = f"{scheme}://{host}:{port}"
        self.host, self.port = host, port
        self.ssl = ssl_context if scheme == "https" else None
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keeper: asyncio.Task | None = None
        self._lookup: asyncio.Future | None = None
        self._literal = (host.strip("[]"), port) if _is_address(host) else None  # an IP needs no lookup
        self._lookup_until = 0.0
        self._turn = 0
        _pools.add(self)

    def get(self, request: bytes, target: str, trim: tuple[int, int] | None = None) -> asyncio.Future:
        """Send ``request`` (a whole GET's head); a future for the body. ``trim``: the range, for a 200 answer."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._adopt(loop)
        future = loop.create_future()
        self._send(request, future, target, trim)
        return future

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Connections live on one loop: the old loop's are closed, and a keeper closes the new one's with it."""
        self.close()
        self._loop = loop
        idle: list[_Connection] = []
        self._idle = idle
        self._keeper = loop.create_task(self._keep(idle))

    @staticmethod
    async def _keep(idle: list[_Connection]) -> None:
        # cancelled by close(), or by asyncio.run() ending its loop: either way the loop's connections close
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            for connection in idle:
                connection.close()
            idle.clear()

    def _send(
        self, request: bytes, future: asyncio.Future, target: str, trim: tuple[int, int] | None, retried: bool = False
    ) -> None:
        idle = self._idle
        while idle and not retried:
            connection = idle.pop()
            if not connection.closed:
                connection.send(request, future, target, trim)
                return
        task = asyncio.ensure_future(self._connect())
        task.add_done_callback(lambda t: self._connected(t, request, future, target, trim))
        future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        addresses = await self._addresses(loop)
        server_hostname = self.host if self.ssl is not None else None
        self._turn += 1
        error: OSError | None = None
        for i in range(len(addresses)):  # in turn, from the next one; an address that refuses passes to the next
            host, port = addresses[(self._turn + i) % len(addresses)]
            try:
                _, connection = await loop.create_connection(
                    lambda: _Connection(self), host, port, ssl=self.ssl, server_hostname=server_hostname
                )
                return connection
            except OSError as exc:
                error = exc
        assert error is not None
        raise error

    async def _addresses(self, loop: asyncio.AbstractEventLoop) -> list[tuple[str, int]]:
        """The host's addresses: looked up once per ``ADDRESS_TTL_S``, not once per connection."""
        if self._literal is not None:
            return [self._literal]
        lookup = self._lookup
        if lookup is None or loop.time() > self._lookup_until or lookup.get_loop() is not loop or lookup.cancelled():
            lookup = self._lookup = asyncio.ensure_future(
                loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            )
            self._lookup_until = loop.time() + ADDRESS_TTL_S
        try:
            infos = await asyncio.shield(lookup)
        except Exception:
            if self._lookup is lookup:
                self._lookup = None  # the next connection asks again
            raise
        if not infos:
            raise OSError(f"no address for {self.host!r}")
        return [(str(info[4][0]), int(info[4][1])) for info in infos]

    def _connected(
        self, task: asyncio.Future, request: bytes, future: asyncio.Future, target: str, trim: tuple[int, int] | None
    ) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if future.done():
            if exc is None:
                self._idle_again(task.result())
            return
        if exc is not None:
            future.set_exception(exc)
            return
        task.result().send(request, future, target, trim)

    def _idle_again(self, connection: _Connection) -> None:
        if connection.loop is self._loop and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()

    def _forget(self, connection: _Connection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self, wait_s: float = 0.0) -> None:
        """Close the idle connections, from any thread (busy ones close as their GETs end or are cancelled).

        From another thread than the loop's, ``wait_s`` > 0 waits that long
        for the sockets to be closed (at exit, before the loop stops).
        """
        loop, keeper = self._loop, self._keeper
        self._loop = self._keeper = None
        self._idle = []
        if loop is None or keeper is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            keeper.cancel()
            return
        try:
            done = asyncio.run_coroutine_threadsafe(_ended(keeper), loop)
        except RuntimeError:  # the loop closed meanwhile
            return
        if wait_s > 0:
            with contextlib.suppress(Exception):
                done.result(wait_s)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


async def _ended(keeper: asyncio.Task) -> None:
    """Cancel ``keeper`` and wait for it and for the sockets it closed."""
    keeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await keeper
    for _ in range(2):  # a closed transport's socket is released one loop turn later
        await asyncio.sleep(0)


_pools: weakref.WeakSet[HttpPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # registered after zarr's own exit handler (zarr is imported first), so this runs while zarr's loop still does
    for pool in list(_pools):
        pool.close(wait_s=EXIT_WAIT_S)

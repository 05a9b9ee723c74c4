"""One origin's kept-alive connections on one event loop: reused while fresh, closed when idle too long or with it.

:meth:`HttpPool.get` sends one GET (a whole request head) and returns a
future for its body. A connection that answered goes back to the pool and
is reused by the next GET; one idle longer than ``idle_timeout_s`` (the
store's ``pool_idle_timeout``, obstore's 90 s otherwise) is closed, by the
next GET that finds it or by a sweep timer when none comes. A new
connection (lookup, TCP and TLS) must be made within ``connect_timeout_s``.
:meth:`HttpPool.close` closes the idle ones (from any thread); busy ones
close when their GET ends. A connection dropped before any byte of a
reused connection's answer is retried once on a fresh one (the server
closed it while idle).

A host name with several addresses is connected to as RFC 8305 (Happy
Eyeballs) says: the addresses, families interleaved, are tried one
``HAPPY_EYEBALLS_DELAY_S`` after another (at once after a refusal) until one
connects, the others then closed; an unreachable address costs that delay,
not the connect timeout. An HTTPS pool offers the TLS session of its last
connection on the next (``tls.ResumingContext``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ipaddress
import os
import socket
import ssl

from .._weak import WeakMembers
from ..stores.options import OBSTORE_CONNECT_TIMEOUT, OBSTORE_POOL_IDLE_TIMEOUT
from .connection import Ask, Connection
from .faults import TlsRefusedError
from .tls import ResumingContext

__all__ = ["HttpPool"]

# Idle connections a pool keeps unless the store says otherwise (more are closed as they come back).
MAX_IDLE = 512
# A host's addresses are looked up once per this many seconds, and new connections take them in turn.
ADDRESS_TTL_S = 60.0
# RFC 8305's "Connection Attempt Delay" (its recommended 250 ms; obstore's client waits 300 ms, asyncio's
# happy_eyeballs_delay is usually given 0.25): the next address is tried when the last has not connected by then.
HAPPY_EYEBALLS_DELAY_S = 0.25
# At exit (and from close(wait_s=...)), how long closing a pool's connections may wait for its loop.
EXIT_WAIT_S = 1.0


class HttpPool:
    """One origin's kept-alive connections, used from one event loop."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        *,
        connect_timeout_s: float = OBSTORE_CONNECT_TIMEOUT.total_seconds(),
        idle_timeout_s: float = OBSTORE_POOL_IDLE_TIMEOUT.total_seconds(),
        max_idle: int | None = None,
    ) -> None:
        named = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
        self.origin = f"{scheme}://{named}:{port}"
        self.scheme, self.host, self.port = scheme, host, port
        self.ssl = ResumingContext(ssl_context) if scheme == "https" and ssl_context is not None else None
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_idle = MAX_IDLE if max_idle is None else max_idle
        self._idle: list[Connection] = []  # oldest first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keeper: asyncio.Task | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._lookup: asyncio.Future | None = None
        self._literal = _literal(host, port)  # an IP needs no lookup
        self._lookup_until = 0.0
        self._turn = 0
        _pools.add(self)

    def get(self, request: bytes, ask: Ask) -> asyncio.Future:
        """Send ``request`` (a whole GET's head); a future for the body, checked against ``ask``."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._adopt(loop)
        future = loop.create_future()
        self.send(request, future, ask)
        return future

    def resend(self, request: bytes, future: asyncio.Future, ask: Ask) -> None:
        """Send ``request`` for a GET already under way elsewhere (a redirect here): ``future`` gets its answer."""
        loop = future.get_loop()
        if self._loop is not loop:
            self._adopt(loop)
        self.send(request, future, ask)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Connections live on one loop: the old loop's are closed, and a keeper closes the new one's with it."""
        self.close()
        self._loop = loop
        idle: list[Connection] = []
        self._idle = idle
        self._keeper = loop.create_task(self._keep(idle))

    @staticmethod
    async def _keep(idle: list[Connection]) -> None:
        # cancelled by close(), or by asyncio.run() ending its loop: either way the loop's connections close
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            for connection in idle:
                connection.close()
            idle.clear()

    def send(self, request: bytes, future: asyncio.Future, ask: Ask, retried: bool = False) -> None:
        """Send ``request`` on an idle connection that is still fresh, or on a new one; its answer sets ``future``."""
        idle = self._idle
        if idle and not retried:
            now = idle[-1].loop.time()
            while idle:
                connection = idle.pop()  # the most recently used: the least likely to have been closed
                if connection.closed:
                    continue
                if now - connection.idle_since > self.idle_timeout_s:
                    connection.close()
                    continue
                connection.send(request, future, ask)
                return
        task = asyncio.ensure_future(self._connect(ask.target))
        task.add_done_callback(lambda t: self._connected(t, request, future, ask))
        future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)

    async def _connect(self, target: str) -> Connection:
        """A new connection, for ``GET target`` (a refused certificate names it: that error is not retried)."""
        try:
            return await asyncio.wait_for(self._open(), self.connect_timeout_s)
        except TimeoutError:
            raise TimeoutError(f"connecting to {self.origin} took over {self.connect_timeout_s:g}s") from None
        except ssl.SSLCertVerificationError as exc:
            raise TlsRefusedError(
                f"GET {target}: {self.origin} refused: its TLS certificate failed verification: {exc}"
            ) from exc
        except ssl.SSLError as exc:
            raise ConnectionError(f"TLS with {self.origin} failed: {exc}") from exc
        except socket.gaierror as exc:
            raise ConnectionError(f"cannot look up {self.host!r} (for {self.origin}): {exc}") from exc

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        addresses = await self._addresses(loop)
        server_hostname = self.host.strip("[]") if self.ssl is not None else None
        self._turn += 1
        turn = self._turn % len(addresses)  # from the next address each time, families interleaved (RFC 8305)
        sock = await _first_connected(loop, _interleaved(addresses[turn:] + addresses[:turn]))
        try:
            _, connection = await loop.create_connection(
                lambda: Connection(self),
                sock=sock,
                ssl=self.ssl,  # type: ignore[arg-type]  # (asyncio calls only its wrap_bio)
                server_hostname=server_hostname,
            )
        except BaseException:
            sock.close()
            raise
        return connection

    def keep_tls(self, connection: Connection) -> None:
        """``connection`` answered its first GET: its TLS session is offered to the next connection."""
        if self.ssl is not None and connection.transport is not None:
            self.ssl.keep(connection.transport)

    async def _addresses(self, loop: asyncio.AbstractEventLoop) -> list[tuple[int, tuple]]:
        """The host's addresses (family, socket address): looked up once per ``ADDRESS_TTL_S``, not per connection."""
        if self._literal is not None:
            return self._literal
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
        return [(info[0], info[4]) for info in infos]

    def _connected(self, task: asyncio.Future, request: bytes, future: asyncio.Future, ask: Ask) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if future.done():
            if exc is None:
                self.idle_again(task.result())
            return
        if exc is not None:
            future.set_exception(exc)
            return
        connection = task.result()
        if connection.closed:  # the server closed it before the GET could go (a TLS alert, an accept-and-close)
            future.set_exception(
                ConnectionResetError(f"{self.origin} closed a new connection before GET {ask.target} was sent")
            )
            return
        connection.send(request, future, ask)

    def idle_again(self, connection: Connection) -> None:
        """A connection whose GET ended keeps its socket for the next one (or closes, past ``max_idle``)."""
        loop = self._loop
        if loop is None or connection.loop is not loop or len(self._idle) >= self.max_idle:
            connection.close()
            return
        connection.idle_since = loop.time()
        self._idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_at(connection.idle_since + self.idle_timeout_s, self._expire)

    def _expire(self) -> None:
        """Close the connections idle past the timeout (the oldest come first); come back for the next one."""
        self._sweep = None
        idle, loop = self._idle, self._loop
        if loop is None:
            return
        now = loop.time()
        while idle and (idle[0].closed or now - idle[0].idle_since >= self.idle_timeout_s):
            idle.pop(0).close()
        if idle:
            self._sweep = loop.call_at(idle[0].idle_since + self.idle_timeout_s, self._expire)

    def forget(self, connection: Connection) -> None:
        """A connection closed: it leaves the idle list."""
        if connection in self._idle:
            self._idle.remove(connection)

    @property
    def idle(self) -> int:
        """Idle connections held now."""
        return len(self._idle)

    def close(self, wait_s: float = 0.0) -> None:
        """Close the idle connections, from any thread (busy ones close as their GETs end or are cancelled).

        From another thread than the loop's, ``wait_s`` > 0 waits that long
        for the sockets to be closed.
        """
        loop, keeper, sweep = self._loop, self._keeper, self._sweep
        self._loop = self._keeper = self._sweep = None
        self._idle = []
        if loop is None or keeper is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            keeper.cancel()
            if sweep is not None:
                sweep.cancel()
            return
        try:
            done = asyncio.run_coroutine_threadsafe(_ended(keeper, sweep), loop)
        except RuntimeError:  # the loop closed meanwhile
            return
        if wait_s > 0:
            with contextlib.suppress(Exception):
                done.result(wait_s)


def _literal(host: str, port: int) -> list[tuple[int, tuple]] | None:
    """``host``'s one address when it is an IP address (no lookup), else None."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if address.version == 6:
        return [(socket.AF_INET6, (str(address), port, 0, 0))]
    return [(socket.AF_INET, (str(address), port))]


def _interleaved(addresses: list[tuple[int, tuple]]) -> list[tuple[int, tuple]]:
    """``addresses`` with their families alternating, the first address's family first (RFC 8305 section 4)."""
    first = [a for a in addresses if a[0] == addresses[0][0]]
    other = [a for a in addresses if a[0] != addresses[0][0]]
    out: list[tuple[int, tuple]] = []
    for i in range(max(len(first), len(other))):
        out.extend(first[i : i + 1] + other[i : i + 1])
    return out


async def _connect_to(loop: asyncio.AbstractEventLoop, family: int, address: tuple) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


async def _first_connected(loop: asyncio.AbstractEventLoop, addresses: list[tuple[int, tuple]]) -> socket.socket:
    """A socket connected to the first of ``addresses`` to answer, each tried ``HAPPY_EYEBALLS_DELAY_S`` apart.

    The next address is tried at once when an attempt fails; the attempts
    that lose are closed. Raises the last attempt's error when none
    connects.
    """
    if len(addresses) == 1:  # (an IP address, or a name with one: nothing to race)
        return await _connect_to(loop, *addresses[0])
    queue = list(addresses)
    pending: set[asyncio.Task] = set()
    errors: list[BaseException] = []
    winner: socket.socket | None = None
    try:
        while queue or pending:
            if queue:
                pending.add(loop.create_task(_connect_to(loop, *queue.pop(0))))
            done, _ = await asyncio.wait(
                pending, timeout=HAPPY_EYEBALLS_DELAY_S if queue else None, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                pending.discard(task)
                error = task.exception()
                if error is not None:
                    errors.append(error)
                elif winner is None:
                    winner = task.result()
                else:
                    task.result().close()
            if winner is not None:
                return winner
        raise errors[-1]
    finally:
        for task in pending:
            task.cancel()  # (a cancelled attempt closes its socket)
            task.add_done_callback(_close_late_winner)


def _close_late_winner(task: asyncio.Task) -> None:
    """An attempt that connected as it was cancelled: its socket is closed."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


async def _ended(keeper: asyncio.Task, sweep: asyncio.TimerHandle | None) -> None:
    """Cancel ``keeper`` (and the sweep) and wait for it and for the sockets it closed."""
    keeper.cancel()
    if sweep is not None:
        sweep.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await keeper
    for _ in range(2):  # a closed transport's socket is released one loop turn later
        await asyncio.sleep(0)


_pools: WeakMembers[HttpPool] = WeakMembers()


def _forget_pools_in_child() -> None:
    # a forked child's pools are its parent's: their sockets are shared with it and their loop runs there,
    # so at the child's exit there is nothing of its own to close (a pool it reads through again starts afresh)
    global _pools
    _pools = WeakMembers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_in_child)


@atexit.register
def _close_all() -> None:
    # registered after zarr's own exit handler (zarr is imported first), so this runs while zarr's loop still does
    for pool in list(_pools):
        pool.close(wait_s=EXIT_WAIT_S)

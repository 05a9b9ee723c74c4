"""libcurl's multi interface driven by an asyncio loop: its sockets are the loop's readers and writers, its timer a loop timer.

A :class:`CurlDriver` owns one ``pycurl.CurlMulti`` (and with it libcurl's
connection cache: kept-alive connections, TLS sessions, HTTP/2 streams)
on one event loop. libcurl says which sockets to watch and when to wake
it (``M_SOCKETFUNCTION``, ``M_TIMERFUNCTION``); the loop calls
``socket_action`` when a socket is ready or the timer is due, and the
finished transfers' futures are settled right there. No thread and no task
per GET. Easy handles are reused (:class:`~.curl_transfer.Transfer`), and a
cancelled future takes its handle out of the multi at once, which closes
its connection. The driver closes with its loop (a keeper task, as
``_wire.pool``'s connections do) or with :meth:`CurlDriver.close`, from any thread.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from typing import Any

import pycurl

from .connection import Ask
from .curl_config import CurlSettings
from .curl_transfer import Redirect, Transfer

__all__ = ["CurlDriver"]

# Connections libcurl keeps open for reuse (its cache: idle and busy together) unless the store's
# pool_max_idle_per_host says fewer; the engine's own pool keeps as many idle.
MAX_CONNECTIONS = 512
# Idle easy handles kept for the next GETs (each holds its options and a receive buffer).
MAX_FREE_HANDLES = 256


class CurlDriver:
    """One multi handle on one loop (loop thread only, except :meth:`close`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        settings: CurlSettings,
        redirected: Callable[[Ask, str, asyncio.Future, Redirect], None],
    ) -> None:
        self.loop = loop
        self.settings = settings
        self.closed = False
        self._redirected = redirected
        multi = self.multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        multi.setopt(pycurl.M_MAXCONNECTS, settings.engine.max_idle or MAX_CONNECTIONS)
        self._watched: dict[int, int] = {}  # fd -> the POLL_* bits the loop watches it for
        self._timer: asyncio.Handle | None = None
        self._idle: asyncio.TimerHandle | None = None  # closes every connection once none has been busy for long
        self._busy: dict[Any, Transfer] = {}  # easy handle -> its transfer, while in the multi
        self._free: list[Transfer] = []
        self._keeper = loop.create_task(self._keep())

    # -- GETs --------------------------------------------------------------------------------------------------
    def get(
        self, url: str, origin: str, ask: Ask, future: asyncio.Future | None = None, region: str | None = None
    ) -> asyncio.Future:
        """Start ``GET url`` for ``ask`` (``origin``: the URL's ``scheme://host:port``); a future for its body.

        ``future``: answer that one (a redirect's next hop) rather than a new
        one; ``region``: sign for that S3 region rather than the store's.
        """
        if future is None:
            future = self.loop.create_future()
        if self.closed:
            future.set_exception(ConnectionAbortedError(f"GET {ask.target}: the client was closed"))
            return future
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        transfer = self._free.pop() if self._free else self._new_transfer()
        transfer.start(url, origin, ask, future)
        transfer.sign_for(region, self.settings.sigv4(region))
        self._busy[transfer.easy] = transfer
        self.multi.add_handle(transfer.easy)
        future.add_done_callback(functools.partial(self._settled, transfer))
        return future

    def _new_transfer(self) -> Transfer:
        easy = pycurl.Curl()
        self.settings.apply(easy)
        return Transfer(easy, self.settings.engine.connect_timeout_s)

    def _settled(self, transfer: Transfer, future: asyncio.Future) -> None:
        """A future was cancelled (a hedge lost, a stall, a pass abandoned): its transfer leaves the multi now."""
        if future.cancelled() and transfer.future is future and not self.closed:
            self._retire(transfer)

    def _retire(self, transfer: Transfer) -> None:
        self._busy.pop(transfer.easy, None)
        self.multi.remove_handle(transfer.easy)  # an unfinished transfer's connection is closed, not cached
        transfer.release()
        if len(self._free) < MAX_FREE_HANDLES:
            self._free.append(transfer)
        else:
            transfer.easy.close()
        if not self._busy and self._idle is None:
            self._idle = self.loop.call_later(self.settings.engine.pool_idle_timeout_s, self._expire)

    def _expire(self) -> None:
        """No GET for ``pool_idle_timeout``: the connections close, as obstore's idle ones do.

        libcurl itself only drops a connection older than ``MAXAGE_CONN``
        when it would reuse it; this closes them on time, with the multi
        (the backend opens a new one for the next GET).
        """
        self._idle = None
        if not self._busy:
            self._shut()

    # -- libcurl's callbacks ---------------------------------------------------------------------------------------
    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        old = self._watched.get(fd, 0)
        new = 0 if what == pycurl.POLL_REMOVE else what
        if new == old:
            return
        loop = self.loop
        if loop.is_closed():  # libcurl closing its sockets after the loop ended: nothing watches them any more
            self._watched.pop(fd, None)
            return
        if old & pycurl.POLL_IN and not new & pycurl.POLL_IN:
            loop.remove_reader(fd)
        if old & pycurl.POLL_OUT and not new & pycurl.POLL_OUT:
            loop.remove_writer(fd)
        if new & pycurl.POLL_IN and not old & pycurl.POLL_IN:
            loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
        if new & pycurl.POLL_OUT and not old & pycurl.POLL_OUT:
            loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
        if new:
            self._watched[fd] = new
        else:
            del self._watched[fd]

    def _on_timer(self, ms: int) -> None:
        # libcurl forbids socket_action inside this callback: the loop calls it back instead
        if self._timer is not None:
            self._timer.cancel()
        if ms < 0:
            self._timer = None
        elif ms == 0:
            self._timer = self.loop.call_soon(self._due)
        else:
            self._timer = self.loop.call_later(ms / 1000.0, self._due)

    def _due(self) -> None:
        self._timer = None
        self._act(pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, events: int) -> None:
        if self.closed:
            return
        _, running = self.multi.socket_action(fd, events)
        if running < len(self._busy):  # some transfers finished: settle them
            self._drain()

    def _drain(self) -> None:
        multi = self.multi
        while True:
            queued, ok, failed = multi.info_read()
            for easy in ok:
                self._finish(easy, 0, "")
            for easy, errno, message in failed:
                self._finish(easy, errno, message)
            if not queued:
                return

    def _finish(self, easy: Any, errno: int, message: str) -> None:
        transfer = self._busy.get(easy)
        if transfer is None:
            return
        future, ask, origin = transfer.future, transfer.ask, transfer.origin
        body, exc = transfer.outcome(errno, message)
        self._retire(transfer)
        if future is None or future.done() or ask is None:
            return
        if exc is None:
            future.set_result(body)
        elif isinstance(exc, Redirect):
            self._redirected(ask, origin, future, exc)
        else:
            future.set_exception(exc)

    # -- closing ---------------------------------------------------------------------------------------------------
    async def _keep(self) -> None:
        # cancelled by asyncio.run() ending the loop (or by close()): either way the multi closes with it
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self._shut()

    def _shut(self) -> None:
        """Fail the GETs in flight, stop watching libcurl's sockets, close the multi and its connections (loop thread)."""
        if self.closed:
            return
        self.closed = True
        for timer in (self._timer, self._idle):
            if timer is not None:
                timer.cancel()
        self._timer = self._idle = None
        busy, self._busy = list(self._busy.values()), {}
        for transfer in busy:
            future = transfer.future
            self.multi.remove_handle(transfer.easy)
            if future is not None and not future.done():
                target = "?" if transfer.ask is None else transfer.ask.target
                future.set_exception(ConnectionAbortedError(f"GET {target}: the client was closed"))
        self.multi.close()  # libcurl asks to forget its sockets as it closes them
        loop = self.loop
        for fd in list(self._watched) if not loop.is_closed() else ():
            loop.remove_reader(fd)
            loop.remove_writer(fd)
        self._watched.clear()
        for transfer in [*busy, *self._free]:
            transfer.release()
            transfer.easy.close()
        self._free.clear()
        if not loop.is_closed():
            self._keeper.cancel()

    def close(self, wait_s: float = 0.0) -> None:
        """Close the multi and its connections, from any thread; idempotent.

        From a thread other than the loop's, the loop does it and this waits
        up to ``wait_s`` for it; a loop that is not running (or closed) has
        nothing left to race with, so it is done here.
        """
        if self.closed:
            return
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or loop.is_closed() or not loop.is_running():
            self._shut()
            return
        done = threading.Event()

        def shut() -> None:
            try:
                self._shut()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(shut)
        except RuntimeError:  # closed meanwhile
            return
        if wait_s > 0:
            done.wait(wait_s)

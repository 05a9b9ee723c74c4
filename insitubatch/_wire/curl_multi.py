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
``_wire.http`` does) or with :meth:`CurlDriver.close`, from any thread.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pycurl

from .curl_config import CurlSettings
from .curl_transfer import Transfer

__all__ = ["CurlDriver"]

# Connections libcurl keeps open for reuse (its cache: idle and busy together); _wire.http keeps 512 idle.
MAX_CONNECTIONS = 512
# Idle easy handles kept for the next GETs (each holds its options and a receive buffer).
MAX_FREE_HANDLES = 256
# From another thread, how long close() waits for the loop to close the sockets.
CLOSE_WAIT_S = 1.0


class CurlDriver:
    """One multi handle on one loop (loop thread only, except :meth:`close`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: CurlSettings) -> None:
        self.loop = loop
        self.settings = settings
        self.closed = False
        self._headers = settings.headers()
        multi = self.multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        multi.setopt(pycurl.M_MAXCONNECTS, MAX_CONNECTIONS)
        self._watched: dict[int, int] = {}  # fd -> the POLL_* bits the loop watches it for
        self._timer: asyncio.Handle | None = None
        self._busy: dict[Any, Transfer] = {}  # easy handle -> its transfer, while in the multi
        self._free: list[Transfer] = []
        self._keeper = loop.create_task(self._keep())

    # -- GETs --------------------------------------------------------------------------------------------------
    def get(self, url: str, query: str, span: str | None, want: tuple[int, int] | None) -> asyncio.Future:
        """Start ``GET url?query`` (``Range: bytes=span`` unless None); a future for its body (see ``Transfer.start``)."""
        future = self.loop.create_future()
        if self.closed:
            future.set_exception(ConnectionAbortedError(f"GET {url}: the client was closed"))
            return future
        transfer = self._free.pop() if self._free else self._new_transfer()
        transfer.start(url, query, span, want, future)
        self._busy[transfer.easy] = transfer
        self.multi.add_handle(transfer.easy)
        future.add_done_callback(functools.partial(self._settled, transfer))
        return future

    def _new_transfer(self) -> Transfer:
        easy = pycurl.Curl()
        self.settings.apply(easy)
        return Transfer(easy)

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
        future = transfer.future
        body, exc = transfer.outcome(errno, message)
        self._retire(transfer)
        if future is None or future.done():
            return
        if exc is None:
            future.set_result(body)
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        busy, self._busy = list(self._busy.values()), {}
        for transfer in busy:
            future = transfer.future
            self.multi.remove_handle(transfer.easy)
            if future is not None and not future.done():
                future.set_exception(ConnectionAbortedError(f"GET {transfer.url}: the client was closed"))
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

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
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
        done.wait(wait_s)

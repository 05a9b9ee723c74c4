"""The loop side of a remote store's tile reads: queued tiles take permits, go out as GETs, land in decode jobs.

A mixin of ``PassDriver`` (the state it uses lives on the driver and is
declared here for the type checker). A pass's tiles queue up; while the
window has permits, each queued tile takes one and its GET starts through
the pass's ``Fetcher`` (``fetch``), as callbacks on zarr's loop: no task,
no coroutine per tile. GETs that finish in one turn of the loop go to the
decode pool together, at most ``NET_GROUP`` tiles per job, so a burst of
answers costs a few submits and wake-ups, not one per tile. A tile keeps
its permit until its decode job has landed: reads in flight, queued
decodes and decoded tiles waiting to land are all bounded by the window.
Teardown cancels this pass's GETs (closing their connections) and gives
their permits back; decode jobs already submitted are waited for by the
driver like any other.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from zarr.abc.buffer import Buffer

from ..errors import StoreReadError
from ..io.geometry import ArrayGeometry
from .fetch import Fetcher, Read
from .landings import _Landings, _Tally
from .pool import FAILED, ChunkPool, Entry, Owner
from .reader import ArrayReader
from .window import WindowUser

__all__ = ["NET_GROUP"]

# Most tiles one decode job takes from a burst of finished GETs: enough that a burst costs a few
# submits, few enough that the decode threads share a burst between them.
NET_GROUP = 8

_Tile = tuple[Entry, ArrayReader, int, int]  # entry, reader, chunk index, tile


class _NetReads:
    """Loop-side methods of ``PassDriver`` for a store read through a ``Fetcher``."""

    pool: ChunkPool
    owner: Owner
    semaphore: WindowUser
    fetcher: Fetcher | None
    loop: asyncio.AbstractEventLoop
    _stopping: bool
    _landings: _Landings
    _tile: Callable[..., np.ndarray | None]

    def _track(self, job: concurrent.futures.Future) -> None:
        raise NotImplementedError  # PassDriver's

    def _work_started(self) -> None:
        raise NotImplementedError  # PassDriver's

    def _work_ended(self, _done: Any) -> None:
        raise NotImplementedError  # PassDriver's

    @staticmethod
    def _read_error(g: ArrayGeometry, coord, key: str, exc: BaseException) -> StoreReadError:
        raise NotImplementedError  # _TileJobs'

    def _net_init(self) -> None:
        self._net_queue: collections.deque[_Tile] = collections.deque()
        self._net_reads: set[Read] = set()
        self._net_landed: list[tuple[_Tile, Any, str, Buffer | None]] = []
        self._net_waiter: asyncio.Future | None = None

    def _net_add(self, entry: Entry, reader: ArrayReader, chunk_index: int) -> None:
        """Loop: queue a chunk's tiles and start as many GETs as there are permits."""
        self._net_queue.extend((entry, reader, chunk_index, t) for t in range(reader.geometry.tiles_per_chunk))
        self._net_pump()

    def _net_pump(self, held: bool = False) -> None:
        """Loop: start queued tiles while permits are free (``held``: the caller hands over one it holds)."""
        queue, permits = self._net_queue, self.semaphore
        while queue and not self._stopping:
            if not held and not permits.try_acquire():
                if self._net_waiter is None or self._net_waiter.done():
                    self._net_waiter = permits.when_free(self._net_granted)
                return
            held = False
            self._net_start(queue.popleft())
        if held:
            permits.release()

    def _net_granted(self) -> None:
        self._net_waiter = None
        self._net_pump(held=True)

    def _net_start(self, tile: _Tile) -> None:
        entry, reader, chunk_index, t = tile
        if entry.state == FAILED:  # another tile of the chunk failed it: nothing to read
            self.semaphore.release()
            return
        assert self.fetcher is not None  # the driver reads through this mixin only with a fetcher
        g = reader.geometry
        coord = g.physical_chunk_coord(chunk_index, t)
        key = g.chunk_key(coord)
        self._work_started()
        self.owner.counters.trace.inflight_reads += 1
        started = time.perf_counter()
        holder: list[Read] = []
        done = functools.partial(self._net_got, tile, coord, key, started, holder)
        read = self.fetcher.start(key, None, g.stored_chunk_nbytes, done)
        holder.append(read)
        self._net_reads.add(read)

    def _net_got(
        self,
        tile: _Tile,
        coord: Any,
        key: str,
        started: float,
        holder: list[Read],
        buf: Buffer | None,
        exc: BaseException | None,
    ) -> None:
        """Loop: a GET ended; its bytes join this turn's burst, or its failure fails the chunk."""
        self._net_reads.discard(holder[0])
        counters = self.owner.counters
        counters.trace.inflight_reads -= 1
        counters.trace.add("fetch_s", time.perf_counter() - started)
        if exc is not None:
            entry, reader = tile[0], tile[1]
            self.pool.fail(entry, self._read_error(reader.geometry, coord, key, exc))
            self._net_done(1)
            return
        if not self._net_landed:
            self.loop.call_soon(self._net_flush)
        self._net_landed.append((tile, coord, key, buf))

    def _net_flush(self) -> None:
        """Loop: hand this turn's finished GETs to the decode pool, ``NET_GROUP`` to a job."""
        landed, self._net_landed = self._net_landed, []
        if self._stopping:
            self._net_done(len(landed))
            return
        for i in range(0, len(landed), NET_GROUP):
            group = landed[i : i + NET_GROUP]
            fut, job = self._landings.submit(self._net_job, group)
            self._track(job)
            fut.add_done_callback(functools.partial(self._net_decoded, group))

    def _net_decoded(self, group: list, fut: asyncio.Future) -> None:
        """Loop: a decode job landed; its permits go back and more GETs start."""
        if not fut.cancelled() and fut.exception() is not None:  # a bug, not a bad chunk: its entries raise it
            error = fut.exception()
            assert error is not None
            for (entry, *_), *_ in group:
                self.pool.fail(entry, error)
        self._net_done(len(group))

    def _net_done(self, n: int) -> None:
        for _ in range(n):
            self.semaphore.release()
            self._work_ended(None)
        self._net_pump()

    def _net_cancel(self) -> None:
        """Loop: stop this pass's GETs (their connections close) and give back their permits and waiter."""
        self._net_queue.clear()
        if self._net_waiter is not None and not self._net_waiter.done():
            self._net_waiter.cancel()
        reads, self._net_reads = list(self._net_reads), set()
        for read in reads:
            read.cancel()
            self.owner.counters.trace.inflight_reads -= 1
        self._net_done(len(reads))

    def _net_job(self, group: list[tuple[_Tile, Any, str, Buffer | None]]) -> None:
        """Decode thread: decode and place a burst's tiles from their bytes, landing them with one pool wake-up."""
        tally = _Tally()
        landed: list[tuple[Entry, int, np.ndarray]] = []
        for (entry, reader, chunk_index, t), coord, key, buf in group:
            if self._stopping or entry.state == FAILED:
                continue
            try:
                data = self._tile(entry, reader, chunk_index, t, coord, key, buf, tally)
            except Exception as exc:  # a bad chunk (or a bug): its entry's waiters raise it
                self.pool.fail(entry, exc)
                continue
            if data is not None:
                landed.append((entry, t, data))
        tally.add_to(self.owner.counters, self.pool.lock)
        self.pool.deliver_many(landed)

"""The disk-cache side of a pass: look its chunks up on disk, revive them, fetch the rest.

A mixin of ``PassDriver``, on the loop like the driver itself (the lookups
run on the decode pool); the state it uses lives on the driver and is
declared here for the type checker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable

from ..cache import DiskCache
from .pool import ChunkPool, Entry, Owner
from .reader import ArrayReader


def _lookup_all(cache: DiskCache, requests: list) -> list:
    """Decode thread: look up many chunks on disk; a failure is returned in its place, not raised."""
    out: list = []
    for path, chunk_index, shapes, dtype in requests:
        try:
            out.append(cache.lookup(path, chunk_index, shapes, dtype))
        except Exception as exc:  # handed to that chunk's entry, the others still revive
            out.append(exc)
    return out


class _Revivals:
    """Disk-cache methods of ``PassDriver``."""

    cache: DiskCache | None
    pool: ChunkPool
    owner: Owner
    semaphore: asyncio.Semaphore
    executor: concurrent.futures.Executor
    loop: asyncio.AbstractEventLoop
    _turn: asyncio.Future | None  # the latest lookup's: its misses are fetched first

    def _fetch(self, entry: Entry, reader: ArrayReader, chunk_index: int) -> None:
        raise NotImplementedError  # PassDriver's

    def _orphan(self, job: concurrent.futures.Future, cleanup: Callable[[], None]) -> None:
        raise NotImplementedError  # PassDriver's

    def _forget(self, reader: ArrayReader, chunk_index: int) -> None:
        raise NotImplementedError  # _TileJobs'

    async def _revive_or_fetch(self, items: list[tuple[Entry, ArrayReader, int]]) -> None:
        """Serve chunks from the disk cache (no fetch, no decode, no transform), fetch the rest.

        One executor job looks up a block's worth of chunks, so reviving costs
        one thread hop per batch of lookups; it runs as a task, overlapping the
        admission of later chunks, under the ``max_inflight`` semaphore.
        """
        cache = self.cache
        assert cache is not None  # revival is scheduled only with a disk cache
        requests = [(r.geometry.path, c, r.entry_tile_shapes(c), r.output.dtype) for _, r, c in items]
        # lookups run side by side, but their misses are fetched in the order they were admitted (first
        # blocks first): a later block's lookup that finishes sooner waits for the earlier one's turn
        turn, self._turn = self._turn, self.loop.create_future()
        mine = self._turn
        try:

            def forget_all() -> None:  # mappings of lookups nobody will adopt
                for _, r, c in items:
                    self._forget(r, c)

            async with self.semaphore:
                job = self.executor.submit(_lookup_all, cache, requests)
                try:
                    results = await asyncio.wrap_future(job)
                except asyncio.CancelledError:
                    self._orphan(job, forget_all)  # the lookups still finish in their thread
                    raise
            if turn is not None:
                try:
                    await asyncio.shield(turn)
                except asyncio.CancelledError:
                    forget_all()
                    raise
            self._dispatch(items, results)
        finally:
            if not mine.done():
                mine.set_result(None)

    def _dispatch(self, items: list[tuple[Entry, ArrayReader, int]], results: list) -> None:
        """Loop: hand each looked-up chunk its revived tiles, its error, or a fetch."""
        cache = self.cache
        assert cache is not None
        for (entry, reader, chunk_index), result in zip(items, results):
            path = reader.geometry.path
            if isinstance(result, BaseException):
                self.pool.fail(entry, result)
            elif result is not None:
                if not self.pool.replace_tiles(entry, result, reader.ready_origins(), revived_for=self.owner):
                    self._forget(reader, chunk_index)  # abandoned while we looked it up
            elif cache.readonly:
                self.pool.fail(entry, cache.miss_error(path, chunk_index))
            else:
                self._fetch(entry, reader, chunk_index)

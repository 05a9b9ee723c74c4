"""The disk-cache side of a pass: look up admitted chunks in the cache, revive the hits, fetch the rest.

A mixin of ``PassDriver`` (``scheduler``): it runs on zarr's loop and sends
the lookups to the decode pool in batches. The state it uses lives on the
driver and is declared here for the type checker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable

from ..cache import DiskCache
from .pool import ChunkPool, Entry, Owner
from .reader import ArrayReader

__all__: list[str] = []


def _lookup_all(cache: DiskCache, requests: list) -> list:
    """Decode thread: look up many chunks; a failure is returned in its place, not raised."""
    out: list = []
    for path, chunk_index, shapes, dtype in requests:
        try:
            out.append(cache.lookup(path, chunk_index, shapes, dtype))
        except Exception as exc:  # handed to that chunk's entry, the others still revive
            out.append(exc)
    return out


class _Revival:
    """Disk-cache revival methods of ``PassDriver``."""

    cache: DiskCache | None
    pool: ChunkPool
    owner: Owner
    semaphore: asyncio.Semaphore
    executor: concurrent.futures.Executor

    def _orphan(self, job: concurrent.futures.Future, cleanup: Callable[[], None]) -> None:
        raise NotImplementedError  # PassDriver's

    def _forget(self, reader: ArrayReader, chunk_index: int) -> None:
        raise NotImplementedError  # _TileJobs'

    def _fetch(self, entry: Entry, reader: ArrayReader, chunk_index: int) -> None:
        raise NotImplementedError  # PassDriver's

    async def _revive_or_fetch(self, items: list[tuple[Entry, ArrayReader, int]]) -> None:
        """Serve chunks from the disk cache (no fetch, no decode, no transform), fetch the rest.

        One executor job looks up a block's worth of chunks, so reviving costs
        one thread hop per batch of lookups; it runs as a task, overlapping the
        admission of later chunks, under the ``max_inflight`` semaphore.
        """
        cache = self.cache
        assert cache is not None  # revival is scheduled only with a disk cache
        requests = [(r.source, c, r.entry_tile_shapes(c), r.output.dtype) for _, r, c in items]
        async with self.semaphore:
            job = self.executor.submit(_lookup_all, cache, requests)
            try:
                results = await asyncio.wrap_future(job)
            except asyncio.CancelledError:
                # the lookups still finish in their thread: let go of mappings nobody will adopt
                def forget_all() -> None:
                    for _, r, c in items:
                        self._forget(r, c)

                self._orphan(job, forget_all)
                raise
        for (entry, reader, chunk_index), result in zip(items, results):
            if isinstance(result, BaseException):
                self.pool.fail(entry, result)
            elif result is not None:
                if not self.pool.replace_tiles(entry, result, reader.ready_origins(), revived_for=self.owner):
                    self._forget(reader, chunk_index)  # abandoned while we looked it up
            elif cache.readonly:
                self.pool.fail(entry, cache.miss_error(reader.source, chunk_index))
            else:
                self._fetch(entry, reader, chunk_index)

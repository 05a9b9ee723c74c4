"""``Revivals``: the disk-cache tile source: look a pass's chunks up on disk, revive them, claim the misses, fetch the rest.

It runs on the loop like the driver (the lookups run on the decode pool)
and hands the misses to the tile source of the pass's store.

A miss is claimed for this process before it is fetched (``DiskCache.find``);
one that another writer of the ``cache_dir`` is making is looked up again a
little later, so it is revived rather than fetched twice. Claims this pass
took and did not write are released when it stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Protocol

from ...cache import DiskCache
from ..pool.chunk_pool import PENDING, ChunkPool, Entry, Owner
from ..reads.reader import ArrayReader
from ..reads.window import WindowUser
from .finishing import ChunkFinisher
from .tasks import PassTasks

__all__ = ["BUSY_POLL_MAX_S", "BUSY_POLL_S", "BUSY_WAIT_S", "Revivals", "TileSource"]

# a chunk another writer of the cache_dir is making is looked up again after this, doubling up to
# BUSY_POLL_MAX_S; past BUSY_WAIT_S (a writer stuck or stopped) it is fetched here and kept in memory
BUSY_POLL_S = 0.005
BUSY_POLL_MAX_S = 0.1
BUSY_WAIT_S = 30.0


def _lookup_all(cache: DiskCache, requests: list, claim: bool) -> list:
    """Decode thread: find many chunks on disk (claiming the misses); a failure is returned in its place."""
    out: list = []
    try:  # their files mapped (and checksummed) in one call
        premapped = cache.premap([(path, chunk_index) for path, chunk_index, _, _ in requests])
    except Exception:  # each find below meets the same trouble and reports it for its chunk
        premapped = {}
    try:
        for path, chunk_index, shapes, dtype in requests:
            try:
                out.append(cache.find(path, chunk_index, shapes, dtype, claim=claim, premapped=premapped))
            except Exception as exc:  # handed to that chunk's entry, the others still revive
                out.append(exc)
    finally:
        cache.close_premapped(premapped)
    return out


class TileSource(Protocol):
    """What reads a store's tiles for a pass (``LocalTiles``, ``RemoteTiles``): the misses go there."""

    def want(self, entry: Entry, reader: ArrayReader, chunk_index: int, start: bool = True) -> None: ...

    def start(self, hold_shards: bool = False) -> None: ...


class Revivals:
    """Chunks of a pass with a disk cache: revived from disk when there, claimed and fetched by ``source`` when not."""

    def __init__(
        self,
        *,
        cache: DiskCache,
        source: TileSource,
        pool: ChunkPool,
        owner: Owner,
        semaphore: WindowUser,
        executor: concurrent.futures.Executor,
        tasks: PassTasks,
        finisher: ChunkFinisher,
    ) -> None:
        self.cache = cache
        self.source = source
        self.pool = pool
        self.owner = owner
        self.semaphore = semaphore  # the read permits: a lookup job holds one
        self.executor = executor
        self.tasks = tasks
        self.finisher = finisher  # forgets a chunk mapped for an entry abandoned meanwhile
        self._claimed: set = set()  # (path, chunk) claims this pass took (released when it stops, if still held)
        self._turn: asyncio.Future | None = None  # the latest lookup's: its misses are fetched first

    def want(self, items: list[tuple[Entry, ArrayReader, int]], work: bool = True) -> None:
        """Loop: look ``items`` up on disk in one job, as a task of the pass (``work``: counted active)."""
        self.tasks.spawn(self._revive_or_fetch(items), work=work)

    async def _revive_or_fetch(self, items: list[tuple[Entry, ArrayReader, int]], waited: float = 0.0) -> None:
        """Serve chunks from the disk cache (no fetch, no decode, no transform), fetch the rest.

        One executor job looks up a block's worth of chunks, so reviving costs
        one thread hop per batch of lookups; it runs as a task, overlapping the
        admission of later chunks, under the read permits (``max_inflight``). A miss
        is claimed for this process before it is fetched; one that another
        writer of the ``cache_dir`` is making is looked up again a little later
        (``waited`` seconds so far), so it is revived rather than fetched twice.
        """
        cache = self.cache
        requests = [(r.source, c, r.entry_tile_shapes(c), r.output.dtype) for _, r, c in items]
        # lookups run side by side, but their misses are fetched in the order they were admitted (first
        # blocks first): a later block's lookup that finishes sooner waits for the earlier one's turn
        turn, self._turn = self._turn, self.tasks.loop.create_future()
        mine = self._turn
        try:

            def forget_all() -> None:  # mappings and claims of lookups nobody will use
                for _, r, c in items:
                    self.finisher.forget(r, c)
                    cache.release(r.source, c)

            async with self.semaphore:
                job = self.executor.submit(_lookup_all, cache, requests, waited < BUSY_WAIT_S)
                try:
                    results = await asyncio.wrap_future(job)
                except asyncio.CancelledError:
                    self.tasks.orphan(job, forget_all)  # the lookups still finish in their thread
                    raise
            if turn is not None:
                try:
                    await asyncio.shield(turn)
                except asyncio.CancelledError:
                    forget_all()
                    raise
            self._dispatch(items, results, waited)
        finally:
            if not mine.done():
                mine.set_result(None)

    def _dispatch(self, items: list[tuple[Entry, ArrayReader, int]], results: list, waited: float) -> None:
        """Loop: hand each looked-up chunk its revived tiles, its error, another look later, or a fetch."""
        cache = self.cache
        busy = []
        for item, result in zip(items, results):
            entry, reader, chunk_index = item
            path = reader.source  # the disk cache names chunks by source: a path and its selection
            if isinstance(result, BaseException):
                self.pool.fail(entry, result)
            elif result.tiles is not None:
                counters = self.owner.counters
                counters.revived_from_others += result.from_other  # before the data lands, as the hit is
                if not self.pool.replace_tiles(entry, result.tiles, reader.ready_origins(), revived_for=self.owner):
                    counters.revived_from_others -= result.from_other
                    self.finisher.forget(reader, chunk_index)  # abandoned while we looked it up
            elif result.busy:
                busy.append(item)
            elif cache.readonly:
                self.pool.fail(entry, cache.miss_error(path, chunk_index))
            else:
                if result.claimed:
                    self._claimed.add((path, chunk_index))
                self.source.want(entry, reader, chunk_index, start=False)
        self.source.start()  # the misses' reads together: a shard's adjacent inner chunks share a GET
        if busy:
            self.tasks.spawn(self._after_others(busy, waited), work=True)

    async def _after_others(self, items: list[tuple[Entry, ArrayReader, int]], waited: float) -> None:
        """Look again for chunks another writer was making, once it has had a moment to finish them."""
        delay = min(BUSY_POLL_MAX_S, max(BUSY_POLL_S, waited))
        await asyncio.sleep(delay)
        live = [item for item in items if item[0].state == PENDING]
        if live:
            await self._revive_or_fetch(live, waited + delay)

    def release_claims(self) -> None:
        """Loop, once the pass stopped: claims of chunks it will not write go back, so others may make them."""
        for path, chunk_index in self._claimed:
            self.cache.release(path, chunk_index)
        self._claimed.clear()

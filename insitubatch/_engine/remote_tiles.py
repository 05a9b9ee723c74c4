"""The loop side of a pass's remote reads: one GET per tile (a byte range of a shard), then a decode job.

A mixin of ``PassDriver``: what it uses lives on the driver and is declared
here for the type checker. A tile takes one of the pass's read permits,
goes out through the pass's ``Fetcher`` (hedged, stall-proof, retried) or,
without one, the store itself, and holds the permit until its decode job
has landed. On a sharded array a tile is an inner chunk: its shard's index
first (read once per dataset, and for the whole pass as it starts, so no
tile idles a permit waiting for one), then its byte range.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest, Store

from ..cache import DiskCache
from ..errors import BadChunkError, StoreReadError
from ..io.chain import _ShardStage
from ..io.decode import ChunkDecoder
from ..io.direct import ChunkData
from ..io.geometry import ArrayGeometry
from ..plan.epoch import EpochPlan
from .fetch import Fetcher
from .landings import _Landings
from .pool import ChunkPool, Owner
from .shard_index import ShardIndexes, prefetch, read_inner_chunk, shard_keys
from .tile_jobs import _GET_IN_JOB
from .wants import Want

__all__ = ["INDEX_PREFETCH"]

# shard indexes a remote pass reads at once when it starts, ahead of the tiles that need them
INDEX_PREFETCH = 16


class _RemoteTiles:
    """Remote-read methods of ``PassDriver``."""

    store: Store
    fetcher: Fetcher | None
    semaphore: Any  # the read permits (``window.WindowUser``, an ``asyncio.Semaphore`` alike)
    pool: ChunkPool
    owner: Owner
    plan: EpochPlan
    readers: Any
    cache: DiskCache | None
    first_block: int
    shard_indexes: ShardIndexes
    _shards: dict[str, _ShardStage]
    _decoders: dict[str, ChunkDecoder]
    _prototype: BufferPrototype
    _get_sync: Callable[..., ChunkData | None] | None
    _landings: _Landings

    def _spawn(self, coro, work: bool = False) -> None:
        raise NotImplementedError  # PassDriver's

    def _track(self, job: concurrent.futures.Future) -> None:
        raise NotImplementedError  # PassDriver's

    def _tile_job(self, want: Want, coord, key: str, buf) -> None:
        raise NotImplementedError  # _TileJobs'

    @staticmethod
    def _read_error(g: ArrayGeometry, coord, key: str, exc: BaseException) -> StoreReadError:
        raise NotImplementedError  # _TileJobs'

    def _prefetch_shard_indexes(self) -> None:
        """A remote store: read the indexes of the shards this pass reads, in first-use order, as it starts."""
        sharded = {source: r for source, r in self.readers.items() if r.geometry.sharded_reads}
        # a local store reads an index in a decode job, as fast as a tile; with a disk cache, chunks it
        # revives need no index, and the misses read theirs on demand
        if not sharded or self._get_sync is not None or self.cache is not None:
            return
        plan = self.plan
        order = [
            i for i in np.argsort(plan.read_first, kind="stable").tolist() if plan.read_last[i] >= self.first_block
        ]
        wanted: dict[str, tuple[str, _ShardStage]] = {}
        for source, r in sharded.items():
            chunks = [plan.reads[i][1] for i in order if plan.reads[i][0] == source]
            for key in shard_keys(r.geometry, r.layout.tiles, chunks):
                wanted.setdefault(key, (key, self._shards[r.geometry.path]))
        self._spawn(
            prefetch(self.shard_indexes, list(wanted.values()), self._get_range, self.semaphore, INDEX_PREFETCH)
        )

    async def _get_range(self, key: str, byte_range: ByteRequest | None, size_hint: int | None = None) -> Buffer | None:
        if self.fetcher is not None:  # a remote store: hedged, stall-proof, retried; it counts GETs and bytes
            return await self.fetcher.get(key, byte_range, size_hint)
        return await self.store.get(key, prototype=self._prototype, byte_range=byte_range)

    async def _get_tile(self, g: ArrayGeometry, coord, key: str) -> ChunkData | BadChunkError | None:
        """Loop: a tile's bytes (None: missing); an inner chunk of a shard by byte range (``read_inner_chunk``)."""
        if not g.sharded_reads:
            return await self._get_range(key, None, g.tile_nbytes)
        stage, decoder = self._shards[g.path], self._decoders[g.path]
        return await read_inner_chunk(self.shard_indexes, stage, decoder, coord, self._get_range)

    async def _fetch_tile(self, want: Want) -> None:
        entry, reader, k = want.consumers[0]
        g = reader.geometry
        coord = reader.tile_coord(want.chunk_index, k)
        key = g.tile_key(coord)[0]
        buf: Buffer | object | None  # _GET_IN_JOB: the tile job reads the key itself
        async with self.semaphore:
            if self._get_sync is None:
                trace = self.owner.counters.trace
                trace.inflight_reads += 1
                t0 = time.perf_counter()
                try:
                    buf = await self._get_tile(g, coord, key)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    error = self._read_error(g, coord, key, exc)
                    for consumer, _, _ in want.seal():
                        self.pool.fail(consumer, error)
                    return
                finally:
                    trace.inflight_reads -= 1
                    trace.add("fetch_s", time.perf_counter() - t0)
                if self.fetcher is None:  # (the fetcher counts its GETs and bytes itself)
                    counters = self.owner.counters
                    counters.gets += 1
                    if buf is not None and not isinstance(buf, BadChunkError):
                        counters.get_bytes += len(buf)
            else:
                buf = _GET_IN_JOB
            # one hop: the decode thread (reading the key too on a sync store) decodes, places and delivers
            landed, job = self._landings.submit(self._tile_job, want, coord, key, buf)
            self._track(job)
            try:
                await landed
            except Exception as exc:
                for consumer, _, _ in want.consumers:
                    self.pool.fail(consumer, exc)

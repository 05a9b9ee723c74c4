"""The last tile of a chunk: assemble and transform the chunk, write it to the disk cache, hand it to the pool.

``ChunkFinisher`` runs on the decode threads, held by the pass's
``TileJobs``. A chunk is *staged* tile by tile when it is transformed (assembled
first when it holds several tiles) or persisted; the thread that lands its
last tile finishes it. A transformed chunk is one array of the transform's
output, at the origin of its rank (which may differ from the stored array's). A chunk the disk cache does not keep (a full disk, the disk budget,
another writer's claim) stays in memory, under the pool's budget.
"""

from __future__ import annotations

import logging
import time
from typing import cast

import numpy as np

from ...cache import DiskCache
from ...transforms import ChunkRead, DecodedChunk, run_pipeline
from ..pool.chunk_pool import ChunkPool, Entry, Owner
from ..reads.reader import ArrayReader, fill_value_of
from .kernels import assemble_tiles, fill_region

__all__ = ["BAD_TILE", "BadTile", "ChunkFinisher"]

logger = logging.getLogger("insitubatch")


class BadTile:
    """Marks a bad tile of a chunk that is assembled: its rectangle is filled in place."""


BAD_TILE = BadTile()


class ChunkFinisher:
    """A pass's chunks that land whole: staged tile by tile, then assembled, transformed and persisted."""

    def __init__(self, pool: ChunkPool, owner: Owner, cache: DiskCache | None) -> None:
        self.pool = pool
        self.owner = owner
        self.cache = cache
        self._budget_warned = False  # this pass already said the disk budget is spent

    def transform(self, reader: ArrayReader, chunk_index: int, data: np.ndarray) -> np.ndarray:
        """Decode thread: run ``reader``'s chunk transforms on a decoded chunk (timed as ``transform_s``)."""
        g = reader.geometry
        chunk = DecodedChunk(ChunkRead(g.path, chunk_index), data, chunk_index * g.sample_chunk_size)
        t0 = time.perf_counter()
        try:
            return run_pipeline(reader.pipeline, chunk, reader.stages)
        finally:
            self.owner.counters.trace.add("transform_s", time.perf_counter() - t0)

    def stage(self, entry: Entry, reader: ArrayReader, chunk_index: int, tile: int, data) -> None:
        """Decode thread: hold a tile until the chunk is complete; the last one assembles/transforms/persists it."""
        if not self.pool.stage(entry, tile, data):
            return
        tiles, origins = self._finalize(entry, reader, chunk_index)
        if not self.pool.replace_tiles(entry, tiles, origins):
            self.forget(reader, chunk_index)  # abandoned while it was being finished

    def forget(self, reader: ArrayReader, chunk_index: int) -> None:
        """Unmap a chunk the cache committed for an entry nobody adopted (its file stays if persisted).

        An entry another pass fetches or will adopt keeps the mapping: it is that pass's now.
        """
        source = reader.source
        if self.cache is not None and not self.pool.kept_for_others((source, chunk_index), self.owner):
            self.cache.evict(source, chunk_index)

    def _finalize(self, entry: Entry, reader: ArrayReader, chunk_index: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Decode thread: assemble + transform a multi-tile chunk, and write it to the disk cache; returns tiles + origins."""
        g = reader.geometry
        # complete: every tile staged (a BAD_TILE mark only where the chunk assembles, filled below)
        tiles = cast("list[np.ndarray]", list(entry.tiles))
        # a pending entry holds the pieces' origins in the selected field; a transformed chunk is one
        # array at the origin of the transform's output, whose rank may differ (a dropped or added axis)
        origins = reader.ready_origins()
        if reader.assembles:
            n = g.chunk_len(chunk_index)
            full = np.empty((n, *g.inner_shape), dtype=g.dtype)
            good = [t for t, part in enumerate(tiles) if part is not BAD_TILE]
            assemble_tiles(full, [tiles[t] for t in good], reader.origins[good])
            for t in (t for t, part in enumerate(tiles) if part is BAD_TILE):
                piece = reader.layout.pieces[t]
                fill_region(full, (0, *piece.origin), (n, *piece.shape), fill_value_of(g))
            tiles = [self.transform(reader, chunk_index, full)]
        if self.cache is not None and not entry.bad:
            tiles = self._persist(reader, chunk_index, tiles)
        elif self.cache is not None:  # never persisted: a later run retries the read
            self.cache.release(reader.source, chunk_index)
        return tiles, origins

    def _persist(self, reader: ArrayReader, chunk_index: int, tiles: list[np.ndarray]) -> list[np.ndarray]:
        """Write a finished chunk to the disk cache and hand back its mapped views (or ``tiles``, when not kept)."""
        cache = self.cache
        assert cache is not None  # called only with a disk cache
        handle = cache.begin(
            reader.source, chunk_index, len(tiles), reader.stored_tile_shape(len(tiles)), reader.output.dtype
        )
        if handle is None:  # a full disk, the disk budget, or another writer's claim: the pool keeps the tiles
            self._not_persisted(cache)
            return tiles
        try:
            for t, tile in enumerate(tiles):
                cache.write(handle, t, np.ascontiguousarray(tile))
            return cache.commit(handle, [tile.shape for tile in tiles])
        except BaseException:
            cache.abort(handle)
            raise

    def _not_persisted(self, cache: DiskCache) -> None:
        """Count a chunk the disk cache did not keep; the first one over ``cache_disk_bytes`` in a pass warns."""
        with self.pool.lock:
            self.owner.counters.not_persisted += 1
            warn = cache.over_budget and not self._budget_warned
            self._budget_warned |= warn
        if warn:
            logger.warning(
                "insitubatch: cache_dir %r holds %d bytes of chunks, and cache_disk_bytes=%d leaves no room for more; "
                "this pass keeps its new chunks in memory and does not persist them (raise cache_disk_bytes, or "
                "delete the cache_dir to rebuild it)",
                str(cache.cache_dir),
                cache.disk_used_bytes,
                cache.disk_bytes,
            )

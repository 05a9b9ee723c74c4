"""The decode-thread side of a pass: read, decode, transform, assemble and persist one tile.

A mixin of ``PassDriver``: the loop side (admission, permits, teardown)
stays in ``scheduler``; everything here runs on the decode pool. The state
it uses lives on the driver and is declared here for the type checker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import cast

import numpy as np
from zarr.abc.buffer import BufferPrototype

from ..cache import DiskCache
from ..errors import BadChunkError, StoreReadError
from ..io.decode import ChunkDecoder
from ..io.direct import ChunkData, _as_uint8
from ..io.geometry import ArrayGeometry
from ..transforms import ChunkRead, DecodedChunk, run_pipeline
from .kernels import assemble_tiles, fill_region
from .landings import _Tally
from .local_groups import PLACED, LocalGroups, decode_buffer
from .pool import FAILED, ChunkPool, Entry, Owner
from .reader import ArrayReader, BadChunkRecord, _fill_value

logger = logging.getLogger("insitubatch")


class _BadTile:
    """Marks a bad tile of a chunk that is assembled: its rectangle is filled in place."""


_BAD_TILE = _BadTile()
# a tile job's ``buf`` when the job reads the key itself (a store with a synchronous get)
_GET_IN_JOB = object()


class _TileJobs:
    """Decode-thread methods of ``PassDriver``."""

    pool: ChunkPool
    owner: Owner
    cache: DiskCache | None
    on_bad_chunk: str
    _stopping: bool
    _decoders: dict[str, ChunkDecoder]
    _prototype: BufferPrototype
    _get_sync: Callable[..., ChunkData | None] | None
    _groups: LocalGroups | None
    _kinds: dict[str, int]  # per array path: the tilegroup kernel's codec kind (sample-first zstd/blosc arrays)
    _scratches: threading.local
    _budget_warned: bool  # this pass already said the disk budget is spent

    def _record_bad(self, entry: Entry | None, record: BadChunkRecord) -> None:
        raise NotImplementedError  # PassDriver's

    @staticmethod
    def _read_error(g: ArrayGeometry, coord, key: str, exc: BaseException) -> StoreReadError:
        return StoreReadError(
            f"reading array {g.path!r} chunk {coord} (key {key!r}) failed: {type(exc).__name__}: {exc}"
        )

    def _tile_job(self, entry: Entry, reader: ArrayReader, chunk_index: int, tile: int, coord, key: str, buf) -> None:
        """Decode thread: one tile from its bytes (or its key, on a sync store) into the pool."""
        tally = _Tally()
        try:
            data = self._tile(entry, reader, chunk_index, tile, coord, key, buf, tally)
        finally:
            tally.add_to(self.owner.counters, self.pool.lock)
        if data is not None:
            self.pool.deliver(entry, tile, data)

    def _group_job(self, group: list[tuple[Entry, ArrayReader, int, int]]) -> None:
        """Decode thread: read, decode and place a group of tiles, landing them with one pool wake-up.

        Tiles the group kernel can take are read and decoded in one call
        (``local_groups``); the rest, and any it hands back, one by one. A
        tile's failure fails its entry only.
        """
        live = [item for item in group if not self._stopping and item[0].state != FAILED]
        try:
            self._place_group(live)
        except Exception as exc:  # a bug, not a bad chunk (those fail their own entry): the group's entries raise it
            for entry, *_ in live:
                self.pool.fail(entry, exc)

    def _place_group(self, live: list[tuple[Entry, ArrayReader, int, int]]) -> None:
        tally = _Tally()
        landed: list[tuple[Entry, int, np.ndarray]] = []
        rest = live if self._groups is None else self._kernel_tiles(live, tally, landed)
        for entry, reader, chunk_index, tile in rest:
            if self._stopping or entry.state == FAILED:
                continue  # the pass is stopping, or another tile of the chunk already failed it
            g = reader.geometry
            coord = g.physical_chunk_coord(chunk_index, tile)
            try:
                data = self._tile(entry, reader, chunk_index, tile, coord, g.chunk_key(coord), _GET_IN_JOB, tally)
            except Exception as exc:  # a store or bad-chunk failure (or a bug): its entry's waiters raise it
                self.pool.fail(entry, exc)
                continue
            if data is not None:
                landed.append((entry, tile, data))
        tally.add_to(self.owner.counters, self.pool.lock)
        self.pool.deliver_many(landed)

    def _kernel_tiles(self, group: list, tally: _Tally, landed: list) -> list:
        """Place the group's tiles the kernel takes; returns the others (and those it handed back)."""
        groups = self._groups
        assert groups is not None  # called only for a local directory
        # one kernel call per codec and rank: a call's tiles share both
        by_kind: dict[tuple[int, int], tuple[list, list[bytes], list[np.ndarray], list[tuple[int, ...]]]] = {}
        rest = []
        for item in group:
            _, reader, chunk_index, tile = item
            g = reader.geometry
            kind = groups.kinds.get(g.path, 0)
            path = groups.files.path_of(g.chunk_key(g.physical_chunk_coord(chunk_index, tile))) if kind else None
            if path is None:
                rest.append(item)
                continue
            decoder = self._decoders[g.path]
            items, paths, dests, stored = by_kind.setdefault((kind, len(decoder.shape)), ([], [], [], []))
            items.append(item)
            paths.append(os.fsencode(path))
            dests.append(self.pool.take_tile(reader.tile_rows_shape(chunk_index, tile), decoder.dtype))
            stored.append(decoder.shape)
        for (kind, _), (items, paths, dests, stored) in by_kind.items():
            status, nbytes, times = groups.run(kind, paths, dests, stored)
            trace = self.owner.counters.trace
            trace.add("fetch_s", float(times[0]) / 1e9)
            trace.add("decode_s", float(times[1]) / 1e9)
            for item, dest, placed, size in zip(items, dests, status.tolist(), nbytes.tolist()):
                if placed != PLACED:
                    rest.append(item)  # the general path reads it again and raises or falls back
                    continue
                tally.gets += 1
                tally.get_bytes += size
                tally.decoded_tiles += 1
                landed.append((item[0], item[3], dest))
        return rest

    def _tile(
        self, entry: Entry, reader: ArrayReader, chunk_index: int, tile: int, coord, key: str, buf, tally: _Tally
    ) -> np.ndarray | None:
        """Decode thread: read (``buf`` is ``_GET_IN_JOB``), decode and transform one tile.

        Returns the tile for the caller to deliver, or None when it was staged
        (a chunk assembled before its transforms, or one persisted). A store
        failure raises ``StoreReadError``; a bad chunk under
        ``on_bad_chunk="raise"`` raises ``BadChunkError``. The caller adds
        ``tally`` to the counters before the tile lands, so a consumer that
        saw the data sees them too.
        """
        g = reader.geometry
        if buf is _GET_IN_JOB:
            assert self._get_sync is not None  # _GET_IN_JOB is sent only for a store that reads synchronously
            t0 = time.perf_counter()
            try:
                buf = self._get_sync(key, prototype=self._prototype)
            except Exception as exc:
                raise self._read_error(g, coord, key, exc) from exc
            finally:
                self.owner.counters.trace.add("fetch_s", time.perf_counter() - t0)
            tally.gets += 1
            tally.get_bytes += 0 if buf is None else len(buf)
        data: np.ndarray | _BadTile
        try:
            data = self._decode(reader, chunk_index, tile, coord, buf)
        except BadChunkError:
            if self.on_bad_chunk == "raise":
                raise
            data = self._bad_tile(reader, chunk_index, tile)
            # never persisted: a later run retries the read
            self._record_bad(entry, BadChunkRecord(g.path, chunk_index, g.tile_coord(tile)))
            self.owner.counters.trace.add("bad_tiles", 1)
        tally.decoded_tiles += 1
        if reader.assembles or self.cache is not None:
            self._stage(entry, reader, chunk_index, tile, data)
            return None
        assert not isinstance(data, _BadTile)  # only a chunk that assembles marks a tile, and it was staged
        return data

    def _decode(self, reader: ArrayReader, chunk_index: int, tile: int, coord, buf) -> np.ndarray:
        """Decode one stored chunk into a sample-first tile of its own, clipped to the array (decode thread).

        A zstd or blosc tile of a sample-axis-0 array goes through the
        tilegroup kernel. Otherwise a full tile of a sample-axis-0 array is
        decoded straight into the tile's own memory, a clipped one into a
        per-thread scratch chunk and its valid part copied; any other is
        decoded whole and its clipped, sample-first part copied once. The
        destination comes from the pool
        (``ChunkPool.take_tile``: an evicted tile nobody references, or new
        memory) and is overwritten whole. Either way the tile owns its memory:
        it never aliases the store's or a codec's buffers, and is writeable.
        """
        g = reader.geometry
        t0 = time.perf_counter()
        decoder = self._decoders[g.path]
        shape = reader.tile_rows_shape(chunk_index, tile)
        kind = self._kinds.get(g.path, 0) if buf is not None else 0
        data = self._kernel_tile(kind, buf, shape, decoder) if kind else None
        if data is None:
            data = self._general_tile(reader, chunk_index, tile, coord, buf, shape, decoder)
        self.owner.counters.trace.add("decode_s", time.perf_counter() - t0)
        if reader.pipeline and g.tiles_per_chunk == 1:
            data = self._transform(reader, chunk_index, data)
        return data

    def _kernel_tile(self, kind: int, buf, shape: tuple[int, ...], decoder: ChunkDecoder) -> np.ndarray | None:
        """Decode thread: a zstd/blosc tile of a sample-first array, frame checks, decode and an edge's copy in C.

        None when the kernel hands it back (the general path then raises or falls back).
        """
        dest = self.pool.take_tile(shape, decoder.dtype)  # stale contents: overwritten whole when placed
        whole = self._scratch(decoder.shape, decoder.dtype).reshape(-1).view(np.uint8)
        return dest if decode_buffer(kind, _as_uint8(buf), dest, decoder.shape, whole) == PLACED else None

    def _general_tile(
        self,
        reader: ArrayReader,
        chunk_index: int,
        tile: int,
        coord,
        buf,
        shape: tuple[int, ...],
        decoder: ChunkDecoder,
    ) -> np.ndarray:
        """Decode thread: a tile through the decoder's chain, then its clipped, sample-first part into pool memory.

        The destination comes from the pool and is overwritten whole.
        """
        g = reader.geometry
        if g.sample_axis == 0 and shape == decoder.shape:
            data = self.pool.take_tile(shape, decoder.dtype)
            decoder.decode_into(buf, coord, data)
        elif g.sample_axis == 0:  # a clipped edge tile: whole into this thread's scratch, then its valid part
            whole = self._scratch(decoder.shape, decoder.dtype)
            decoder.decode_into(buf, coord, whole)
            data = self.pool.take_tile(shape, decoder.dtype)
            np.copyto(data, whole[reader.selection(chunk_index, tile)])
        else:
            raw = decoder(buf, coord)
            data = self.pool.take_tile(shape, raw.dtype)
            np.copyto(data, np.moveaxis(raw[reader.selection(chunk_index, tile)], g.sample_axis, 0))
        return data

    def _scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Decode thread: this thread's array of ``shape`` to decode a whole edge chunk into before clipping.

        Reused for every edge tile the thread decodes (no allocation, no page
        faults per tile); freed with the driver.
        """
        arrays = getattr(self._scratches, "arrays", None)
        if arrays is None:
            arrays = self._scratches.arrays = {}
        whole = arrays.get((shape, dtype))
        if whole is None:
            whole = arrays[(shape, dtype)] = np.empty(shape, dtype=dtype)
        return whole

    def _transform(self, reader: ArrayReader, chunk_index: int, data: np.ndarray) -> np.ndarray:
        g = reader.geometry
        chunk = DecodedChunk(ChunkRead(g.path, chunk_index), data, chunk_index * g.sample_chunk_size)
        t0 = time.perf_counter()
        try:
            return run_pipeline(reader.pipeline, chunk, reader.stages)
        finally:
            self.owner.counters.trace.add("transform_s", time.perf_counter() - t0)

    def _bad_tile(self, reader: ArrayReader, chunk_index: int, tile: int) -> np.ndarray | _BadTile:
        """A bad tile's stand-in: NaN for floats, else the fill value (then transformed like any tile).

        A tile of a chunk that is assembled before its transforms is only
        marked; ``_finalize`` fills its rectangle of the chunk in place.
        """
        g = reader.geometry
        if reader.assembles:
            return _BAD_TILE
        shape = reader.tile_rows_shape(chunk_index, tile)
        data = np.empty(shape, dtype=g.dtype)
        fill_region(data, (0,) * data.ndim, shape, _fill_value(g))
        if reader.pipeline and g.tiles_per_chunk == 1:
            data = self._transform(reader, chunk_index, data)
        return data

    def _stage(self, entry: Entry, reader: ArrayReader, chunk_index: int, tile: int, data) -> None:
        """Decode thread: hold a tile until the chunk is complete; the last one assembles/transforms/persists it."""
        if not self.pool.stage(entry, tile, data):
            return
        tiles, origins = self._finalize(entry, reader, chunk_index)
        if not self.pool.replace_tiles(entry, tiles, origins):
            self._forget(reader, chunk_index)  # abandoned while it was being finished

    def _forget(self, reader: ArrayReader, chunk_index: int) -> None:
        """Unmap a chunk the cache committed for an entry nobody adopted (its file stays if persisted).

        An entry another pass fetches or will adopt keeps the mapping: it is that pass's now.
        """
        path = reader.geometry.path
        if self.cache is not None and not self.pool.kept_for_others((path, chunk_index), self.owner):
            self.cache.evict(path, chunk_index)

    def _finalize(self, entry: Entry, reader: ArrayReader, chunk_index: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Decode thread: assemble + transform a multi-tile chunk, and write it to the disk cache."""
        g = reader.geometry
        # complete: every tile staged (a _BAD_TILE mark only where the chunk assembles, filled below)
        tiles = cast("list[np.ndarray]", list(entry.tiles))
        origins = entry.origins
        if reader.assembles:
            n = g.chunk_len(chunk_index)
            full = np.empty((n, *g.inner_shape), dtype=g.dtype)
            good = [t for t, part in enumerate(tiles) if part is not _BAD_TILE]
            assemble_tiles(full, [tiles[t] for t in good], reader.origins[good])
            for t in (t for t, part in enumerate(tiles) if part is _BAD_TILE):
                fill_region(
                    full, (0, *reader.origins[t].tolist()), (n, *reader.tile_shapes[t].tolist()), _fill_value(g)
                )
            tiles = [self._transform(reader, chunk_index, full)]
            origins = reader.single_origin
        if self.cache is not None and not entry.bad:
            tiles = self._persist(reader, chunk_index, tiles)
        elif self.cache is not None:  # never persisted: a later run retries the read
            self.cache.release(g.path, chunk_index)
        return tiles, origins

    def _persist(self, reader: ArrayReader, chunk_index: int, tiles: list[np.ndarray]) -> list[np.ndarray]:
        """Write a finished chunk to the disk cache and hand back its mapped views (or ``tiles``, when not kept)."""
        cache = self.cache
        assert cache is not None  # called only with a disk cache
        handle = cache.begin(
            reader.geometry.path, chunk_index, len(tiles), reader.stored_tile_shape(len(tiles)), reader.output.dtype
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

"""The scheduler: one pass's fetches, driven on zarr's own store-IO event loop.

The driver walks the plan's reads in admission order. A read already in the
pool is pinned and costs nothing; a miss is admitted under the pass's
read-ahead limit and its tiles are fetched with one ``max_inflight``
semaphore over every tile, awaited inline on the store, decoded on the
process-wide ``insitu-dec`` pool (passed explicitly, never the loop's
default executor) and adopted into the slot by reference. Teardown cancels
only the tasks this driver started, waits for the decode-pool jobs they left
behind, and only then lets the pool hand this pass's unfinished fetches to a
pass still waiting on them (``Owner.refetch``, re-admitted on the loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import zarr.core.sync
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype

from ..cache import DiskCache
from ..errors import BadChunkError, StoreReadError
from ..io.decode import make_decoder
from ..io.geometry import ArrayGeometry
from ..plan.epoch import EpochPlan
from ..transforms import ChunkRead, ChunkTransform, DecodedChunk, output_geometry, run_pipeline, stage_outputs
from .kernels import place_tile
from .pool import PENDING, ChunkPool, Owner, Slot

__all__ = ["BadChunkRecord", "PassDriver", "decode_pool", "zarr_loop"]

DECODE_THREAD_PREFIX = "insitu-dec"
# disk-cache lookups sent to the decode pool in one job (at most a block's worth)
REVIVE_BATCH = 64
_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def zarr_loop() -> asyncio.AbstractEventLoop:
    """zarr's process-wide store-IO loop, which the scheduler shares."""
    return zarr.core.sync._get_loop()


def decode_pool(threads: int | None = None) -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide decode pool for ``threads`` workers (default: one per core).

    Never shut down by a pass: it outlives every dataset, like zarr's loop.
    """
    n = int(threads) if threads else (os.cpu_count() or 1)
    with _pools_lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix=DECODE_THREAD_PREFIX)
        return pool


@dataclass(frozen=True)
class BadChunkRecord:
    """A tile that failed to decode under ``on_bad_chunk="nan"``."""

    array: str
    chunk_index: int
    inner_coord: tuple[int, ...]


@dataclass
class ArrayReader:
    """Everything the driver needs to fetch, decode and transform one array path's reads.

    ``output`` is the geometry after chunk transforms: what slots hold and
    gather copies. With a pipeline on a multi-tile chunk, tiles are assembled
    into one scratch chunk before the transforms run.
    """

    geometry: ArrayGeometry
    pipeline: tuple[ChunkTransform, ...]
    stages: list
    output: ArrayGeometry
    origins: np.ndarray
    tile_shapes: np.ndarray

    @classmethod
    def build(cls, geometry: ArrayGeometry, pipeline: Sequence[ChunkTransform]) -> ArrayReader:
        pipeline = tuple(pipeline)
        out = output_geometry(geometry, pipeline)
        if geometry.tiles_per_chunk == 1:
            origins = np.zeros((1, len(out.inner_shape)), dtype=np.intp)
        else:
            origins = geometry.tile_origins()
        return cls(geometry, pipeline, stage_outputs(pipeline, geometry), out, origins, geometry.tile_shapes())

    @property
    def assembles(self) -> bool:
        return bool(self.pipeline) and self.geometry.tiles_per_chunk > 1

    @property
    def single(self) -> bool:
        """Whether a ready slot holds one tile spanning the whole (post-transform) field."""
        return self.geometry.tiles_per_chunk == 1 or self.assembles

    @property
    def single_origin(self) -> np.ndarray:
        return np.zeros((1, len(self.output.inner_shape)), dtype=np.intp)

    def slot_tile_shapes(self, chunk_index: int) -> list[tuple[int, ...]]:
        """The real shape of each tile a ready slot of ``chunk_index`` holds."""
        n = self.geometry.chunk_len(chunk_index)
        if self.single:
            return [(n, *self.output.inner_shape)]
        return [(n, *shape) for shape in self.tile_shapes.tolist()]

    def stored_tile_shape(self, n_tiles: int) -> tuple[int, ...]:
        """The full (unclipped) tile shape of a slot file."""
        size = self.geometry.sample_chunk_size
        if n_tiles == 1 and self.single:
            return (size, *self.output.inner_shape)
        return (size, *self.geometry.inner_stored_chunks)

    def selection(self, chunk_index: int, tile: int) -> tuple[slice, ...]:
        """Where a decoded stored chunk's valid data sits (edge chunks are clipped), physical order."""
        inner = self._inner_selections[tile]
        axis = self.geometry.sample_axis
        return (*inner[:axis], slice(0, self.geometry.chunk_len(chunk_index)), *inner[axis:])

    @functools.cached_property
    def _inner_selections(self) -> list[tuple[slice, ...]]:
        return [tuple(slice(0, int(e)) for e in shape) for shape in self.tile_shapes]

    def ready_origins(self) -> np.ndarray:
        return self.single_origin if self.single else self.origins


def _lookup_all(cache: DiskCache, requests: list) -> list:
    """Decode thread: look up many chunks; a failure is returned in its place, not raised."""
    out: list = []
    for path, chunk_index, shapes, dtype in requests:
        try:
            out.append(cache.lookup(path, chunk_index, shapes, dtype))
        except Exception as exc:  # handed to that chunk's slot, the others still revive
            out.append(exc)
    return out


def _fill_value(geometry: ArrayGeometry):
    if geometry.dtype.kind in "fc":
        return np.nan
    return geometry.fill_value if geometry.fill_value is not None else 0


class PassDriver:
    """Fetches one pass's reads into the pool; runs as one task on zarr's loop."""

    def __init__(
        self,
        *,
        store: Store,
        pool: ChunkPool,
        owner: Owner,
        plan: EpochPlan,
        readers: Mapping[str, ArrayReader],
        semaphore: asyncio.Semaphore,
        executor: concurrent.futures.Executor,
        on_bad_chunk: str,
        bad_chunks: list[BadChunkRecord],
        first_block: int = 0,
        cache: DiskCache | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.owner = owner
        self.plan = plan
        self.readers = readers
        self.semaphore = semaphore
        self.executor = executor
        self.on_bad_chunk = on_bad_chunk
        self.bad_chunks = bad_chunks
        self.first_block = first_block
        self.cache = cache
        self.slots: list[Slot | None] = [None] * len(plan.reads)
        self.error: BaseException | None = None
        self.loop = zarr_loop()
        self._tasks: set[asyncio.Task] = set()
        # decode-pool jobs a cancelled task left running, and what to undo once each ends
        self._orphans: list[tuple[concurrent.futures.Future, Callable[[], None]]] = []
        self._stopping = False
        self._wake = asyncio.Event()
        self._main: concurrent.futures.Future | None = None
        self._decoders = {path: make_decoder(r.geometry) for path, r in readers.items()}
        self._prototype = default_buffer_prototype()
        self.seen_keys: set | None = None  # keys fetched before (any pass): an admission of one is a re-read
        self._active = 0  # this pass's tiles being fetched or decoded, and revival jobs (loop thread)
        self._waiting = False
        self._stall_from: float | None = None  # when the driver began waiting for room with nothing active
        owner.wake = lambda: self.loop.call_soon_threadsafe(self._wake.set)
        owner.refetch = lambda slot: self.loop.call_soon_threadsafe(self._readmit, slot)

    # -- lifecycle (called from other threads) -----------------------------------
    def start(self) -> None:
        self._main = asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel this driver's own tasks (never anyone else's) and wait for them and their jobs to end."""
        self._stopping = True
        if self._main is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._cancel_own(), self.loop)
        if asyncio._get_running_loop() is self.loop:  # closed from a callback on the loop (a collected pass)
            return
        try:
            fut.result(timeout)
        except concurrent.futures.TimeoutError:  # pragma: no cover - a wedged store
            pass

    async def _cancel_own(self) -> None:
        while tasks := [t for t in self._tasks if not t.done()]:  # a cancelled task may not spawn, but be safe
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._main is not None:
            self._main.cancel()
            await asyncio.gather(asyncio.wrap_future(self._main), return_exceptions=True)
        orphans, self._orphans = self._orphans, []
        for job, cleanup in orphans:
            await asyncio.gather(asyncio.wrap_future(job), return_exceptions=True)
            cleanup()

    def _record_bad(self, slot: Slot | None, record: BadChunkRecord) -> None:
        """List a tile replaced under ``on_bad_chunk="nan"`` once per epoch, and on its slot for later hits."""
        if slot is not None:
            slot.bad_records.append(record)
        if record not in self.bad_chunks:
            self.bad_chunks.append(record)

    def _orphan(self, job: concurrent.futures.Future, cleanup: Callable[[], None]) -> None:
        """A cancelled task's decode-pool job still runs: ``stop`` waits for it, then runs ``cleanup``."""
        self._orphans.append((job, cleanup))

    def _readmit(self, slot: Slot) -> None:
        """Loop: fetch again a slot adopted from a pass that closed while fetching it."""
        if self._stopping or slot.fetcher != self.owner.id or slot.state != PENDING:
            return  # closing too: the pool hands it on or abandons it when this owner closes
        reader = self.readers[slot.key[0]]
        if self.cache is not None:
            self._spawn(self._revive_or_fetch([(slot, reader, slot.key[1])]))
        else:
            self._fetch(slot, reader, slot.key[1])

    # -- the driver ----------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._drive()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug, not a bad chunk: the consumer must see it
            self.error = exc
            with self.pool.cond:
                self.pool.cond.notify_all()

    async def _drive(self) -> None:
        plan, pool, owner = self.plan, self.pool, self.owner
        revivals: list[tuple[Slot, ArrayReader, int]] = []  # admitted misses to look up on disk together
        block = -1
        for i in np.argsort(plan.read_first, kind="stable").tolist():
            if plan.read_last[i] < self.first_block:
                continue  # only batches before a resume point read it
            key = plan.reads[i]
            nbytes = int(plan.read_nbytes[i])
            if plan.read_first[i] != block or len(revivals) >= REVIVE_BATCH:
                self._flush(revivals)
                block = int(plan.read_first[i])
            if not pool.can_take(owner, nbytes):
                self._flush(revivals)
                while not pool.can_take(owner, nbytes):
                    await self._wait()
            slot = pool.pin_existing(key, owner)
            if slot is not None and slot.bad:  # a hit on a replaced tile is listed for this epoch too
                for record in list(slot.bad_records):
                    self._record_bad(None, record)
            if slot is None:
                reader = self.readers[key[0]]
                if (slot := pool.admit(key, nbytes, reader.origins, owner)) is None:
                    self._flush(revivals)
                    while (slot := pool.admit(key, nbytes, reader.origins, owner)) is None:
                        await self._wait()
                if self.seen_keys is not None:
                    owner.counters.trace.re_reads += key in self.seen_keys
                    self.seen_keys.add(key)
                if self.cache is not None:
                    revivals.append((slot, reader, key[1]))
                else:
                    self._fetch(slot, reader, key[1])
            with pool.cond:
                self.slots[i] = slot
                pool.cond.notify_all()
            await asyncio.sleep(0)  # let tile tasks start before admitting more
        self._flush(revivals)

    def _flush(self, revivals: list[tuple[Slot, ArrayReader, int]]) -> None:
        if revivals:
            self._spawn(self._revive_or_fetch(list(revivals)), work=True)
            revivals.clear()

    def _spawn(self, coro, work: bool = False) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if work:  # a fetch or revival: this pass has work in flight until the task ends
            self._work_started()
            task.add_done_callback(self._work_ended)

    def _fetch(self, slot: Slot, reader: ArrayReader, chunk_index: int) -> None:
        for t in range(reader.geometry.tiles_per_chunk):
            self._spawn(self._fetch_tile(slot, reader, chunk_index, t), work=True)

    async def _revive_or_fetch(self, items: list[tuple[Slot, ArrayReader, int]]) -> None:
        """Serve chunks from the disk cache (no fetch, no decode, no transform), fetch the rest.

        One executor job looks up a block's worth of chunks, so reviving costs
        one thread hop per batch of lookups; it runs as a task, overlapping the
        admission of later chunks, under the ``max_inflight`` semaphore.
        """
        cache = self.cache
        requests = [(r.geometry.path, c, r.slot_tile_shapes(c), r.output.dtype) for _, r, c in items]
        async with self.semaphore:
            job = self.executor.submit(_lookup_all, cache, requests)
            try:
                results = await asyncio.wrap_future(job)
            except asyncio.CancelledError:
                # the lookups still finish in their thread: let go of mappings nobody will adopt
                self._orphan(job, lambda: [self._forget(r, c) for _, r, c in items])
                raise
        for (slot, reader, chunk_index), result in zip(items, results):
            path = reader.geometry.path
            if isinstance(result, BaseException):
                self.pool.fail(slot, result)
            elif result is not None:
                if self.pool.replace_tiles(slot, result, reader.ready_origins()):
                    self.pool.count_revival(self.owner)
                else:
                    self._forget(reader, chunk_index)  # abandoned while we looked it up
            elif cache.readonly:
                self.pool.fail(slot, cache.miss_error(path, chunk_index))
            else:
                self._fetch(slot, reader, chunk_index)

    async def _wait(self) -> None:
        self._wake.clear()
        self._waiting = True
        if self._active == 0:
            self._stall_from = time.perf_counter()
        try:
            await self._wake.wait()
        finally:
            self._waiting = False
            self._end_stall()

    def _end_stall(self) -> None:
        if self._stall_from is not None:
            self.owner.counters.trace.add("budget_wait_s", time.perf_counter() - self._stall_from)
            self._stall_from = None

    # a driver waiting for room while none of its work is active is held back by the budget alone
    def _work_started(self) -> None:
        if self._active == 0:
            self._end_stall()
        self._active += 1

    def _work_ended(self, _task: asyncio.Task) -> None:
        self._active -= 1
        if self._active == 0 and self._waiting:
            self._stall_from = time.perf_counter()

    async def _fetch_tile(self, slot: Slot, reader: ArrayReader, chunk_index: int, tile: int) -> None:
        g = reader.geometry
        coord = g.physical_chunk_coord(chunk_index, tile)
        key = g.chunk_key(coord)
        async with self.semaphore:
            trace = self.owner.counters.trace
            trace.inflight_reads += 1
            t0 = time.perf_counter()
            try:
                buf = await self.store.get(key, prototype=self._prototype)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.pool.fail(slot, StoreReadError(
                    f"reading array {g.path!r} chunk {coord} (key {key!r}) failed: {type(exc).__name__}: {exc}"
                ))
                return
            finally:
                trace.inflight_reads -= 1
                trace.add("fetch_s", time.perf_counter() - t0)
            counters = self.owner.counters
            counters.gets += 1
            if buf is not None:
                counters.get_bytes += len(buf)
            try:
                data = await self.loop.run_in_executor(self.executor, self._decode, reader, chunk_index, tile, coord, buf)
            except asyncio.CancelledError:
                raise
            except BadChunkError as exc:
                if self.on_bad_chunk == "raise":
                    self.pool.fail(slot, exc)
                    return
                data = await self.loop.run_in_executor(self.executor, self._bad_tile, reader, chunk_index, tile)
                # never persisted: a later run retries the read
                self._record_bad(slot, BadChunkRecord(g.path, chunk_index, g.tile_coord(tile)))
                trace.bad_tiles += 1
            except Exception as exc:
                self.pool.fail(slot, exc)
                return
            counters.decoded_tiles += 1
            if reader.assembles or self.cache is not None:
                await self._stage(slot, reader, chunk_index, tile, data)
            else:
                self.pool.deliver(slot, tile, data)

    def _decode(self, reader: ArrayReader, chunk_index: int, tile: int, coord, buf) -> np.ndarray:
        """Decode one stored chunk and lay it out sample-first, clipped to the array (decode thread)."""
        g = reader.geometry
        t0 = time.perf_counter()
        raw = self._decoders[g.path](buf, coord)
        tile_arr = np.moveaxis(raw[reader.selection(chunk_index, tile)], g.sample_axis, 0)
        tile_arr = np.ascontiguousarray(tile_arr)
        self.owner.counters.trace.add("decode_s", time.perf_counter() - t0)
        if reader.pipeline and g.tiles_per_chunk == 1:
            if not tile_arr.flags.writeable:  # codec output can be a read-only view; transforms may write
                tile_arr = tile_arr.copy()
            tile_arr = self._transform(reader, chunk_index, tile_arr)
        return tile_arr

    def _transform(self, reader: ArrayReader, chunk_index: int, data: np.ndarray) -> np.ndarray:
        g = reader.geometry
        chunk = DecodedChunk(ChunkRead(g.path, chunk_index), data, chunk_index * g.sample_chunk_size)
        t0 = time.perf_counter()
        try:
            return run_pipeline(reader.pipeline, chunk, reader.stages)
        finally:
            self.owner.counters.trace.add("transform_s", time.perf_counter() - t0)

    def _bad_tile(self, reader: ArrayReader, chunk_index: int, tile: int) -> np.ndarray:
        """A bad tile's stand-in: NaN for floats, else the fill value (then transformed like any tile)."""
        g = reader.geometry
        shape = (g.chunk_len(chunk_index), *reader.tile_shapes[tile].tolist())
        data = np.full(shape, _fill_value(g), dtype=g.dtype)
        if reader.pipeline and g.tiles_per_chunk == 1:
            data = self._transform(reader, chunk_index, data)
        return data

    async def _stage(self, slot: Slot, reader: ArrayReader, chunk_index: int, tile: int, data: np.ndarray) -> None:
        """Hold a decoded tile until the chunk is complete, then assemble/transform/persist it once."""
        with self.pool.lock:
            if slot.tiles[tile] is None:
                slot.remaining -= 1
            slot.tiles[tile] = data
            last = slot.remaining == 0
        if not last:
            return
        job = self.executor.submit(self._finalize, slot, reader, chunk_index)
        try:
            tiles, origins = await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            self._orphan(job, lambda: self._forget(reader, chunk_index))
            raise
        except Exception as exc:
            self.pool.fail(slot, exc)
            return
        if not self.pool.replace_tiles(slot, tiles, origins):
            self._forget(reader, chunk_index)  # abandoned while it was being finished

    def _forget(self, reader: ArrayReader, chunk_index: int) -> None:
        """Unmap a chunk the cache committed for a slot nobody adopted (its file stays if persisted).

        A slot another pass fetches or will adopt keeps the mapping: it is that pass's now.
        """
        path = reader.geometry.path
        if self.cache is not None and not self.pool.kept_for_others((path, chunk_index), self.owner):
            self.cache.evict(path, chunk_index)

    def _finalize(self, slot: Slot, reader: ArrayReader, chunk_index: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Decode thread: assemble + transform a multi-tile chunk, and write it to the disk cache."""
        g = reader.geometry
        tiles = list(slot.tiles)
        origins = slot.origins
        if reader.assembles:
            full = np.empty((g.chunk_len(chunk_index), *g.inner_shape), dtype=g.dtype)
            for origin, part in zip(reader.origins, tiles):
                place_tile(full, part, (0, *origin.tolist()))
            tiles = [self._transform(reader, chunk_index, full)]
            origins = reader.single_origin
        if self.cache is not None and not slot.bad:
            tiles = self._persist(reader, chunk_index, tiles)
        return tiles, origins

    def _persist(self, reader: ArrayReader, chunk_index: int, tiles: list[np.ndarray]) -> list[np.ndarray]:
        cache = self.cache
        handle = cache.begin(reader.geometry.path, chunk_index, len(tiles), reader.stored_tile_shape(len(tiles)),
                             reader.output.dtype)
        try:
            for t, tile in enumerate(tiles):
                cache.write(handle, t, np.ascontiguousarray(tile))
            return cache.commit(handle, [tile.shape for tile in tiles])
        except BaseException:
            cache.abort(handle)
            raise

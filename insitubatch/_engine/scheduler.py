"""The scheduler: one pass's fetches, driven on zarr's own store-IO event loop.

The driver walks the plan's reads in admission order. A read already in the
pool is pinned and costs nothing; a miss is admitted under the pass's
read-ahead limit and its tiles are fetched under one ``max_inflight``
semaphore over every tile. The loop decides what and when; each tile then
costs one hop to the process-wide ``insitu-dec`` pool (passed explicitly,
never the loop's default executor), whose job decodes it straight into the
tile's own memory, transforms it and hands it to the pool. A network store's
GET is awaited on the loop first; a local or memory store is read inside the
job, with tiles grouped per job. Finished jobs return to the loop in bursts.
Teardown cancels only the tasks this driver started, waits for the decode-pool
jobs they left behind, and only then lets the pool hand this pass's unfinished
fetches to a pass still waiting on them (``Owner.refetch``, re-admitted on the loop).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import obstore
import obstore.store
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import Store, SupportsGetSync
from zarr.buffer import default_buffer_prototype
from zarr.storage import ObjectStore

from .._zarr_compat import io_loop
from ..cache import DiskCache
from ..errors import BadChunkError, StoreReadError
from ..io.decode import make_decoder
from ..io.geometry import ArrayGeometry
from ..plan.epoch import EpochPlan
from ..transforms import ChunkRead, ChunkTransform, DecodedChunk, output_geometry, run_pipeline, stage_outputs
from .kernels import assemble_tiles, fill_region
from .pool import FAILED, PENDING, ChunkPool, Owner, Slot

__all__ = ["BadChunkRecord", "PassDriver", "decode_pool", "zarr_loop"]

DECODE_THREAD_PREFIX = "insitu-dec"
# disk-cache lookups sent to the decode pool in one job (at most a block's worth)
REVIVE_BATCH = 64
_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


class _BadTile:
    """Marks a bad tile of a chunk that is assembled: its rectangle is filled in place."""


_BAD_TILE = _BadTile()
# a tile job's ``buf`` when the job reads the key itself (a store with a synchronous get)
_GET_IN_JOB = object()
# tiles one decode job reads, decodes and places on a store with a synchronous get:
# few enough that max_inflight (32) spreads over every decode thread, enough to
# cost the loop one submit and one wake-up per group (measured in bench.engine_probe)
TILE_GROUP = 4


def _sync_get(store: Store) -> Callable[..., Buffer | None] | None:
    """A synchronous ``get(key, prototype=...)`` for stores that read on the calling thread, else None.

    A local directory or memory store has no latency to overlap, so the
    decode thread reads its own tile: no hop to zarr's loop, the store's
    runtime or a ``to_thread`` worker and back. zarr's stores say so with
    ``get_sync``; obstore's local and memory backends behind zarr's
    ``ObjectStore`` are read the same way (see ``_LocalFiles``). Network
    stores keep the async path (a blocking read would hold a decode thread
    for a round trip), and so does any subclass that overrides ``get``
    without a matching ``get_sync`` (a wrapping or fault-injecting store):
    its reads must go through its ``get``.
    """
    cls = type(store)
    if cls is ObjectStore:
        raw = cast(ObjectStore, store).store
        if isinstance(raw, obstore.store.LocalStore) and raw.prefix is not None:
            return _LocalFiles(raw)
        if isinstance(raw, (obstore.store.LocalStore, obstore.store.MemoryStore)):
            return functools.partial(_obstore_get_sync, raw)
        return None
    if not isinstance(store, SupportsGetSync):
        return None
    for klass in cls.__mro__:  # the class that defines get must define get_sync too
        if "get" in vars(klass):
            return store.get_sync if "get_sync" in vars(klass) else None
    return None


def _obstore_get_sync(raw, key: str, *, prototype: BufferPrototype) -> Buffer | None:
    """What zarr's ``ObjectStore.get`` returns for a whole key, read with obstore's blocking call."""
    try:
        return prototype.buffer.from_bytes(memoryview(obstore.get(raw, key).bytes()))  # zero-copy view
    except _MISSING:
        return None


# zarr's ObjectStore reads these as a missing key (None), not an error
_MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
# keys whose object path under a local store is the key itself (object_store encodes other characters)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*")


class _LocalFiles:
    """Reads an obstore ``LocalStore``'s keys as the files under its ``prefix``.

    obstore's local backend costs ~290 µs per small key through its runtime
    (blocking or async) against ~40 µs for reading the file (bench: ERA5-like
    40 kB chunks), which alone held the local store at a fraction of the
    decode ceiling. The file is the one obstore would open: a key made of
    plain path segments maps to ``prefix/key``; any other key (encoded
    characters, ``.``/``..`` segments) goes through obstore itself.
    """

    def __init__(self, raw: obstore.store.LocalStore) -> None:
        self.raw = raw
        self.root = str(raw.prefix)

    def __call__(self, key: str, *, prototype: BufferPrototype) -> Buffer | None:
        if not _PLAIN_KEY.fullmatch(key) or any(part in (".", "..") for part in key.split("/")):
            return _obstore_get_sync(self.raw, key, prototype=prototype)
        try:
            with open(os.path.join(self.root, key), "rb") as f:
                return prototype.buffer.from_bytes(f.read())
        except _MISSING:
            return None


class _Landings:
    """Tile jobs run on the decode pool; their completions go back to the loop in bursts.

    ``asyncio.wrap_future`` wakes the loop once per job (a self-pipe write
    and a GIL hand-over each). Here a finished job queues its outcome and
    only the first of a burst schedules the drain, so tiles that finish
    while the loop is busy (or before it ran) cost it no extra wake-up.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: concurrent.futures.Executor) -> None:
        self.loop = loop
        self.executor = executor
        self._done: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._armed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> tuple[asyncio.Future, concurrent.futures.Future]:
        """Run ``fn(*args)`` on the decode pool: a loop future for its outcome, and the pool's own job.

        A task cancelled while awaiting the loop future leaves the job running;
        the job future is what a teardown waits on.
        """
        fut = self.loop.create_future()
        return fut, self.executor.submit(self._run, fut, fn, args)

    def _run(self, fut: asyncio.Future, fn: Callable[..., Any], args: tuple) -> None:
        outcome: tuple[Any, BaseException | None]
        try:
            outcome = (fn(*args), None)
        except BaseException as exc:  # handed to the awaiting task, raised there
            outcome = (None, exc)
        self._done.append((fut, *outcome))
        with self._lock:
            if self._armed:
                return  # a drain is already scheduled and will see this one
            self._armed = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed (interpreter exit): nobody awaits these any more
            with self._lock:
                self._armed = False
            raise

    def _drain(self) -> None:
        with self._lock:
            self._armed = False  # anything queued from here on schedules its own drain
        while self._done:
            fut, result, exc = self._done.popleft()
            if fut.cancelled():
                continue
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)


@dataclass
class _Tally:
    """What one decode job adds to a pass's counters, added under the pool lock in one go."""

    gets: int = 0
    get_bytes: int = 0
    decoded_tiles: int = 0

    def add_to(self, counters, lock: threading.Lock) -> None:
        with lock:
            counters.gets += self.gets
            counters.get_bytes += self.get_bytes
            counters.decoded_tiles += self.decoded_tiles


def _release(semaphore: asyncio.Semaphore, n: int) -> None:
    for _ in range(n):
        semaphore.release()


def zarr_loop() -> asyncio.AbstractEventLoop:
    """zarr's process-wide store-IO loop, which the scheduler shares."""
    return io_loop()


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
        self._get_sync = _sync_get(store)
        self._landings = _Landings(self.loop, executor)
        self._queued: collections.deque = collections.deque()  # tiles waiting for a permit (sync stores)
        self._pump: asyncio.Task | None = None
        self._jobs: set[concurrent.futures.Future] = set()  # decode-pool jobs of this pass not yet ended
        self._jobs_lock = threading.Lock()
        self._scratches = threading.local()  # per decode thread: a whole stored chunk per shape (edge tiles)
        self.seen_keys: set | None = None  # keys fetched before (any pass): an admission of one is a re-read
        self._active = 0  # this pass's tiles being fetched or decoded, and revival jobs (loop thread)
        self._waiting = False
        self._stall_from: float | None = None  # when the driver began waiting for room with nothing active
        # an unpin wakes the loop once per burst (a block's release unpins many reads), not per read
        self._wake_lock = threading.Lock()
        self._wake_armed = False
        owner.wake = self._wake_soon
        owner.refetch = lambda slot: self.loop.call_soon_threadsafe(self._readmit, slot)

    def _wake_soon(self) -> None:
        """Any thread: have the driver re-check for room; one loop wake-up covers every call until it runs."""
        with self._wake_lock:
            if self._wake_armed:
                return  # the scheduled wake-up runs after this caller's change, and sees it
            self._wake_armed = True
        try:
            self.loop.call_soon_threadsafe(self._wake_now)
        except RuntimeError:  # the loop is closed (interpreter exit): nobody waits any more
            with self._wake_lock:
                self._wake_armed = False
            raise

    def _wake_now(self) -> None:
        with self._wake_lock:
            self._wake_armed = False  # a change from here on schedules its own wake-up
        self._wake.set()

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
        if self._main is not None:  # first the driver, so it admits and spawns nothing more
            self._main.cancel()
            await asyncio.gather(asyncio.wrap_future(self._main), return_exceptions=True)
        while tasks := [t for t in self._tasks if not t.done()]:  # a cancelled task may not spawn, but be safe
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        with self._jobs_lock:
            jobs = list(self._jobs)
        if jobs:  # no read or decode of a stopped pass is still running once stop returns
            await asyncio.gather(*(asyncio.wrap_future(j) for j in jobs), return_exceptions=True)
        orphans, self._orphans = self._orphans, []
        for job, cleanup in orphans:
            await asyncio.gather(asyncio.wrap_future(job), return_exceptions=True)
            cleanup()

    def _record_bad(self, slot: Slot | None, record: BadChunkRecord) -> None:
        """List a tile replaced under ``on_bad_chunk="nan"`` once per epoch, and on its slot for later hits."""
        with self.pool.lock:  # from the loop (hits) and the decode threads (replaced tiles)
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
                # tiles decoded straight into the slot (no transform, no disk cache) are the engine's to reuse
                own = not reader.pipeline and self.cache is None
                if (slot := pool.admit(key, nbytes, reader.origins, owner, own)) is None:
                    self._flush(revivals)
                    while (slot := pool.admit(key, nbytes, reader.origins, owner, own)) is None:
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
                if slot.state != PENDING:  # a pending slot wakes the producer when it lands (under this lock)
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
        if self._get_sync is not None:
            self._queued.extend((slot, reader, chunk_index, t) for t in range(reader.geometry.tiles_per_chunk))
            if self._pump is None or self._pump.done():
                self._pump = self.loop.create_task(self._pump_tiles())
                self._tasks.add(self._pump)
                self._pump.add_done_callback(self._tasks.discard)
            return
        for t in range(reader.geometry.tiles_per_chunk):
            self._spawn(self._fetch_tile(slot, reader, chunk_index, t), work=True)

    async def _pump_tiles(self) -> None:
        """A store with a synchronous get: queued tiles go to the decode pool in groups of ``TILE_GROUP``.

        Each tile holds one ``max_inflight`` permit from here until its job
        ended. Tiles queue up while the permits are all out; with permits
        free, the pump waits up to ``TILE_GROUP - 1`` loop turns for the
        driver to admit more, so a group costs one submit and one wake-up
        even when the decode pool keeps up.
        """
        queued, semaphore = self._queued, self.semaphore
        while queued:
            await semaphore.acquire()
            held = 1
            try:
                for _ in range(TILE_GROUP - 1):
                    if len(queued) >= TILE_GROUP:
                        break
                    await asyncio.sleep(0)  # one more admission turn of the driver: a fuller group
                group = [queued.popleft()]
                while queued and len(group) < TILE_GROUP and not semaphore.locked():
                    await semaphore.acquire()  # free: returns without suspending
                    held += 1
                    group.append(queued.popleft())
                fut, job = self._landings.submit(self._group_job, group)
            except BaseException:  # cancelled while gathering a group: its permits go back
                _release(semaphore, held)
                raise
            # the permits go back when the job's outcome lands, whatever happens to the tasks
            def give_back(_fut: asyncio.Future, n: int = held) -> None:
                _release(semaphore, n)

            fut.add_done_callback(give_back)
            self._track(job)
            self._spawn(self._land_group(fut), work=True)

    async def _land_group(self, fut: asyncio.Future) -> None:
        """A group job in flight, as a task: this pass has work active until it lands."""
        await asyncio.shield(fut)

    def _track(self, job: concurrent.futures.Future) -> None:
        """Remember a decode-pool job until it ends: ``stop`` waits for every one still running."""
        with self._jobs_lock:
            self._jobs.add(job)
        job.add_done_callback(self._job_ended)

    def _job_ended(self, job: concurrent.futures.Future) -> None:
        with self._jobs_lock:  # called on the decode thread that ran it
            self._jobs.discard(job)

    async def _revive_or_fetch(self, items: list[tuple[Slot, ArrayReader, int]]) -> None:
        """Serve chunks from the disk cache (no fetch, no decode, no transform), fetch the rest.

        One executor job looks up a block's worth of chunks, so reviving costs
        one thread hop per batch of lookups; it runs as a task, overlapping the
        admission of later chunks, under the ``max_inflight`` semaphore.
        """
        cache = self.cache
        assert cache is not None  # revival is scheduled only with a disk cache
        requests = [(r.geometry.path, c, r.slot_tile_shapes(c), r.output.dtype) for _, r, c in items]
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
        for (slot, reader, chunk_index), result in zip(items, results):
            path = reader.geometry.path
            if isinstance(result, BaseException):
                self.pool.fail(slot, result)
            elif result is not None:
                if not self.pool.replace_tiles(slot, result, reader.ready_origins(), revived_for=self.owner):
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
        buf: Buffer | object | None  # _GET_IN_JOB: the tile job reads the key itself
        async with self.semaphore:
            if self._get_sync is None:
                trace = self.owner.counters.trace
                trace.inflight_reads += 1
                t0 = time.perf_counter()
                try:
                    buf = await self.store.get(key, prototype=self._prototype)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.pool.fail(slot, self._read_error(g, coord, key, exc))
                    return
                finally:
                    trace.inflight_reads -= 1
                    trace.add("fetch_s", time.perf_counter() - t0)
                counters = self.owner.counters
                counters.gets += 1
                if buf is not None:
                    counters.get_bytes += len(buf)
            else:
                buf = _GET_IN_JOB
            # one hop: the decode thread (reading the key too on a sync store) decodes, places and delivers
            landed, job = self._landings.submit(self._tile_job, slot, reader, chunk_index, tile, coord, key, buf)
            self._track(job)
            try:
                await landed
            except Exception as exc:
                self.pool.fail(slot, exc)

    @staticmethod
    def _read_error(g: ArrayGeometry, coord, key: str, exc: BaseException) -> StoreReadError:
        return StoreReadError(
            f"reading array {g.path!r} chunk {coord} (key {key!r}) failed: {type(exc).__name__}: {exc}"
        )

    def _tile_job(self, slot: Slot, reader: ArrayReader, chunk_index: int, tile: int, coord, key: str, buf) -> None:
        """Decode thread: one tile from its bytes (or its key, on a sync store) into the pool."""
        tally = _Tally()
        try:
            data = self._tile(slot, reader, chunk_index, tile, coord, key, buf, tally)
        finally:
            tally.add_to(self.owner.counters, self.pool.lock)
        if data is not None:
            self.pool.deliver(slot, tile, data)

    def _group_job(self, group: list[tuple[Slot, ArrayReader, int, int]]) -> None:
        """Decode thread: read, decode and place a group of tiles, landing them with one pool wake-up.

        A tile's failure fails its slot only.
        """
        tally = _Tally()
        landed = []
        for slot, reader, chunk_index, tile in group:
            if self._stopping or slot.state == FAILED:
                continue  # the pass is stopping, or another tile of the chunk already failed it
            g = reader.geometry
            coord = g.physical_chunk_coord(chunk_index, tile)
            try:
                data = self._tile(slot, reader, chunk_index, tile, coord, g.chunk_key(coord), _GET_IN_JOB, tally)
            except Exception as exc:  # a store or bad-chunk failure (or a bug): its slot's waiters raise it
                self.pool.fail(slot, exc)
                continue
            if data is not None:
                landed.append((slot, tile, data))
        tally.add_to(self.owner.counters, self.pool.lock)
        self.pool.deliver_many(landed)

    def _tile(self, slot: Slot, reader: ArrayReader, chunk_index: int, tile: int, coord, key: str, buf,
              tally: _Tally) -> np.ndarray | None:
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
            self._record_bad(slot, BadChunkRecord(g.path, chunk_index, g.tile_coord(tile)))
            self.owner.counters.trace.add("bad_tiles", 1)
        tally.decoded_tiles += 1
        if reader.assembles or self.cache is not None:
            self._stage(slot, reader, chunk_index, tile, data)
            return None
        assert not isinstance(data, _BadTile)  # only a chunk that assembles marks a tile, and it was staged
        return data

    def _decode(self, reader: ArrayReader, chunk_index: int, tile: int, coord, buf) -> np.ndarray:
        """Decode one stored chunk into a sample-first tile of its own, clipped to the array (decode thread).

        A full tile of a sample-axis-0 array is decoded straight into the
        tile's own memory, a clipped one into a per-thread scratch chunk and
        its valid part copied; any other is decoded whole and its clipped,
        sample-first part copied once. The destination comes from the pool
        (``ChunkPool.take_tile``: an evicted tile nobody references, or new
        memory) and is overwritten whole. Either way the tile owns its memory:
        it never aliases the store's or a codec's buffers, and is writeable.
        """
        g = reader.geometry
        t0 = time.perf_counter()
        decoder = self._decoders[g.path]
        shape = (g.chunk_len(chunk_index), *reader.tile_shapes[tile].tolist())
        # a recycled tile's stale contents are overwritten whole by either branch
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
        self.owner.counters.trace.add("decode_s", time.perf_counter() - t0)
        if reader.pipeline and g.tiles_per_chunk == 1:
            data = self._transform(reader, chunk_index, data)
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
        shape = (g.chunk_len(chunk_index), *reader.tile_shapes[tile].tolist())
        data = np.empty(shape, dtype=g.dtype)
        fill_region(data, (0,) * data.ndim, shape, _fill_value(g))
        if reader.pipeline and g.tiles_per_chunk == 1:
            data = self._transform(reader, chunk_index, data)
        return data

    def _stage(self, slot: Slot, reader: ArrayReader, chunk_index: int, tile: int, data) -> None:
        """Decode thread: hold a tile until the chunk is complete; the last one assembles/transforms/persists it."""
        with self.pool.lock:
            if slot.tiles[tile] is None:
                slot.remaining -= 1
            slot.tiles[tile] = data
            last = slot.remaining == 0
        if not last:
            return
        tiles, origins = self._finalize(slot, reader, chunk_index)
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
        # complete: every tile staged (a _BAD_TILE mark only where the chunk assembles, filled below)
        tiles = cast("list[np.ndarray]", list(slot.tiles))
        origins = slot.origins
        if reader.assembles:
            n = g.chunk_len(chunk_index)
            full = np.empty((n, *g.inner_shape), dtype=g.dtype)
            good = [t for t, part in enumerate(tiles) if part is not _BAD_TILE]
            assemble_tiles(full, [tiles[t] for t in good], reader.origins[good])
            for t in (t for t, part in enumerate(tiles) if part is _BAD_TILE):
                fill_region(full, (0, *reader.origins[t].tolist()), (n, *reader.tile_shapes[t].tolist()),
                            _fill_value(g))
            tiles = [self._transform(reader, chunk_index, full)]
            origins = reader.single_origin
        if self.cache is not None and not slot.bad:
            tiles = self._persist(reader, chunk_index, tiles)
        return tiles, origins

    def _persist(self, reader: ArrayReader, chunk_index: int, tiles: list[np.ndarray]) -> list[np.ndarray]:
        cache = self.cache
        assert cache is not None  # called only with a disk cache
        handle = cache.begin(reader.geometry.path, chunk_index, len(tiles), reader.stored_tile_shape(len(tiles)),
                             reader.output.dtype)
        try:
            for t, tile in enumerate(tiles):
                cache.write(handle, t, np.ascontiguousarray(tile))
            return cache.commit(handle, [tile.shape for tile in tiles])
        except BaseException:
            cache.abort(handle)
            raise

"""``RemoteTiles``: the tile source of a remote store: one GET per tile (a byte range of a shard), then a decode job.

A tile takes one of the pass's read permits, goes out through the pass's
``Fetcher`` (hedged, stall-proof, retried) or, without one, the store
itself, and holds the permit until its decode job has landed. Through a
fetcher, the whole tiles one ``start`` wants are one task (a
:class:`_TileBatch` of callbacks, no task or awaited future per tile):
each tile takes its permit in its admission ticket's order, its read goes
out with the others started in the same loop iteration, and its bytes go
straight to a decode job. On a sharded
array a tile is an inner chunk: its shard's index first (held by the
split's index cache, and read for the whole pass as it starts where the
pass's indexes fit that cache, so no tile idles a permit waiting for one),
then its byte range, on the condition that the shard is still the version
its index was read from (``If-Match`` its ETag); a shard changed since is
read again through its new index, once (``reads.shard_index``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest, RangeByteRequest, Store

from ...errors import BadChunkError
from ...io.chain import ShardStage
from ...io.direct import ChunkData, DecodeFailure
from ...io.geometry import ArrayGeometry
from ...plan.epoch import EpochPlan
from ...stores.read_policy import changed
from ..pool.chunk_pool import ChunkPool, Entry, Owner
from ..reads.fetch import ANY_VERSION, Fetcher, Read
from ..reads.reader import ArrayReader
from ..reads.shard_index import (
    IndexSlot,
    ShardIndex,
    check_span,
    held_index_bytes,
    plan_shards,
    prefetch,
    unsatisfiable,
)
from ..reads.shard_runs import coalesce, run_cap
from ..reads.window import WindowUser
from .landings import Landings, release_permits
from .local_groups import MAX_TILE_GROUP
from .tasks import PassTasks
from .tile_jobs import TileJobs
from .wants import Want, Wants

__all__ = ["INDEX_PREFETCH", "RemoteTiles"]

# shard indexes a remote pass reads at once when it starts, ahead of the tiles that need them
INDEX_PREFETCH = 16


class RemoteTiles:
    """Tiles of a store read on the loop: each GET awaited under a permit, then one hop to a decode job."""

    def __init__(
        self,
        *,
        store: Store,
        fetcher: Fetcher | None,
        wants: Wants,
        semaphore: WindowUser,
        pool: ChunkPool,
        owner: Owner,
        jobs: TileJobs,
        landings: Landings,
        tasks: PassTasks,
        prototype: BufferPrototype,
        group: int = MAX_TILE_GROUP,
        spread: int = 1,
    ) -> None:
        self.store = store
        self.fetcher = fetcher  # hedged and retried, and it counts its GETs (None: the store's own get)
        self.wants = wants
        self.semaphore = semaphore  # the read permits: one per tile in flight
        self.pool = pool
        self.owner = owner
        self.jobs = jobs
        self.landings = landings
        self.tasks = tasks
        self.prototype = prototype
        self._fresh: list[Want] = []  # tiles wanted, their reads not started yet (``start``)
        self._shard_wants: dict[str, list[Want]] = {}  # a shard's wanted inner chunks, till its block is admitted
        self.group = max(1, group)  # most tiles one landing job decodes
        self.spread = max(1, spread)  # the decode threads: tiles that came together are spread over as many jobs
        # whole tiles whose bytes came this loop iteration, landed together at its end (``_land_arrived``)
        self._arrived: list[tuple[_TileBatch, Want, Any, str, Any]] = []

    def want(self, entry: Entry, reader: ArrayReader, chunk_index: int, start: bool = True) -> None:
        """Loop: read the tiles ``entry`` needs: each joins a read of the same stored tile still waiting, else starts one.

        ``start=False`` leaves new reads to the next ``start``.
        """
        self._fresh.extend(self.wants.add(entry, reader, chunk_index, self.semaphore.window.ticket()))
        if start:
            self.start()

    def start(self, hold_shards: bool = False) -> None:
        """Loop: start the reads wanted since the last call; a shard's, with ``hold_shards``, once its block's
        admission is over (so the inner chunks one block wants of a shard share GETs however admission ran)."""
        fresh, self._fresh = self._fresh, []
        if fresh or (self._shard_wants and not hold_shards):
            self._fetch_remote(fresh, hold_shards)

    def prefetch_shard_indexes(
        self, plan: EpochPlan, readers: Mapping[str, ArrayReader], shards: Mapping[str, ShardStage], first_block: int
    ) -> None:
        """Read the indexes of the shards this pass reads, in first-use order, as it starts."""
        sharded = {source: r for source, r in readers.items() if r.geometry.sharded_reads}
        if not sharded:
            return
        wanted = plan_shards(plan, sharded, dict(shards), first_block)
        indexes = self.jobs.shard_indexes
        if sum(held_index_bytes(stage) for _, stage in wanted) > indexes.budget_bytes:
            return  # read ahead, they would push out the ones the next blocks need: each block reads its own
        slots = [indexes.touch(key, stage) for key, stage in wanted]
        self.tasks.spawn(prefetch(indexes, slots, self._get_index, self.semaphore, INDEX_PREFETCH))

    async def _get_range(
        self,
        key: str,
        byte_range: ByteRequest | None,
        size_hint: int | None = None,
        learn: bool = True,
        version: str | None = None,
    ) -> Any:
        """Loop: the bytes of ``key`` (None: missing); with a ``version``, ``(bytes, etag)`` (``Fetcher.get_versioned``)."""
        trace = self.owner.counters.trace
        trace.get_started()
        try:
            if self.fetcher is not None:  # a remote store: hedged, stall-proof, retried; it counts GETs and bytes
                if version is None:
                    return await self.fetcher.get(key, byte_range, size_hint, learn)
                return await self.fetcher.get_versioned(key, byte_range, version, size_hint, learn)
            buf = await self.store.get(key, prototype=self.prototype, byte_range=byte_range)
            return buf if version is None else (buf, None)  # (a store's own get tells no version)
        finally:
            trace.get_ended()

    async def _get_index(self, key: str, byte_range: ByteRequest) -> tuple[Buffer | None, str | None]:
        """A shard index's bytes and the shard's ETag: a round trip for a few bytes, which the auto window does
        not learn from."""
        return await self._get_range(key, byte_range, learn=False, version=ANY_VERSION)

    async def _get_tile(self, g: ArrayGeometry, key: str) -> ChunkData | None:
        """Loop: a stored tile's bytes (None: missing); inner chunks of shards are read by ``_fetch_shard``."""
        return await self._get_range(key, None, g.tile_nbytes)

    async def _fetch_tile(self, want: Want) -> None:
        entry, reader, k = want.consumers[0]
        g = reader.geometry
        coord = reader.tile_coord(want.chunk_index, k)
        key = g.tile_key(coord)[0]
        async with self.semaphore:
            trace = self.owner.counters.trace
            t0 = time.perf_counter()
            try:
                buf = await self._get_tile(g, key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = self.jobs.read_error(g, coord, key, exc)
                for consumer, _, _ in want.seal():
                    self.pool.fail(consumer, error)
                return
            finally:
                trace.add("fetch_s", time.perf_counter() - t0)
            if self.fetcher is None:  # (the fetcher counts its GETs and bytes itself)
                counters = self.owner.counters
                counters.gets += 1
                if buf is not None and not isinstance(buf, BadChunkError):
                    counters.get_bytes += len(buf)
            # one hop: the decode thread decodes, places and delivers
            landed, job = self.landings.submit(self.jobs.tile_job, want, coord, key, buf)
            self.tasks.track(job)
            try:
                await landed
            except Exception as exc:
                for consumer, _, _ in want.consumers:
                    self.pool.fail(consumer, exc)

    async def _fetch_tiles(self, wants: list[Want]) -> None:
        """Loop: whole tiles through the fetcher, one task: the permits free now are taken in one call, the rest
        one by one in the tiles' ticket order; each read starts with its permit and lands by callbacks; the task
        ends when every tile has landed or failed."""
        batch = _TileBatch(self, len(wants))
        semaphore = self.semaphore
        begun = 0
        try:
            while begun < len(wants):
                free = semaphore.take_free(len(wants) - begun)  # the permits free now, in one call
                if not free:
                    await semaphore.acquire(wants[begun].ticket)
                    free = 1
                for want in wants[begun : begun + free]:
                    batch.begin(want)
                begun += free
            await batch.ended
        except asyncio.CancelledError:
            batch.cancel()
            raise

    def arrive(self, batch: _TileBatch, want: Want, coord: Any, key: str, buf: Any) -> None:
        """Loop: a whole tile's bytes came; with the others of this loop iteration they go to decode jobs at its end."""
        if not self._arrived:
            self.tasks.loop.call_soon(self._land_arrived)
        self._arrived.append((batch, want, coord, key, buf))

    def _land_arrived(self) -> None:
        """Loop: the tiles that came this iteration, in decode jobs of at most ``group`` tiles, spread evenly over
        at least as many jobs as there are decode threads (a few tiles that came together decode side by side)."""
        arrived = [item for item in self._arrived if item[0].holds(item[1])]  # (not a cancelled batch's)
        self._arrived = []
        jobs = min(len(arrived), max(-(-len(arrived) // self.group), self.spread))
        for j in range(jobs):
            part = arrived[j::jobs]
            try:
                landed, job = self.landings.submit(self.jobs.landed_job, [item[1:] for item in part])
            except Exception as error:  # (the decode pool is shut: a loop callback's fault would hang the batches)
                for batch, want, *_ in part:
                    batch.failed(want, error)
                continue
            self.tasks.track(job)
            for batch, want, *_ in part:
                batch.landing(want, landed)

    def _fetch_remote(self, wants: list[Want], hold_shards: bool = False) -> None:
        """Loop: start the GETs of freshly wanted tiles: one each, or a shard's by its coalesced byte ranges.

        A shard's wanted inner chunks gather until ``hold_shards`` is False
        (the admission of a block's reads is over, or the driver must wait):
        which ones share a GET then depends on the plan alone, never on
        timing (``reads.shard_runs``).
        """
        shards = self._shard_wants
        tiles: list[Want] = []  # whole tiles through the fetcher: one batch
        for want in wants:
            _, reader, k = want.consumers[0]
            g = reader.geometry
            if g.sharded_reads:
                shards.setdefault(g.tile_key(reader.tile_coord(want.chunk_index, k))[0], []).append(want)
            elif self.fetcher is None:
                self.tasks.spawn(self._fetch_tile(want), work=True)
            else:
                tiles.append(want)
        if tiles:
            self.tasks.spawn(self._fetch_tiles(tiles), work=True)
        if not hold_shards and shards:
            self._shard_wants = {}
            for key, group in shards.items():
                self.tasks.spawn(self._fetch_shard(key, group), work=True)

    async def _fetch_shard(self, key: str, wants: list[Want]) -> None:
        """Loop: tiles of one shard, after its index: each run of adjacent inner chunks is one ranged GET.

        Inner chunks whose byte ranges touch (a gap of at most
        ``COALESCE_GAP_BYTES``) are read together; one never written needs
        no GET (the fill value), and a damaged index entry makes its tile a
        bad chunk without one.
        """
        _, reader, k = wants[0].consumers[0]
        g = reader.geometry
        decoder = self.jobs.decoders[g.path]
        # a shard's reads wait in the order its tiles were admitted, so a later block's reads cannot take the
        # permits an earlier block's inner chunks wait for while their index comes
        ticket = min((w.ticket for w in wants if w.ticket is not None), default=None)
        # each tile holds the slot it was admitted with: one, unless the split's cache let it go in between
        slots: list[IndexSlot] = []
        for w in wants:
            assert w.index_slot is not None  # (the driver gives every inner chunk's want its slot as it admits it)
            slots.append(w.index_slot)
        indexes: dict[IndexSlot, ShardIndex | DecodeFailure | None] = {}
        for slot in dict.fromkeys(slots):
            try:  # (an index read is a read in flight like any other: the one that fetches it takes a permit)
                indexes[slot] = await self.jobs.shard_indexes.read(slot, self._get_index, self.semaphore, ticket)
            except asyncio.CancelledError:
                raise
            except DecodeFailure as exc:
                indexes[slot] = exc
            except Exception as exc:  # the store failed: every tile of the shard read now raises it
                coord = reader.tile_coord(wants[0].chunk_index, k)
                self.fail_wants(wants, self.jobs.read_error(g, coord, key, exc))
                return
        spans: dict[str | None, list[tuple[int, int, Want, Any]]] = {}  # by the ETag of the index that placed them
        for want, held in zip(wants, slots):
            _, r, tk = want.consumers[0]
            coord = r.tile_coord(want.chunk_index, tk)
            index = indexes[held]
            try:
                if isinstance(index, DecodeFailure):
                    raise index
                place = g.tile_key(coord)[1]
                assert place is not None  # sharded reads place every tile in its shard
                span = None if index is None else index.span(place)
            except DecodeFailure as exc:
                self.tasks.spawn(self._land(want, coord, key, decoder.bad_chunk(coord, str(exc))), work=True)
                continue
            if span is None:  # the shard, or this inner chunk of it, was never written: the fill value
                self.tasks.spawn(self._land(want, coord, key, None), work=True)
            else:
                spans.setdefault(held.tag, []).append((*span, want, coord))
        cap = run_cap(self.semaphore.cap)
        for tag, placed in spans.items():
            for run in coalesce(placed, cap):
                self.tasks.spawn(self._fetch_run(key, run, tag), work=True)

    async def _fetch_run(self, key: str, run: list[tuple[int, int, Want, Any]], tag: str | None = None) -> None:
        """Loop: one ranged GET for a run of adjacent inner chunks, then its tiles' landed decode jobs.

        Each tile holds a permit, as a tile read alone would: the run takes
        one per tile, all at once (``WindowUser.acquire_many``). With the
        shard's ETag ``tag`` the GET is conditional on it; a shard changed
        since is read again under the same permits (``_read_changed``).
        """
        semaphore = self.semaphore
        held = len(run)
        await semaphore.acquire_many(held, min((w.ticket for _, _, w, _ in run if w.ticket is not None), default=None))
        try:
            arrived = await self._read_run(key, run, tag)
            if arrived is _CHANGED:
                arrived = await self._read_changed(key, run, tag)
            if not arrived:
                return  # (the store failed: its tiles raise that)
            # the run's tiles came together: decoded in landed jobs, spread like a batch's (``_land_arrived``)
            jobs = min(len(arrived), max(-(-len(arrived) // self.group), self.spread))
            landings = []
            for j in range(jobs):
                part_of = arrived[j::jobs]
                landed, job = self.landings.submit(self.jobs.landed_job, part_of)
                self.tasks.track(job)
                landings.append(([item[0] for item in part_of], landed))
            for wants, landed in landings:
                try:
                    await landed
                except Exception as exc:
                    self.fail_wants(wants, exc)
        finally:
            release_permits(semaphore, held)

    async def _read_run(self, key: str, run: list[tuple[int, int, Want, Any]], tag: str | None) -> Any:
        """Loop: a run's GET (``If-Match`` ``tag`` where there is one): ``(want, coord, key, bytes or bad chunk)``
        per tile; None when the store failed (its tiles raise that); ``_CHANGED``: a 412, the shard is not ``tag``."""
        start, stop = run[0][0], run[-1][1]
        t0 = time.perf_counter()
        try:
            if tag is None:
                buf = await self._get_range(key, RangeByteRequest(start, stop), stop - start)
            else:
                buf = (await self._get_range(key, RangeByteRequest(start, stop), stop - start, version=tag))[0]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if tag is not None and changed(exc):
                return _CHANGED
            if not unsatisfiable(exc):
                _, _, want, coord = run[0]
                self.fail_wants(
                    [w for _, _, w, _ in run], self.jobs.read_error(want.consumers[0][1].geometry, coord, key, exc)
                )
                return None
            buf = None  # 416: the run starts past the shard's end, and so does every entry of it: bad chunks
        finally:
            self.owner.counters.trace.add("fetch_s", time.perf_counter() - t0)
        if self.fetcher is None:  # (the fetcher counts its GETs and bytes itself)
            self.owner.counters.gets += 1
            self.owner.counters.get_bytes += 0 if buf is None else len(buf)
        arrived: list[tuple[Want, Any, str, Any]] = []
        for a, b, want, coord in run:
            decoder = self.jobs.decoders[want.consumers[0][1].geometry.path]
            part = None if buf is None or len(buf) < b - start else buf[a - start : b - start]
            try:
                data: Any = check_span(decoder, coord, (a, b), part)
            except BadChunkError as exc:
                data = exc
            arrived.append((want, coord, key, data))
        return arrived

    async def _read_changed(
        self, key: str, run: list[tuple[int, int, Want, Any]], tag: str | None
    ) -> list[tuple[Want, Any, str, Any]] | None:
        """Loop: a run's tiles after its GET's 412 (the shard is no longer ``tag``), read through its index anew.

        The held index of version ``tag`` is let go and the index read again
        (its new ETag); the tiles are read through it, once: another 412
        makes them bad chunks (the shard kept changing). A tile the new
        index says was never written is the fill value. None: the store failed.
        """
        _, _, first, coord = run[0]
        g = first.consumers[0][1].geometry
        decoder = self.jobs.decoders[g.path]
        assert first.index_slot is not None and tag is not None  # (only a read through a tagged index meets a 412)
        indexes = self.jobs.shard_indexes
        indexes.let_go(key, tag)
        slot = indexes.touch(key, first.index_slot.stage)
        try:  # (under the run's permits: no permit of its own)
            index = await indexes.read(slot, self._get_index)
        except asyncio.CancelledError:
            raise
        except DecodeFailure as exc:
            return [(want, c, key, decoder.bad_chunk(c, str(exc))) for _, _, want, c in run]
        except Exception as exc:
            self.fail_wants([want for _, _, want, _ in run], self.jobs.read_error(g, coord, key, exc))
            return None
        arrived: list[tuple[Want, Any, str, Any]] = []
        spans: list[tuple[int, int, Want, Any]] = []
        for _, _, want, c in run:
            place = g.tile_key(c)[1]
            assert place is not None  # sharded reads place every tile in its shard
            try:
                span = None if index is None else index.span(place)
            except DecodeFailure as exc:
                arrived.append((want, c, key, decoder.bad_chunk(c, str(exc))))
                continue
            if span is None:
                arrived.append((want, c, key, None))  # never written in the new shard: the fill value
            else:
                spans.append((*span, want, c))
        runs = coalesce(spans, run_cap(self.semaphore.cap))
        for again, got in zip(runs, await asyncio.gather(*(self._read_run(key, r, slot.tag) for r in runs))):
            if got is _CHANGED:
                why = (
                    f"the shard changed while it was read (its ETag was no longer {tag}) and again after its index "
                    "was read anew: it kept changing"
                )
                got = [(want, c, key, decoder.bad_chunk(c, why)) for _, _, want, c in again]
            arrived.extend(got or ())
        return arrived

    async def _land(self, want: Want, coord: Any, key: str, buf: Any) -> None:
        """Loop: a tile decided without a GET (never written, or bad) through a decode job, under a permit."""
        async with self.semaphore.turn(want.ticket):
            landed, job = self.landings.submit(self.jobs.tile_job, want, coord, key, buf)
            self.tasks.track(job)
            try:
                await landed
            except Exception as exc:
                self.fail_wants([want], exc)

    def fail_wants(self, wants: list[Want], error: BaseException) -> None:
        """Fail every entry still waiting on ``wants`` with ``error`` (their tiles will not come)."""
        for want in wants:
            for consumer, _, _ in want.seal():
                self.pool.fail(consumer, error)


# ``_read_run``'s answer for a 412: the shard is no longer the version its index was read from.
_CHANGED = object()


class _TileBatch:
    """The whole-tile reads of one ``_fetch_tiles``: each under its permit from its read's start to its landing.

    A tile's read calls back with its bytes, which go to a decode job with the
    other tiles that came in the same loop iteration (``RemoteTiles.arrive``);
    the job's landing gives the permit back. ``ended`` is done once every
    tile has, all of them begun.
    """

    __slots__ = ("_landing", "_reading", "_pending", "ended", "tiles")

    def __init__(self, tiles: RemoteTiles, n: int) -> None:
        self.tiles = tiles
        self.ended = tiles.tasks.loop.create_future()
        self._pending = n  # tiles not yet landed (or failed), begun or not
        self._reading: dict[Want, Read] = {}  # a tile whose read is out, holding its permit
        # a tile whose bytes came, holding its permit: its decode job's landing (None until it is submitted)
        self._landing: dict[Want, asyncio.Future | None] = {}

    def begin(self, want: Want) -> None:
        """Start ``want``'s read; its permit is taken."""
        tiles = self.tiles
        fetcher = tiles.fetcher
        assert fetcher is not None  # (a batch reads through the fetcher)
        _, reader, k = want.consumers[0]
        g = reader.geometry
        coord = reader.tile_coord(want.chunk_index, k)
        key = g.tile_key(coord)[0]
        tiles.owner.counters.trace.get_started()
        t0 = time.perf_counter()
        # (the fetcher never calls back before ``start`` returns: the request goes out at the iteration's end)
        self._reading[want] = fetcher.start(
            key, None, g.tile_nbytes, lambda buf, exc: self._read(want, g, coord, key, t0, buf, exc)
        )

    def _read(self, want: Want, g: ArrayGeometry, coord: Any, key: str, t0: float, buf: Any, exc: Any) -> None:
        """A tile's read ended (the fetcher's callback): its bytes to a decode job, or its error to its consumers."""
        if self._reading.pop(want, None) is None:
            return  # (cancelled with the batch)
        tiles = self.tiles
        trace = tiles.owner.counters.trace
        trace.get_ended()
        trace.add("fetch_s", time.perf_counter() - t0)
        if exc is not None:
            tiles.fail_wants([want], tiles.jobs.read_error(g, coord, key, exc))
            self._ended()
            return
        self._landing[want] = None  # (its decode job starts at the end of this loop iteration)
        tiles.arrive(self, want, coord, key, buf)

    def holds(self, want: Want) -> bool:
        """Whether ``want``'s bytes came and wait for their decode job (False once the batch was cancelled)."""
        return want in self._landing

    def landing(self, want: Want, landed: asyncio.Future) -> None:
        """``want``'s decode job (shared with other tiles) was submitted: ``landed`` is done when it has."""
        if want in self._landing:
            self._landing[want] = landed
            landed.add_done_callback(lambda fut: self._landed(want, fut))

    def failed(self, want: Want, error: BaseException) -> None:
        """``want``'s decode job could not start: the entries that want it raise ``error``; its permit goes back."""
        if want in self._landing:
            del self._landing[want]
            self.tiles.fail_wants([want], error)
            self._ended()

    def _landed(self, want: Want, landed: asyncio.Future) -> None:
        if self._landing.pop(want, None) is None or landed.cancelled():
            return  # (cancelled with the batch; a shared landing is never cancelled)
        exc = landed.exception()
        if exc is not None:
            for consumer, _, _ in want.consumers:
                self.tiles.pool.fail(consumer, exc)
        self._ended()

    def _ended(self) -> None:
        """A tile landed or failed: its permit goes back, and the batch ends with its last tile."""
        self.tiles.semaphore.release()
        self._pending -= 1
        if self._pending == 0 and not self.ended.done():
            self.ended.set_result(None)

    def cancel(self) -> None:
        """The task was cancelled: every read still out is abandoned, every landing forgotten, every permit back."""
        reading, landing = self._reading, self._landing
        self._reading, self._landing = {}, {}
        semaphore, trace = self.tiles.semaphore, self.tiles.owner.counters.trace
        for read in reading.values():
            read.cancel()
            trace.get_ended()
            semaphore.release()
        for _ in landing:  # (a decode job runs on, other batches' tiles in it too: the pass's teardown waits for it)
            semaphore.release()

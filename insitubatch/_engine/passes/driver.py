"""The scheduler: one pass's fetches, driven on zarr's own store-IO event loop.

The driver walks the plan's reads in admission order. A read already in the
pool is pinned and costs nothing; a miss is admitted under the pass's
read-ahead limit and its tiles are fetched under the dataset's read permits
(``window``: one per tile, a pinned ``max_inflight`` or the self-tuning
limit). The loop decides what and when; each tile then
costs one hop to the process-wide ``insitu-dec`` pool (passed explicitly,
never the loop's default executor), whose job decodes it straight into the
tile's own memory, transforms it and hands it to the pool. A network store's
GET is awaited on the loop first; a local or memory store is read inside the
job, with tiles grouped per job. A remote store's GET goes through the
pass's ``Fetcher`` (hedged, stall-proof, retried). Finished jobs return to
the loop in bursts. The driver is the admission loop only: what reads a
tile is its tile source (``LocalTiles`` or ``RemoteTiles``, with
``Revivals`` in front of it under a disk cache), what decodes it the pass's
``TileJobs``, and what it has running its ``PassTasks``.
Teardown cancels only the tasks this driver started, waits for the decode-pool
jobs they left behind, and only then lets the pool hand this pass's unfinished
fetches to a pass still waiting on them (its driver hears ``adopted`` and re-admits them on the loop).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Mapping

from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype

from ...cache import DiskCache
from ...io.decode import make_decoder, shard_stage
from ...io.sync_get import sync_get
from ...plan.epoch import EpochPlan
from ...stores.local_files import LocalFiles
from ..lifecycle import EXIT_WAIT_S, exiting, running_loop
from ..loop import zarr_loop
from ..pool.chunk_pool import PENDING, ChunkPool, Entry, Owner
from ..pool.seen_reads import SeenReads
from ..reads.fetch import Fetcher
from ..reads.reader import ArrayReader, BadChunkRecord
from ..reads.shard_index import SplitIndexes
from ..reads.shard_runs import admitted_reads
from ..reads.window import WindowUser
from ..tiles.finishing import ChunkFinisher
from ..tiles.landings import Landings
from ..tiles.local_groups import MAX_TILE_GROUP, LocalGroups, kernel_kind
from ..tiles.local_tiles import LocalTiles
from ..tiles.remote_tiles import RemoteTiles
from ..tiles.revivals import Revivals
from ..tiles.tasks import PassTasks
from ..tiles.tile_jobs import TileJobs
from ..tiles.wants import Wants

__all__ = ["PassDriver"]

# disk-cache lookups sent to the decode pool in one job (at most a block's worth)
REVIVE_BATCH = 64
# reads the driver admits between two yields to the loop: a yield per read costs a loop
# turn (and the GIL, to whichever decode thread wants it) for every tile on small chunks
ADMIT_BURST = 4
# how long stopping a pass waits for its tasks and decode jobs to end (a wedged store's GET is cancelled)
STOP_WAIT_S = 30.0


class PassDriver:
    """Admits one pass's reads into the pool and hands their tiles to its tile source; one task on zarr's loop.

    It holds the parts of the pass: ``tasks`` (what it runs), ``jobs`` (the
    decode jobs, with their ``ChunkFinisher``), ``source`` (``LocalTiles`` or
    ``RemoteTiles``, by how the store reads) and, with a disk cache,
    ``revivals`` (which sends its misses to ``source``).
    """

    def __init__(
        self,
        *,
        store: Store,
        pool: ChunkPool,
        owner: Owner,
        plan: EpochPlan,
        readers: Mapping[str, ArrayReader],
        semaphore: WindowUser,
        executor: concurrent.futures.Executor,
        on_bad_chunk: str,
        bad_chunks: list[BadChunkRecord],
        first_block: int = 0,
        cache: DiskCache | None = None,
        group: int = MAX_TILE_GROUP,
        decode_threads: int = 1,
        shard_indexes: SplitIndexes | None = None,
        fetcher: Fetcher | None = None,
        after: concurrent.futures.Future | None = None,
    ) -> None:
        self.pool = pool
        self.owner = owner
        self.plan = plan
        self.readers = readers
        self.first_block = first_block
        self.cache = cache
        self.error: BaseException | None = None
        self.loop = zarr_loop()
        self.after = after  # reads that end before this pass sends its own: the dataset's open reads
        self.seen: SeenReads | None = None  # reads fetched before (any pass): an admission of one is a re-read
        self._stopping = False
        self._wake = asyncio.Event()
        self._main: concurrent.futures.Future | None = None
        self._pinned_last: collections.Counter[int] = collections.Counter()  # reads claimed, by their last block
        # an unpin wakes the loop once per burst (a block's release unpins many reads), not per read
        self._wake_lock = threading.Lock()
        self._wake_armed = False
        # a remote pass admits its second block once its first has landed (``_first_block_waits``)
        self.tasks = PassTasks(self.loop, owner.counters, gated=fetcher is not None and cache is None)
        # readers are keyed by source (a path and its selection); decoders and codec kinds by array path
        decoders = {r.geometry.path: make_decoder(r.geometry, tile=True) for r in readers.values()}
        self._shards = {r.geometry.path: shard_stage(r.geometry) for r in readers.values() if r.geometry.sharded_reads}
        shard_indexes = shard_indexes if shard_indexes is not None else SplitIndexes()  # the split's
        get_sync = sync_get(store)
        # zstd/blosc arrays with the sample axis first decode through the tilegroup kernel (any store)
        kinds = {
            r.geometry.path: k
            for r in readers.values()
            if r.geometry.sample_axis == 0 and (k := kernel_kind(decoders[r.geometry.path]))
        }
        # on a local directory their tiles are also read by it, a group per call, unless a transform or the
        # disk cache must see each tile first
        # (inner chunks of shards are ranges of a file, not files: the general path reads them)
        grouped = {
            r.geometry.path: kinds[r.geometry.path]
            for r in readers.values()
            if not r.pipeline and r.geometry.path in kinds and not r.geometry.sharded_reads
        }
        groups: LocalGroups | None = None
        if isinstance(get_sync, LocalFiles) and cache is None and grouped:
            groups = LocalGroups(get_sync, decoders, grouped)
        prototype = default_buffer_prototype()
        self.finisher = ChunkFinisher(pool, owner, cache)
        self.jobs = TileJobs(
            pool=pool,
            owner=owner,
            finisher=self.finisher,
            on_bad_chunk=on_bad_chunk,
            bad_chunks=bad_chunks,
            decoders=decoders,
            kinds=kinds,
            shards=self._shards,
            shard_indexes=shard_indexes,
            get_sync=get_sync,
            prototype=prototype,
            groups=groups,
        )
        landings = Landings(self.loop, executor)
        # stored tiles waiting to be read: another selection's entry may join one; an inner chunk takes its index slot
        wants = Wants(shard_indexes, self._shards)
        self.source: LocalTiles | RemoteTiles
        self._remote: RemoteTiles | None = None  # the source, when it reads on the loop (shard indexes read ahead)
        if get_sync is not None:
            self.source = LocalTiles(
                wants=wants, semaphore=semaphore, jobs=self.jobs, landings=landings, tasks=self.tasks, group=group
            )
        else:
            self.source = self._remote = RemoteTiles(
                store=store,
                fetcher=fetcher,
                wants=wants,
                semaphore=semaphore,
                pool=pool,
                owner=owner,
                jobs=self.jobs,
                landings=landings,
                tasks=self.tasks,
                prototype=prototype,
                group=group,
                spread=decode_threads,
            )
        self.revivals: Revivals | None = None
        if cache is not None:
            self.revivals = Revivals(
                cache=cache,
                source=self.source,
                pool=pool,
                owner=owner,
                semaphore=semaphore,
                executor=executor,
                tasks=self.tasks,
                finisher=self.finisher,
            )
        owner.listen(self)

    @property
    def entries(self) -> list[Entry | None]:
        """The entry of each of the pass's reads once claimed (``None`` before): the owner's, set by the pool."""
        return self.owner.entries

    # -- what the pool tells this pass's owner (any thread) ---------------------------
    def adopted(self, entry: Entry) -> None:
        """Any thread: fetch again, on the loop, an entry this pass adopted from a pass that closed mid-fetch."""
        self.loop.call_soon_threadsafe(self._readmit, entry)

    def room_freed(self) -> None:
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

    def stop(self, timeout: float = STOP_WAIT_S, wait: bool = True) -> None:
        """Cancel this driver's own tasks (never anyone else's); with ``wait``, until they and their jobs end.

        A loop that no longer runs (interpreter exit) has nothing of this
        pass left to run: nothing is scheduled and nothing waited for.
        """
        self._stopping = True
        self.jobs.stop()
        if self._main is None or self.loop.is_closed() or not self.loop.is_running():
            return
        try:
            fut = asyncio.run_coroutine_threadsafe(self._cancel_own(), self.loop)
        except RuntimeError:  # the loop closed meanwhile
            return
        if not wait or running_loop() is self.loop:  # on the loop itself: it cannot wait on it
            return
        try:
            fut.result(min(timeout, EXIT_WAIT_S) if exiting() else timeout)
        except concurrent.futures.TimeoutError:  # pragma: no cover - a wedged store
            pass

    async def stop_on_loop(self) -> None:
        """Loop: stop this pass's work (a finalizer's stop): cancel and wait as ``stop`` does, from the loop itself."""
        self._stopping = True
        self.jobs.stop()
        await self._cancel_own()

    async def _cancel_own(self) -> None:
        await self.tasks.cancel_all(self._main)  # the driver first, so it admits and spawns nothing more
        if self.revivals is not None:
            self.revivals.release_claims()

    def _readmit(self, entry: Entry) -> None:
        """Loop: fetch again an entry adopted from a pass that closed while fetching it."""
        if self._stopping or entry.fetcher != self.owner.id or entry.state != PENDING:
            return  # closing too: the pool hands it on or abandons it when this owner closes
        reader = self.readers[entry.key[0]]
        if self.revivals is not None:
            self.revivals.want([(entry, reader, entry.key[1])], work=False)
        else:
            self.source.want(entry, reader, entry.key[1])

    # -- the driver ----------------------------------------------------------------
    async def _run(self) -> None:
        try:
            if self.after is not None and not self.after.done():  # so the store sees them end before this pass
                await asyncio.wait({asyncio.wrap_future(self.after)})
            if not self.tasks.gated:  # else once the first block has landed
                self._prefetch_shard_indexes()
            await self._drive()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug, not a bad chunk: the consumer must see it
            self.error = exc
            with self.pool.cond:
                self.pool.cond.notify_all()

    async def _drive(self) -> None:
        plan, pool, owner = self.plan, self.pool, self.owner
        revivals: list[tuple[Entry, ArrayReader, int]] = []  # admitted misses to look up on disk together
        # admitted misses of one array chunk (its selections), fetched together so they share tile reads
        fetches: list[tuple[Entry, ArrayReader, int]] = []
        chunk: tuple[str, int] | None = None
        block = -1
        since_yield = 0
        # a remote pass sends its first block's GETs first batch first
        tasks = self.tasks
        order = admitted_reads(plan, self.first_block, tasks.gated)
        for at, i in enumerate(order):  # reads only batches before a resume point need are left out
            key = plan.reads[i]
            nbytes = int(plan.read_nbytes[i])
            if tasks.gated and block >= 0 and plan.read_first[i] != block:
                self._fetch_all(fetches)  # a remote pass admits its second block once its first has landed
                await tasks.first_block_lands()
                self._prefetch_shard_indexes()
            reader = self.readers[key[0]]
            if (reader.geometry.path, key[1]) != chunk:  # the last chunk's reads are all admitted
                chunk = (reader.geometry.path, key[1])
                self._fetch_all(fetches, start=False)
                if plan.read_first[i] != block or len(revivals) >= REVIVE_BATCH:
                    self._flush(revivals)
                    if plan.read_first[i] != block:  # the block's shards are all wanted: their GETs go
                        self._start_remote()
                    block = int(plan.read_first[i])
                if since_yield >= ADMIT_BURST:  # let the fetches start before admitting more
                    since_yield = 0
                    self._start_remote(hold_shards=True)
                    await asyncio.sleep(0)
                # a chunk's selections wait for room together: split by a wait, the first could
                # start its tile reads before the second joins them, and the tiles would be read twice
                reads, group_bytes = self._siblings(order, at, chunk)
                while reads > 1 and not pool.can_take(owner, group_bytes, reads):
                    self._flush(revivals)
                    self._fetch_all(fetches, hold_shards=self._releases_before(block))
                    await tasks.wait(self._wake)
            # tiles decoded straight into the entry (no transform, no disk cache) are the engine's to reuse
            own = not reader.pipeline and self.cache is None
            while True:  # a hit or join pins what is there; a miss is admitted; else wait for room
                entry, admitted = pool.claim(key, nbytes, reader.origins, owner, own, i)
                if entry is not None:
                    self._pinned_last[int(plan.read_last[i])] += 1
                    break
                self._flush(revivals)
                self._fetch_all(fetches, hold_shards=self._releases_before(block))
                await tasks.wait(self._wake)
            if not admitted and entry.bad:  # a hit on a replaced tile is listed for this epoch too
                for record in list(entry.bad_records):
                    self.jobs.record_bad(None, record)
            if admitted:
                if self.seen is not None:
                    owner.counters.trace.re_reads += self.seen.mark(*key)
                if self.revivals is not None:
                    revivals.append((entry, reader, key[1]))
                else:
                    fetches.append((entry, reader, key[1]))
            since_yield += 1
        self._fetch_all(fetches)
        self._flush(revivals)

    def _siblings(self, order: list[int], at: int, chunk: tuple[str, int]) -> tuple[int, int]:
        """The reads of ``chunk`` from ``order[at]`` on (the plan admits them side by side), and their bytes."""
        plan, reads, nbytes = self.plan, 0, 0
        for j in range(at, len(order)):  # (not a slice of ``order``: a copy per chunk would cost O(reads²))
            i = order[j]
            key = plan.reads[i]
            if (self.readers[key[0]].geometry.path, key[1]) != chunk:
                break
            reads += 1
            nbytes += int(plan.read_nbytes[i])
        return reads, nbytes

    def _fetch_all(
        self, fetches: list[tuple[Entry, ArrayReader, int]], start: bool = True, hold_shards: bool = False
    ) -> None:
        """Want the tiles of ``fetches``; ``start=False`` leaves remote ones to the next ``_start_remote``."""
        for entry, reader, chunk_index in fetches:
            self.source.want(entry, reader, chunk_index, start=False)
        fetches.clear()
        if start:
            self.source.start(hold_shards)

    def _releases_before(self, block: int) -> bool:
        """Whether the producer pins reads it lets go of before ``block`` (each wakes the driver): while it does, a
        driver waiting for room mid-block holds the block's shard reads back (which share a GET: the plan's alone)."""
        staying = sum(n for last, n in self._pinned_last.items() if last >= block)
        return self.owner.pinned_reads > staying

    def _start_remote(self, hold_shards: bool = False) -> None:
        """Start the remote reads wanted since the last call (a shard's, with ``hold_shards``, once its block's
        admission is over, so the inner chunks one block wants of a shard share GETs however admission ran)."""
        self.source.start(hold_shards)

    def _flush(self, revivals: list[tuple[Entry, ArrayReader, int]]) -> None:
        if revivals:
            assert self.revivals is not None  # misses are listed for revival only with a disk cache
            self.revivals.want(list(revivals))
            revivals.clear()

    def _prefetch_shard_indexes(self) -> None:
        """A remote store: read the indexes of the shards this pass reads, in first-use order, as it starts.

        A local store reads an index in a decode job, as fast as a tile; with
        a disk cache, chunks it revives need no index, and the misses read
        theirs on demand.
        """
        if self._remote is not None and self.cache is None:
            self._remote.prefetch_shard_indexes(self.plan, self.readers, self._shards, self.first_block)

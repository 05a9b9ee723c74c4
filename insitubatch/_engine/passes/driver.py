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
the loop in bursts.
Teardown cancels only the tasks this driver started, waits for the decode-pool
jobs they left behind, and only then lets the pool hand this pass's unfinished
fetches to a pass still waiting on them (``Owner.refetch``, re-admitted on the loop).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping

from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype

from ...cache import DiskCache
from ...io.decode import make_decoder, shard_stage
from ...io.sync_get import _LocalFiles, _sync_get
from ...plan.epoch import EpochPlan
from ..lifecycle import EXIT_WAIT_S, exiting
from ..loop import zarr_loop
from ..pool.chunk_pool import PENDING, ChunkPool, Entry, Owner
from ..pool.seen_reads import SeenReads
from ..reads.fetch import Fetcher
from ..reads.reader import ArrayReader, BadChunkRecord
from ..reads.shard_index import SplitIndexes
from ..reads.shard_runs import admitted_reads
from ..reads.window import WindowUser
from ..tiles.landings import _Landings, _release
from ..tiles.local_groups import MAX_TILE_GROUP, LocalGroups, kernel_kind
from ..tiles.remote_tiles import _RemoteTiles
from ..tiles.revivals import _Revivals
from ..tiles.tile_jobs import _TileJobs
from ..tiles.wants import Want, Wants

__all__ = ["PassDriver"]

# disk-cache lookups sent to the decode pool in one job (at most a block's worth)
REVIVE_BATCH = 64
# reads the driver admits between two yields to the loop: a yield per read costs a loop
# turn (and the GIL, to whichever decode thread wants it) for every tile on small chunks
ADMIT_BURST = 4
# how long stopping a pass waits for its tasks and decode jobs to end (a wedged store's GET is cancelled)
STOP_WAIT_S = 30.0


class PassDriver(_TileJobs, _Revivals, _RemoteTiles):
    """Fetches one pass's reads into the pool; runs as one task on zarr's loop."""

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
        shard_indexes: SplitIndexes | None = None,
        fetcher: Fetcher | None = None,
        after: concurrent.futures.Future | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.owner = owner
        self.plan = plan
        self.readers = readers
        self.semaphore = semaphore  # the read permits: one per tile in flight
        self.fetcher = fetcher  # a remote store's reads, hedged and retried (None: its own get, or a sync read)
        self.executor = executor
        self.on_bad_chunk = on_bad_chunk
        self.bad_chunks = bad_chunks
        self.first_block = first_block
        self.cache = cache
        self.entries: list[Entry | None] = [None] * len(plan.reads)
        self.error: BaseException | None = None
        self.loop = zarr_loop()
        self._tasks: set[asyncio.Task] = set()
        # decode-pool jobs a cancelled task left running, and what to undo once each ends
        self._orphans: list[tuple[concurrent.futures.Future, Callable[[], None]]] = []
        self._stopping = False
        self._wake = asyncio.Event()
        self._main: concurrent.futures.Future | None = None
        # readers are keyed by source (a path and its selection); decoders and codec kinds by array path
        self._decoders = {r.geometry.path: make_decoder(r.geometry, tile=True) for r in readers.values()}
        self._shards = {r.geometry.path: shard_stage(r.geometry) for r in readers.values() if r.geometry.sharded_reads}
        self.shard_indexes = shard_indexes if shard_indexes is not None else SplitIndexes()  # the split's
        self.after = after  # reads that end before this pass sends its own: the dataset's open reads
        self._prototype = default_buffer_prototype()
        self._get_sync = _sync_get(store)
        self._group = group
        # zstd/blosc arrays with the sample axis first decode through the tilegroup kernel (any store)
        self._kinds = {
            r.geometry.path: k
            for r in readers.values()
            if r.geometry.sample_axis == 0 and (k := kernel_kind(self._decoders[r.geometry.path]))
        }
        # on a local directory their tiles are also read by it, a group per call, unless a transform or the
        # disk cache must see each tile first
        # (inner chunks of shards are ranges of a file, not files: the general path reads them)
        grouped = {
            r.geometry.path: self._kinds[r.geometry.path]
            for r in readers.values()
            if not r.pipeline and r.geometry.path in self._kinds and not r.geometry.sharded_reads
        }
        self._groups: LocalGroups | None = None
        if isinstance(self._get_sync, _LocalFiles) and cache is None and grouped:
            self._groups = LocalGroups(self._get_sync, self._decoders, grouped)
        self._landings = _Landings(self.loop, executor)
        self._queued: collections.deque = collections.deque()  # tiles waiting for a permit (sync stores)
        # stored tiles waiting to be read: another selection's entry may join one; an inner chunk takes its index slot
        self._wants = Wants(self.shard_indexes, self._shards)
        self._pump: asyncio.Task | None = None
        self._remote_fresh: list[Want] = []  # remote tiles wanted, their reads not started yet (_start_remote)
        self._shard_wants: dict[str, list[Want]] = {}  # a shard's wanted inner chunks, till its block is admitted
        self._pinned_last: collections.Counter[int] = collections.Counter()  # reads claimed, by their last block
        self._jobs: set[concurrent.futures.Future] = set()  # decode-pool jobs of this pass not yet ended
        self._jobs_lock = threading.Lock()
        self._scratches = threading.local()  # per decode thread: a whole stored chunk per shape (edge tiles)
        self.seen: SeenReads | None = None  # reads fetched before (any pass): an admission of one is a re-read
        self._claimed: set = set()  # disk-cache claims this pass took (released when it stops, if still held)
        self._turn: asyncio.Future | None = None  # the latest disk-cache lookup's: its misses are fetched first
        self._budget_warned = False
        self._active = 0  # this pass's tiles being fetched or decoded, and revival jobs (loop thread)
        self._gate: set[asyncio.Task] | None = set() if self._first_block_waits() else None
        self._waiting = False
        self._stall_from: float | None = None  # when the driver began waiting for room with nothing active
        # an unpin wakes the loop once per burst (a block's release unpins many reads), not per read
        self._wake_lock = threading.Lock()
        self._wake_armed = False
        owner.wake = self._wake_soon
        owner.refetch = lambda entry: self.loop.call_soon_threadsafe(self._readmit, entry)

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

    def stop(self, timeout: float = STOP_WAIT_S, wait: bool = True) -> None:
        """Cancel this driver's own tasks (never anyone else's); with ``wait``, until they and their jobs end.

        A loop that no longer runs (interpreter exit) has nothing of this
        pass left to run: nothing is scheduled and nothing waited for.
        """
        self._stopping = True
        if self._main is None or self.loop.is_closed() or not self.loop.is_running():
            return
        try:
            fut = asyncio.run_coroutine_threadsafe(self._cancel_own(), self.loop)
        except RuntimeError:  # the loop closed meanwhile
            return
        if not wait or asyncio._get_running_loop() is self.loop:  # on the loop itself: it cannot wait on it
            return
        try:
            fut.result(min(timeout, EXIT_WAIT_S) if exiting() else timeout)
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
        self._release_claims()

    def _record_bad(self, entry: Entry | None, record: BadChunkRecord) -> None:
        """List a tile replaced under ``on_bad_chunk="nan"`` once per epoch, and on its entry for later hits."""
        with self.pool.lock:  # from the loop (hits) and the decode threads (replaced tiles)
            if entry is not None:
                entry.bad_records.append(record)
            if record not in self.bad_chunks:
                self.bad_chunks.append(record)

    def _orphan(self, job: concurrent.futures.Future, cleanup: Callable[[], None]) -> None:
        """A cancelled task's decode-pool job still runs: ``stop`` waits for it, then runs ``cleanup``."""
        self._orphans.append((job, cleanup))

    def _readmit(self, entry: Entry) -> None:
        """Loop: fetch again an entry adopted from a pass that closed while fetching it."""
        if self._stopping or entry.fetcher != self.owner.id or entry.state != PENDING:
            return  # closing too: the pool hands it on or abandons it when this owner closes
        reader = self.readers[entry.key[0]]
        if self.cache is not None:
            self._spawn(self._revive_or_fetch([(entry, reader, entry.key[1])]))
        else:
            self._fetch(entry, reader, entry.key[1])

    # -- the driver ----------------------------------------------------------------
    async def _run(self) -> None:
        try:
            if self.after is not None and not self.after.done():  # so the store sees them end before this pass
                await asyncio.wait({asyncio.wrap_future(self.after)})
            if self._gate is None:  # else once the first block has landed
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
        order = admitted_reads(plan, self.first_block, self._gate is not None)
        for at, i in enumerate(order):  # reads only batches before a resume point need are left out
            key = plan.reads[i]
            nbytes = int(plan.read_nbytes[i])
            if self._gate is not None and block >= 0 and plan.read_first[i] != block:
                self._fetch_all(fetches)  # a remote pass admits its second block once its first has landed
                await self._first_block_lands()
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
                    await self._wait()
            # tiles decoded straight into the entry (no transform, no disk cache) are the engine's to reuse
            own = not reader.pipeline and self.cache is None
            while True:  # a hit or join pins what is there; a miss is admitted; else wait for room
                entry, admitted = pool.claim(key, nbytes, reader.origins, owner, own, self.entries, i)
                if entry is not None:
                    self._pinned_last[int(plan.read_last[i])] += 1
                    break
                self._flush(revivals)
                self._fetch_all(fetches, hold_shards=self._releases_before(block))
                await self._wait()
            if not admitted and entry.bad:  # a hit on a replaced tile is listed for this epoch too
                for record in list(entry.bad_records):
                    self._record_bad(None, record)
            if admitted:
                if self.seen is not None:
                    owner.counters.trace.re_reads += self.seen.mark(*key)
                if self.cache is not None:
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
            self._fetch(entry, reader, chunk_index, start=False)
        fetches.clear()
        if start:
            self._start_remote(hold_shards)

    def _releases_before(self, block: int) -> bool:
        """Whether the producer pins reads it lets go of before ``block`` (each wakes the driver): while it does, a
        driver waiting for room mid-block holds the block's shard reads back (which share a GET: the plan's alone)."""
        staying = sum(n for last, n in self._pinned_last.items() if last >= block)
        return self.owner.pinned_reads > staying

    def _start_remote(self, hold_shards: bool = False) -> None:
        """Start the remote reads wanted since the last call; a shard's, with ``hold_shards``, once its block's
        admission is over (so the inner chunks one block wants of a shard share GETs however admission ran)."""
        fresh, self._remote_fresh = self._remote_fresh, []
        if fresh or (self._shard_wants and not hold_shards):
            self._fetch_remote(fresh, hold_shards)

    def _flush(self, revivals: list[tuple[Entry, ArrayReader, int]]) -> None:
        if revivals:
            self._spawn(self._revive_or_fetch(list(revivals)), work=True)
            revivals.clear()

    def _spawn(self, coro, work: bool = False) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if work:  # a fetch or revival: this pass has work in flight until the task ends
            if self._gate is not None:
                self._gate.add(task)
            self._work_started()
            task.add_done_callback(self._work_ended)

    def _fetch(self, entry: Entry, reader: ArrayReader, chunk_index: int, start: bool = True) -> None:
        """Read the tiles ``entry`` needs: each joins a read of the same stored tile still waiting, else starts one."""
        fresh = self._wants.add(entry, reader, chunk_index, self.semaphore.window.ticket())
        if self._get_sync is not None:
            self._queued.extend(fresh)
            if fresh and (self._pump is None or self._pump.done()):
                self._pump = self.loop.create_task(self._pump_tiles())
                self._tasks.add(self._pump)
                self._pump.add_done_callback(self._tasks.discard)
            return
        self._remote_fresh.extend(fresh)
        if start:
            self._start_remote()

    async def _pump_tiles(self) -> None:
        """A store with a synchronous get: queued tiles go to the decode pool in groups of ``self._group``.

        Each tile holds one ``max_inflight`` permit from here until its job
        ended. Tiles queue up while the permits are all out; with permits
        free, the pump waits up to ``self._group - 1`` loop turns for the
        driver to admit more, so a group costs one submit and one wake-up
        even when the decode pool keeps up.
        """
        queued, semaphore, size = self._queued, self.semaphore, self._group
        while queued:
            await semaphore.acquire()
            held = 1
            try:
                for _ in range(size - 1):
                    if len(queued) >= size:
                        break
                    await asyncio.sleep(0)  # one more admission turn of the driver: a fuller group
                group = [queued.popleft()]
                while queued and len(group) < size and not semaphore.locked():
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
            self._work_started()  # this pass has work active until the group lands
            fut.add_done_callback(self._work_ended)

    def _track(self, job: concurrent.futures.Future) -> None:
        """Remember a decode-pool job until it ends: ``stop`` waits for every one still running."""
        with self._jobs_lock:
            self._jobs.add(job)
        job.add_done_callback(self._job_ended)

    def _job_ended(self, job: concurrent.futures.Future) -> None:
        with self._jobs_lock:  # called on the decode thread that ran it
            self._jobs.discard(job)

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

    def _work_ended(self, _done: asyncio.Future) -> None:
        self._active -= 1
        if self._active == 0 and self._waiting:
            self._stall_from = time.perf_counter()

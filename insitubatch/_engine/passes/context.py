"""``PassContext``: what a dataset builds once and every pass of it reads.

The store and its readers, the chunk pool (and its disk cache), the batch
buffers, the decode executor, the read permits (a pinned ``max_inflight``
window of its own, or a share of the store's self-tuning one), the epoch's
counters and bad chunks, the open passes. Passes (``producer``) and views
read only this object, so neither needs the dataset that made it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import numpy as np

from ..._weak import WeakMembers
from ...cache import DiskCache
from ...errors import DatasetClosedError
from ...io.geometry import ArrayGeometry
from ...io.sync_get import sync_get
from ...plan.epoch import EpochPlan
from ...plan.sizing import auto_inflight_cap, auto_read_ahead
from ...transforms import ChunkTransform, pipeline_for
from ..lifecycle import live_loop
from ..pool.buffers import BufferPool
from ..pool.chunk_pool import ChunkPool
from ..pool.seen_reads import SeenReads
from ..reads.concurrency import AUTO_START, LimitHistory
from ..reads.reader import ArrayReader, BadChunkRecord
from ..reads.shard_index import ShardIndexes
from ..reads.shard_runs import pass_reads
from ..reads.store_link import StoreClient, client_for
from ..reads.window import ReadWindow, WindowUser
from ..stats import PassCounters
from .batch import Batch

__all__ = ["ON_BAD_CHUNK", "BatchTransform", "OnBadChunk", "PassContext", "concurrency_report", "read_sources"]

logger = logging.getLogger("insitubatch")

OnBadChunk = Literal["raise", "nan"]
ON_BAD_CHUNK: tuple[OnBadChunk, ...] = get_args(OnBadChunk)
BatchTransform = Callable[[Batch], Batch]


class _OpenPass(Protocol):
    """A pass as the context sees it: something to close when the dataset closes (``release``: from a finalizer)."""

    def close(self) -> None: ...

    def release(self) -> None: ...


class _OpenReads(_OpenPass, Protocol):
    """The reads a dataset starts as it opens (``warm.Warmup``): the passes' reads wait for them to end."""

    future: concurrent.futures.Future
    split: str  # whose shard indexes it read
    held: list[tuple[str, int]]  # that split's index slots once it started: (shard key, entry bytes), LRU first
    gets: int  # the GETs it sends, and their bytes
    nbytes: int


@dataclass(eq=False)
class PassContext:
    """The shared state of one dataset's passes; the dataset owns it and closes it."""

    store: Any
    readers: dict[str, ArrayReader]  # by array path
    outputs: dict[str, ArrayGeometry]  # by label, after chunk transforms: what entries hold and batches carry
    offsets: dict[str, int]  # by label: the shift a batch reports (``Batch.offsets``)
    pool: ChunkPool
    buffers: BufferPool
    executor: concurrent.futures.ThreadPoolExecutor
    max_inflight: int | Literal["auto"]
    decode_threads: int
    prefetch_depth: int
    on_bad_chunk: OnBadChunk
    cache: DiskCache | None
    persist: bool
    batch_transforms: Sequence[BatchTransform]
    sample_coords: Callable[[], Mapping[str, np.ndarray]]  # read once, on the first inference pass
    statics: Mapping[str, np.ndarray] = field(default_factory=dict)  # read once at open, the same in every batch
    # by windowed label: its steps (``Batch.windows``)
    windows: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # per split, the shard indexes its passes read, held within a budget (``reads.shard_index``)
    shard_indexes: ShardIndexes = field(default_factory=ShardIndexes)
    hedge: bool = True  # duplicate a remote GET that is far slower than its peers
    epoch: int = 0
    bad_chunks: list[BadChunkRecord] = field(default_factory=list)  # this epoch's; a new epoch starts a new list
    epoch_counters: list[PassCounters] = field(default_factory=list)  # this epoch's passes'
    seen_reads: SeenReads = field(default_factory=SeenReads)  # reads any pass fetched: fetching one again is a re-read
    passes: WeakMembers[_OpenPass] = field(default_factory=WeakMembers)  # open ones, closed on close()
    warmup: _OpenReads | None = None  # reads started as the dataset opened (``warm``), stopped on close()
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    _permits: WindowUser | None = None
    _client: StoreClient | None = None
    _warned_epochs: set[int] = field(default_factory=set)

    @property
    def auto(self) -> bool:
        return self.max_inflight == "auto"

    def client(self) -> StoreClient | None:
        """The engine's client for a remote store (``None`` for one read synchronously: local, memory)."""
        if self._client is None and sync_get(self.store) is None:
            self._client = client_for(self.store)
        return self._client

    def inflight_cap(self) -> int:
        """The most reads in flight at once: the pinned value, or under "auto" the memory plan's cap."""
        if not self.auto:
            return int(self.max_inflight)
        return auto_inflight_cap(max(r.geometry.tile_nbytes for r in self.readers.values()))

    def read_ahead(self, plan: EpochPlan) -> tuple[int, int]:
        """``(bytes, reads)`` a pass of ``plan`` may read beyond its working set: under "auto" on a remote store."""
        if not self.auto or self.client() is None:
            return 0, 0
        tiles = {r.geometry.source: r.geometry.tiles_read for r in self.readers.values()}
        return auto_read_ahead(plan, tiles, self.inflight_cap())

    def predicted_reads(self, split: str, plan: EpochPlan) -> dict[str, Any]:
        """What the first pass of ``split`` (``plan`` its plan) sends after the dataset opened: what ``describe()``
        states (``reads.shard_runs.pass_reads``). Its shard indexes are those the split does not hold once the
        open's reads are in; the store's answers are exactly these, before any other pass."""
        remote = self.client() is not None
        warm = self.warmup
        return pass_reads(
            plan,
            self.readers,
            permit_cap=self.permits().cap,
            remote=remote,
            first_batch_first=remote and self.cache is None,  # (``PassDriver``'s admission order)
            held=warm.held if warm is not None and warm.split == split else (),
            budget_bytes=self.shard_indexes.budget_bytes,
            indexes=self.shard_indexes.known(),
        )

    def open_reads(self) -> dict[str, Any]:
        """The GETs and bytes the dataset sends as it opens (its warm-up's shard indexes), apart from every pass's."""
        warm = self.warmup
        if warm is None:
            return {"gets": 0, "bytes": 0, "split": None}
        return {"gets": warm.gets, "bytes": warm.nbytes, "split": warm.split}

    def reads_report(self, plans: Mapping[str, EpochPlan]) -> dict[str, Any]:
        """``describe_loader``'s read terms for ``plans`` (by split): each one's reads, the open's, the index budget."""
        return {
            "reads": {name: self.predicted_reads(name, plan) for name, plan in plans.items()},
            "open_reads": self.open_reads(),
            "index_budget_bytes": self.shard_indexes.budget_bytes,
        }

    def permits(self) -> WindowUser:
        """The read permits every pass of this dataset takes, one per tile in flight (made on first use).

        A pinned ``max_inflight`` is a window of this dataset's own. Under
        "auto" a remote store's passes share its link's window, whose
        controller sets the limit, this dataset holding at most its cap; a
        local store reads with ``AUTO_START`` permits (nothing to tune there).
        """
        with self.lock:
            if self._permits is None:
                client = self.client() if self.auto else None
                if client is not None:
                    self._permits = client.link.window.user(self.inflight_cap())
                else:
                    limit = AUTO_START if self.auto else int(self.max_inflight)
                    self._permits = ReadWindow(limit).user(limit)
            return self._permits

    def concurrency(self, since: int = 0) -> tuple[int, LimitHistory | None]:
        """The reads-in-flight limit now, and under "auto" its history since controller interval ``since``."""
        permits = self.permits()
        controller = permits.window.controller
        if controller is None:
            return permits.window.limit, None
        return min(controller.limit, permits.cap), controller.history(since)

    def check_open(self) -> None:
        if self.closed:
            raise DatasetClosedError("this InSituDataset is closed; create a new one to iterate again")

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next passes draw; a new epoch starts fresh counters and bad-chunk list."""
        with self.lock:
            if epoch != self.epoch:
                self.epoch_counters = []
                self.bad_chunks = []  # an earlier epoch's passes keep appending to their own list
            self.epoch = epoch

    def track(self, counters: PassCounters) -> None:
        """Count a starting pass in the current epoch's totals."""
        with self.lock:
            self.epoch_counters.append(counters)

    def warn_if_cache_useless(self, counters: PassCounters, epoch: int) -> None:
        """One WARNING per epoch when a persisted cache was consulted, rejected entries, and served nothing."""
        cache = self.cache
        if cache is None or not self.persist or counters.hits or epoch in self._warned_epochs:
            return
        rejected = cache.rejected
        if sum(rejected.values()):
            self._warned_epochs.add(epoch)
            logger.warning(
                "insitubatch: the persisted cache in %s served no chunk this epoch although it holds entries; "
                "rejected: %s (a changed array shape/dtype or output_inner makes entries misses)",
                cache.cache_dir,
                dict(rejected),
            )

    def close(self) -> None:
        """Stop every open pass and drop the pool and buffers (the cache and store are the dataset's). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.warmup is not None:
            self.warmup.close()
        for state in list(self.passes):
            state.close()
        self._leave_link()
        self.pool.clear()
        self.buffers.clear()

    def release(self) -> None:
        """What ``close()`` does, from a finalizer: signal every pass and wait for nothing (``lifecycle``)."""
        if self.closed:
            return
        self.closed = True
        if self.warmup is not None:
            self.warmup.release()
        for state in list(self.passes):
            state.release()
        self._leave_link()

    def _leave_link(self) -> None:
        """This dataset's cap stops counting toward the store's shared one (on the loop, if it still runs)."""
        loop = live_loop()
        if self._permits is None or loop is None:
            return  # no pass took permits, or the loop is gone and with it everyone who counted them
        try:
            loop.call_soon_threadsafe(self._permits.leave)
        except RuntimeError:  # the loop closed meanwhile
            pass


def read_sources(
    variables: Mapping[str, ArrayGeometry], chunk_transforms: Sequence[ChunkTransform]
) -> tuple[dict[str, ArrayReader], dict[str, ArrayGeometry]]:
    """One reader per read source (an array path and its selection), and each label's output geometry.

    Labels sharing a source share its reads and decodes; a label's output is
    its source's geometry after its chunk transforms, with the label's own
    offset and window: what entries hold and batches carry.
    """
    readers: dict[str, ArrayReader] = {}
    for g in variables.values():
        if g.source not in readers:
            readers[g.source] = ArrayReader.build(g.source_view(), pipeline_for(chunk_transforms, g.path))
    outputs = {
        label: dataclasses.replace(
            readers[g.source].output, offset=g.offset, window_steps=g.window_steps, time_rows=g.time_rows
        )
        for label, g in variables.items()
    }
    return readers, outputs


def concurrency_report(ctx: PassContext) -> dict[str, Any]:
    """The reads-in-flight limit as ``describe()`` states it: the knob, the cap, the limit now and its history."""
    limit, history = ctx.concurrency()
    return {
        "max_inflight": ctx.max_inflight,
        "cap": ctx.inflight_cap(),
        "limit": limit,
        "history": None if history is None else {"min": history.min, "median": history.median, "max": history.max},
        "throttled": 0 if history is None else history.throttled,
        "throttle_cuts": 0 if history is None else history.cuts,
        "hedge": ctx.hedge,
    }

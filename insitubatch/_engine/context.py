"""``PassContext``: what a dataset builds once and every pass of it reads.

The store and its readers, the chunk pool (and its disk cache), the batch
buffers, the decode executor, the ``max_inflight`` semaphore, the epoch's
counters and bad chunks, the open passes. Passes (``prefetch``) and views
read only this object, so neither needs the dataset that made it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import numpy as np

from ..cache import DiskCache
from ..errors import DatasetClosedError
from ..io.geometry import ArrayGeometry
from .batch import Batch
from .buffers import BufferPool
from .pool import ChunkPool
from .reader import ArrayReader, BadChunkRecord
from .shard_index import ShardIndexes
from .stats import PassCounters

__all__ = ["ON_BAD_CHUNK", "BatchTransform", "OnBadChunk", "PassContext"]

logger = logging.getLogger("insitubatch")

OnBadChunk = Literal["raise", "nan"]
ON_BAD_CHUNK: tuple[OnBadChunk, ...] = get_args(OnBadChunk)
BatchTransform = Callable[[Batch], Batch]


class _OpenPass(Protocol):
    """A pass as the context sees it: something to close when the dataset closes."""

    def close(self) -> None: ...


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
    max_inflight: int
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
    shard_indexes: ShardIndexes = field(default_factory=ShardIndexes)  # read once per shard, kept for every pass
    epoch: int = 0
    bad_chunks: list[BadChunkRecord] = field(default_factory=list)  # this epoch's; a new epoch starts a new list
    epoch_counters: list[PassCounters] = field(default_factory=list)  # this epoch's passes'
    fetched_keys: set = field(default_factory=set)  # every read key a pass admitted: admitting one again is a re-read
    passes: weakref.WeakSet[_OpenPass] = field(default_factory=weakref.WeakSet)  # open ones, closed on close()
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    _semaphore: asyncio.Semaphore | None = None
    _warned_epochs: set[int] = field(default_factory=set)

    def semaphore(self) -> asyncio.Semaphore:
        """The ``max_inflight`` semaphore every pass's fetches share (binds to zarr's loop on first use)."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_inflight)
        return self._semaphore

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
        for state in list(self.passes):
            state.close()
        self.pool.clear()
        self.buffers.clear()

"""Warming a remote dataset as it opens: its first pass planned, and the shard indexes its first block needs.

A remote dataset reads the sample axis's coordinate as it opens (two round
trips). Planning the first pass meanwhile takes the planning off the first
batch. On a sharded array a pass reads an inner chunk only once its shard's
index is in, so the first batch would wait two round trips where an
unsharded array's waits one; reading those indexes meanwhile takes the
extra one off. Which pass comes first is a guess: train's, at the current
epoch (the manifest's first split when it has no train). Nothing is lost on
a wrong guess: plans are kept, indexes are kept for the dataset's life, and
any pass that reaches those shards uses them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

from ..io.decode import shard_stage
from ..plan.planner import EpochPlanner
from .context import PassContext
from .fetch import Fetcher
from .loop import zarr_loop
from .shard_index import plan_shards, prefetch
from .stats import PassCounters

__all__ = ["Warmup", "warm_first_pass"]

# how long closing a dataset waits for its warm-up's reads to be cancelled
CLOSE_WAIT_S = 5.0


class Warmup:
    """The warm-up's reads on zarr's loop, cancelled when the dataset closes."""

    def __init__(self, future: concurrent.futures.Future, shards: int, counters: PassCounters) -> None:
        self.future = future
        self.shards = shards  # indexes it set out to read
        self.counters = counters  # its GETs and bytes (counted in the epoch's totals too)

    def close(self) -> None:
        """Cancel what is still being read, and wait until it has stopped. Idempotent."""
        future = self.future
        if future.done():
            return
        loop = zarr_loop()
        if asyncio._get_running_loop() is loop:  # closed from the loop itself: cannot wait on it
            future.cancel()
            return

        async def cancel() -> None:
            future.cancel()
            await asyncio.gather(asyncio.wrap_future(future), return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel(), loop).result(CLOSE_WAIT_S)
        except (concurrent.futures.TimeoutError, RuntimeError):  # pragma: no cover - a wedged store, a closed loop
            pass


def warm_first_pass(ctx: PassContext, planner: EpochPlanner) -> Warmup | None:
    """On a remote store, plan the likely first pass; start reading its first block's shard indexes (the result).

    A local store reads its coordinate in moments, and an index as fast as
    a tile: nothing to overlap. With a disk cache, revived chunks need no
    index. The index reads are background ones: each takes a read permit
    only when no pass's read waits for one.
    """
    names = planner.manifest.names
    if ctx.closed or not names or ctx.client() is None:
        return None
    plan = planner.plan("train" if "train" in names else names[0], ctx.epoch)  # kept: the pass reuses it
    sharded = {source: r for source, r in ctx.readers.items() if r.geometry.sharded_reads}
    if not sharded or ctx.cache is not None or plan.n_batches == 0:
        return None
    stages = {r.geometry.path: shard_stage(r.geometry) for r in sharded.values()}
    wanted = plan_shards(plan, sharded, stages, 0, 0)
    if not wanted:
        return None
    client, permits, counters = ctx.client(), ctx.permits(), PassCounters()
    assert client is not None  # a remote store, checked above
    ctx.track(counters)
    fetcher = Fetcher(client, permits, counters, hedge=ctx.hedge)
    reads = prefetch(ctx.shard_indexes, wanted, fetcher.get, permits, len(wanted))
    return Warmup(asyncio.run_coroutine_threadsafe(reads, zarr_loop()), len(wanted), counters)

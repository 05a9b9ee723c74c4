"""Warming a remote dataset as it opens: the shard indexes its first pass's first block needs.

On a sharded array a pass reads an inner chunk only once its shard's index is
in, so the first batch waits two round trips where an unsharded array waits
one. A dataset reads the sample axis's coordinate (two round trips) while it
opens; reading those indexes alongside takes the extra round trip off the
first batch. Which pass comes first is a guess: train's, at the current
epoch (the manifest's first split when it has no train). Nothing is lost on
a wrong guess: indexes are kept for the dataset's life, and any pass that
reaches those shards uses them.
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

__all__ = ["Warmup", "warm_shard_indexes"]

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


def warm_shard_indexes(ctx: PassContext, planner: EpochPlanner) -> Warmup | None:
    """Start reading the indexes of the shards the likely first pass's first block reads; ``None``: nothing to read.

    Only a remote store's sharded arrays read indexes ahead: a local store
    reads one as fast as a tile, and with a disk cache revived chunks need
    none. The reads are background ones: each takes a read permit only when
    no pass's read waits for one. The pass is planned (and its plan kept)
    only when there is something to warm.
    """
    sharded = {source: r for source, r in ctx.readers.items() if r.geometry.sharded_reads}
    if not sharded or ctx.cache is not None or ctx.closed:
        return None
    client = ctx.client()
    if client is None:
        return None
    names = planner.manifest.names
    if not names:
        return None
    plan = planner.plan("train" if "train" in names else names[0], ctx.epoch)
    if plan.n_batches == 0:
        return None
    stages = {r.geometry.path: shard_stage(r.geometry) for r in sharded.values()}
    wanted = plan_shards(plan, sharded, stages, 0, 0)
    if not wanted:
        return None
    permits = ctx.permits()
    counters = PassCounters()
    ctx.track(counters)
    fetcher = Fetcher(client, permits, counters, hedge=ctx.hedge)
    reads = prefetch(ctx.shard_indexes, wanted, fetcher.get, permits, len(wanted))
    return Warmup(asyncio.run_coroutine_threadsafe(reads, zarr_loop()), len(wanted), counters)

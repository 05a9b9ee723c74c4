"""Warming a remote dataset as it opens: its first pass planned, and the shard indexes its first block needs.

A remote dataset reads the sample axis's coordinate as it opens (one round
trip, or two when its metadata was not read with the variables'). Planning
the first pass meanwhile takes the planning off the first batch (a pass
too large to plan in moments is left to plan when it starts). On a sharded
array a pass reads an inner chunk only once its shard's index is in, so
the first batch would wait two round trips where an unsharded array's
waits one; reading those indexes meanwhile takes the extra one off. Which
pass comes first is a guess: train's, at the current epoch (the manifest's
first split when it has no train). Little is lost on a wrong guess: plans
are kept, and the indexes are held by that split's index cache for its
passes. These are the dataset's open reads: counted apart from every pass's
(``describe()["open"]``), and every pass's own reads wait for them to end,
so a store counting requests sees them before any pass's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...io.decode import shard_stage
from ...plan.epoch import EpochPlan
from ...plan.planner import EpochPlanner
from ..lifecycle import exiting, live_loop, running_loop
from ..loop import zarr_loop
from ..reads.fetch import Fetcher
from ..reads.reader import ArrayReader
from ..reads.shard_index import IndexSlot, plan_shards, prefetch
from ..stats import PassCounters
from .context import PassContext

__all__ = ["Warmup", "open_reads", "warm_first_pass"]

# The most reads (sample-axis chunks x sources) a pass may have for the dataset to plan it as it opens:
# about 0.13 s of planning on the bench machine. A larger one takes longer to plan (1.3 s at a million
# reads), which would only slow the opening of a dataset that does not start with that pass, for a round
# trip's gain.
WARM_PLAN_READS = 150_000
# how long closing a dataset waits for its warm-up's reads to be cancelled
CLOSE_WAIT_S = 5.0
# how long opening a dataset waits for the warm-up's GETs to go out (zarr's loop may be busy elsewhere)
SEND_WAIT_S = 0.1
# loop steps until they have: prefetch's first schedules its workers; theirs take permits and start their
# reads; a suffix range (an index at the end) is a task of its own, whose first step sends the GET
SEND_STEPS = 3
# how long opening a dataset waits, once its coordinate and statics are in, for the warm-up's reads to land
# (they went out first and take a round trip: usually none is left). Landed, they are the open's reads on
# the store's side too, before any pass's; a warm-up slower than this lands while the first pass waits for it.
OPEN_WAIT_S = 2.0


class Warmup:
    """The warm-up's reads on zarr's loop, cancelled when the dataset closes."""

    def __init__(
        self,
        future: concurrent.futures.Future,
        split: str,
        slots: list[IndexSlot],
        held: list[tuple[str, int]],
        counters: PassCounters,
    ) -> None:
        self.future = future
        self.split = split  # whose first block's indexes it reads
        self.shards = len(slots)  # indexes it set out to read
        self.gets = len(slots)  # the GETs it sends, and their bytes (each index's range)
        self.nbytes = sum(slot.stage.index_nbytes for slot in slots)
        self.held = held  # the split's index slots once they were taken: where that split's first pass starts
        self.counters = counters  # its GETs and bytes as they land (counted in the epoch's totals too)

    def close(self) -> None:
        """Cancel what is still being read, and wait until it has stopped. Idempotent."""
        future = self.future
        loop = live_loop()
        if future.done() or loop is None:  # no loop runs any more: nor does anything it was reading
            return
        if running_loop() is loop:  # closed from the loop itself: cannot wait on it
            future.cancel()
            return

        async def cancel() -> None:
            future.cancel()
            await asyncio.gather(asyncio.wrap_future(future), return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel(), loop).result(CLOSE_WAIT_S)
        except (concurrent.futures.TimeoutError, RuntimeError):  # pragma: no cover - a wedged store, a closed loop
            pass

    def release(self) -> None:
        """Cancel what is still being read, waiting for nothing (from a finalizer)."""
        if not exiting():
            self.future.cancel()  # thread-safe: the loop cancels the reading task


def open_reads(
    ctx: PassContext,
    planner: EpochPlanner,
    read_coords: Callable[[], dict[str, Any]],
    read_statics: Callable[[], Mapping[str, Any]],
) -> dict[str, Any]:
    """What a dataset reads once as it opens: its coordinate (returned) on a helper thread, beside the warm-up.

    The warm-up (``ctx.warmup``) and the static fields (``ctx.statics``) are
    read on the caller's thread meanwhile, and the warm-up's reads awaited
    (``OPEN_WAIT_S`` at most) at the end; a pass's GETs are only its chunks'.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="insitu-open") as opener:
        coords = opener.submit(read_coords)
        ctx.warmup = warmup = warm_first_pass(ctx, planner)
        ctx.statics = read_statics()
    values = coords.result()
    if warmup is not None:
        concurrent.futures.wait([warmup.future], OPEN_WAIT_S)
    return values


def warm_first_pass(ctx: PassContext, planner: EpochPlanner) -> Warmup | None:
    """On a remote store, plan the likely first pass; start reading its first block's shard indexes (the result).

    A local store reads its coordinate in moments, and an index as fast as
    a tile: nothing to overlap. With a disk cache, revived chunks need no
    index. The first block alone is planned first, so its index reads go
    out before the rest of the pass is planned; they are background reads:
    each takes a read permit only when no pass's read waits for one.
    """
    names = planner.manifest.names
    if ctx.closed or not names or ctx.client() is None:
        return None
    split = "train" if "train" in names else names[0]
    if len(planner.manifest.chunks(split)) * len(ctx.readers) > WARM_PLAN_READS:
        return None  # planning it is no longer small next to a round trip: the pass plans when it starts
    sharded = {source: r for source, r in ctx.readers.items() if r.geometry.sharded_reads}
    warmup = (
        _read_indexes(ctx, split, planner.first_block(split, ctx.epoch), sharded)
        if sharded and ctx.cache is None
        else None
    )
    planner.plan(split, ctx.epoch)  # kept: the pass reuses it
    return warmup


def _read_indexes(ctx: PassContext, split: str, head: EpochPlan, sharded: Mapping[str, ArrayReader]) -> Warmup | None:
    """Start reading the indexes block 0 of ``head`` reads (on zarr's loop, under the store's read permits)."""
    stages = {r.geometry.path: shard_stage(r.geometry) for r in sharded.values()}
    wanted = plan_shards(head, sharded, stages, 0, 0)
    client = ctx.client()
    if not wanted or client is None:
        return None
    indexes = ctx.shard_indexes.of(split)
    slots = [indexes.touch(key, stage) for key, stage in wanted]  # (in the split's cache, as its first pass's)
    held = indexes.held()
    permits, counters = ctx.permits(), PassCounters()
    ctx.track(counters)
    fetcher = Fetcher(client, permits, counters, hedge=ctx.hedge)
    sent = threading.Event()
    # a few bytes a round trip (the auto window ignores it), and the shard's ETag its inner chunks' reads name
    get_index = functools.partial(fetcher.get_versioned, learn=False)

    async def read_all() -> None:
        reads = asyncio.ensure_future(prefetch(indexes, slots, get_index, permits, len(slots)))
        for _ in range(SEND_STEPS):
            await asyncio.sleep(0)
        sent.set()
        await reads

    future = asyncio.run_coroutine_threadsafe(read_all(), zarr_loop())
    # the caller goes on to plan the whole pass, holding the GIL: the GETs go out first
    sent.wait(SEND_WAIT_S)
    return Warmup(future, split, slots, held, counters)

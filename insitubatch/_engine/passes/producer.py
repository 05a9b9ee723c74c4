"""One pass of a view: the producer thread that gathers batches ahead of the consumer.

A pass owns a pool owner, a ``PassDriver`` on zarr's loop and a producer
thread. The producer waits each block its next batch draws from, gathers
the batch in C, runs batch transforms, releases the blocks that drained and
hands the batch over through a bounded ``Handoff`` of ``prefetch_depth``. Leaving
the loop early (``break``, an exception, garbage collection) stops the
producer and cancels this pass's tasks; nothing outlives the pass.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping

import numpy as np

from ...errors import DatasetClosedError
from ...plan.epoch import EpochPlan, ReadKey
from ..lifecycle import EXIT_WAIT_S, exiting, live_loop, may_wait
from ..pool.chunk_pool import FAILED, PENDING, Entry, Owner
from ..reads.fetch import Fetcher
from ..stats import PassCounters, PassStats, log_pass, stats_from_trace
from ..tiles.local_groups import tile_group
from .batch import Batch
from .context import PassContext
from .driver import PassDriver
from .gather import batch_row_bytes, gather_label, label_indices, streams
from .handoff import Handoff

__all__ = ["PassIterator", "PassState"]

# how often a blocked producer or consumer re-checks for a stop or a dead peer
POLL_S = 0.05


_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Stopped(Exception):
    """The pass was closed while the producer waited."""


def _held_entry(held: Mapping[ReadKey, Entry | None], source: str, chunk: int) -> Entry:
    """The entry a batch's block holds for chunk ``chunk`` of read source ``source``."""
    entry = held[(source, chunk)]
    assert entry is not None  # a block's reads stay referenced until the block is released
    return entry


class PassState:
    """Everything one pass owns: pool owner, driver, producer thread, queue."""

    def __init__(self, ctx: PassContext, split: str, plan: EpochPlan, epoch: int, start_batch: int) -> None:
        if not 0 <= start_batch <= plan.n_batches:
            raise ValueError(f"{start_batch=} must be in [0, {plan.n_batches}] for split {split!r}")
        self.ctx = ctx
        self.split = split
        self.plan = plan
        self.epoch = epoch
        self.start_batch = start_batch
        self.queue = Handoff(ctx.prefetch_depth)
        self.stop_event = threading.Event()
        self.owner: Owner | None = None
        self.driver: PassDriver | None = None
        self.thread: threading.Thread | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self.consumed = start_batch
        self.history: tuple[tuple[int, int], ...] = ()
        self.coords = ctx.sample_coords()  # the sample axis's coordinate, read once per dataset
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.evictions_at_start = 0
        self.intervals_at_start = 0  # the auto controller's intervals and cuts before this pass
        self.cuts_at_start = 0
        self.on_stats: Callable[[PassStats], None] | None = None  # told the final stats when the pass closes
        release_order = np.argsort(plan.read_last, kind="stable")
        bounds = np.searchsorted(plan.read_last[release_order], np.arange(plan.n_blocks + 1))
        self.release_after = [release_order[bounds[b] : bounds[b + 1]].tolist() for b in range(plan.n_blocks)]

    @property
    def counters(self) -> PassCounters:
        return self.owner.counters if self.owner is not None else PassCounters()

    def _first_block(self) -> int:
        """The block of the first row this pass yields (reads used only before it are skipped)."""
        plan = self.plan
        if self.start_batch >= plan.n_batches:
            return plan.n_blocks
        return plan.batch_blocks(self.start_batch)[0]

    def stats(self) -> PassStats:
        """This pass's stats so far (final once it has closed)."""
        ctx, now = self.ctx, time.perf_counter()
        started = self.started_at if self.started_at is not None else now
        ended = self.ended_at if self.ended_at is not None else now
        limit, history = ctx.concurrency(self.intervals_at_start)
        return stats_from_trace(
            self.counters.trace,
            self.counters,
            split=self.split,
            epoch=self.epoch,
            wall_s=ended - started,
            evictions=ctx.pool.totals.evictions - self.evictions_at_start,
            max_inflight=limit,
            inflight_auto=history is not None,
            inflight_min=limit if history is None else history.min,
            inflight_median=limit if history is None else history.median,
            inflight_max=limit if history is None else history.max,
            throttle_cuts=0 if history is None else history.cuts - self.cuts_at_start,
            decode_threads=ctx.decode_threads,
            cache_budget_bytes=ctx.pool.explicit_budget,
            finished=self.ended_at is not None,
        )

    def start(self) -> None:
        ctx = self.ctx
        self.started_at = time.perf_counter()
        self.evictions_at_start = ctx.pool.totals.evictions
        # under "auto" on a remote store the pass may read further ahead than its working set, so the window fills
        self.owner = ctx.pool.open_owner(
            self.plan.working_set_bytes,
            self.plan.read_ahead_bound,
            *ctx.read_ahead(self.plan),
            reads=len(self.plan.reads),
        )
        ctx.track(self.owner.counters)
        permits, client = ctx.permits(), ctx.client()
        controller = permits.window.controller
        if controller is not None:
            self.intervals_at_start, self.cuts_at_start = controller.intervals, controller.cuts
        self.driver = PassDriver(
            store=ctx.store,
            pool=ctx.pool,
            owner=self.owner,
            plan=self.plan,
            readers=ctx.readers,
            semaphore=permits,
            executor=ctx.executor,
            on_bad_chunk=ctx.on_bad_chunk,
            bad_chunks=ctx.bad_chunks,
            first_block=self._first_block(),
            cache=ctx.cache,
            group=tile_group(permits.window.limit, ctx.decode_threads),
            decode_threads=ctx.decode_threads,
            shard_indexes=ctx.shard_indexes.of(self.split),
            fetcher=None if client is None else Fetcher(client, permits, self.owner.counters, hedge=ctx.hedge),
            after=None if ctx.warmup is None else ctx.warmup.future,
        )
        self.driver.seen = ctx.seen_reads
        self.driver.start()
        self.thread = threading.Thread(target=self._produce, name="insitu-prefetch", daemon=True)
        try:
            self.thread.start()
        except RuntimeError as exc:
            # a Ctrl-C while start() waits for the thread: CPython's Condition can lose the lock it was
            # retaking and report "release unlocked lock" instead; the user pressed Ctrl-C, so say that
            if isinstance(exc.__context__, KeyboardInterrupt):
                raise exc.__context__ from None
            raise

    # -- producer thread ----------------------------------------------------------
    def _produce(self) -> None:
        try:
            self._produce_batches()
            self._put(_END)
        except _Stopped:
            pass
        except BaseException as exc:  # delivered to the consumer, raised there
            self._put(_Failure(exc))

    def _put(self, item: object) -> None:
        while not self.stop_event.is_set():
            if self.queue.put(item, timeout=POLL_S):
                return
        raise _Stopped

    def _wait_block(self, b: int) -> None:
        pool, driver = self.ctx.pool, self.driver
        assert driver is not None  # set by start(), before the producer thread runs
        wanted = self.plan.block_reads[b]
        with pool.cond:
            while True:
                if self.stop_event.is_set():
                    raise _Stopped
                if driver.error is not None:
                    raise driver.error
                pending = False
                for i in wanted:
                    entry = driver.entries[i]
                    if entry is None or entry.state == PENDING:
                        pending = True
                        break
                    if entry.state == FAILED:
                        assert entry.error is not None  # a failed entry carries its error
                        raise entry.error
                if not pending:
                    return
                pool.cond.wait(POLL_S)

    def _release_block(self, b: int) -> None:
        """Unpin the reads whose last use is block ``b`` and stop referencing them.

        From here on only the pool holds such an entry, so evicting it frees its tiles.
        """
        assert self.driver is not None and self.owner is not None  # set by start()
        entries = self.driver.entries
        for i in self.release_after[b]:
            entry = entries[i]
            if entry is not None:
                entries[i] = None
                self.ctx.pool.unpin(entry, self.owner)

    def _produce_batches(self) -> None:
        ctx, plan = self.ctx, self.plan
        owner, driver = self.owner, self.driver
        assert owner is not None and driver is not None  # set by start(), before the producer thread runs
        ready_upto = -1
        released_upto = -1
        if self.start_batch > 0:
            first_row = plan.batch_rows(self.start_batch)[0] if self.start_batch < plan.n_batches else plan.n_samples
            while released_upto + 1 < plan.n_blocks and plan.block_starts[released_upto + 2] <= first_row:
                released_upto += 1
                self._release_block(released_upto)
        buffer_rows = min(plan.batch_size, plan.n_samples)  # a batch_size past the pass's samples: one short batch
        row_bytes = batch_row_bytes(ctx.outputs.values())
        for k in range(self.start_batch, plan.n_batches):
            start, stop = plan.batch_rows(k)
            b0, b1 = plan.batch_blocks(k)
            while ready_upto < b1:
                ready_upto += 1
                if ready_upto > released_upto:
                    t0 = time.perf_counter()
                    self._wait_block(ready_upto)
                    owner.counters.trace.add("data_wait_s", time.perf_counter() - t0)
            t0 = time.perf_counter()
            anchors = plan.anchors[start:stop]
            # the entries this batch's blocks read (a key may have one read per block when blocks release)
            entries = driver.entries
            held = {plan.reads[i]: entries[i] for b in range(b0, b1 + 1) for i in plan.block_reads[b]}
            arrays = {}
            stream = streams(len(anchors) * row_bytes)
            for label, g in ctx.outputs.items():
                # g is the post-transform geometry: rows are (*row_shape,) of its dtype
                buf = ctx.buffers.take(label, (buffer_rows, *g.row_shape), g.dtype)
                out = buf[: len(anchors)]
                gather_label(out, anchors, g, functools.partial(_held_entry, held, g.source), stream=stream)
                arrays[label] = out
            coords = self._batch_coords(anchors)
            batch = Batch(
                arrays=arrays,
                sample_indices=anchors.copy(),
                offsets=dict(ctx.offsets),
                windows=ctx.windows,
                rows={lb: label_indices(g, anchors) for lb, g in ctx.outputs.items() if g.time_rows is not None},
                coords=coords,
                epoch=self.epoch,
                index=k,
                statics=ctx.statics,
            )
            if plan.padded is not None:
                batch.extras["padded"] = plan.padded[start:stop].copy()
            for t in ctx.batch_transforms:
                batch = t(batch)
                if not isinstance(batch, Batch):
                    raise TypeError(f"batch transform {t!r} returned {type(batch).__name__}, not a Batch")
            counters = owner.counters
            counters.trace.add("gather_s", time.perf_counter() - t0)
            counters.trace.sample(self.queue.qsize())
            counters.batches += 1
            counters.samples += len(anchors)
            # blocks whose last row is in this batch are drained: unpin their last-use reads
            while released_upto + 1 < plan.n_blocks and plan.block_starts[released_upto + 2] <= stop:
                released_upto += 1
                self._release_block(released_upto)
            t0 = time.perf_counter()
            self._put(batch)
            counters.trace.add("producer_wait_s", time.perf_counter() - t0)
            del batch, arrays, out, buf

    def _batch_coords(self, anchors: np.ndarray) -> dict[str, np.ndarray]:
        """The batch's anchor coordinates, and each shifted or windowed label's (``"<label>.<dim>"``)."""
        ctx = self.ctx
        coords = {}
        for name, values in self.coords.items():
            coords[name] = values[anchors]
            for label, offset in ctx.offsets.items():
                g = ctx.outputs[label]
                if offset or g.window_steps or g.time_rows is not None:
                    read = g.time_rows.read_axis if g.time_rows is not None else None  # a joined store's own times
                    coords[f"{label}.{name}"] = (values if read is None else read.values)[label_indices(g, anchors)]
        return coords

    # -- teardown ---------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether the pass has been closed (its teardown has begun)."""
        return self._closed

    def _mark_closed(self) -> bool:
        """Say whether this call is the one that ends the pass (the first)."""
        with self._close_lock:
            if self._closed:
                return False
            self._closed = True
        self.ended_at = time.perf_counter()
        self.stop_event.set()  # the producer sees it within POLL_S wherever it waits
        return True

    def close(self) -> None:
        """End the pass: stop the producer and the driver, wait for both, hand the pool its entries. Idempotent.

        At interpreter exit the waits are bounded (``lifecycle.EXIT_WAIT_S``):
        a batch transform or a store that never returns cannot hold the process.
        """
        if not self._mark_closed():
            return
        with self.ctx.pool.cond:
            self.ctx.pool.cond.notify_all()
        self.queue.drain()  # unblock a producer parked on a full queue
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(EXIT_WAIT_S if exiting() else None)
        if self.driver is not None:
            self.driver.stop()
        self._hand_back()

    def dropped(self) -> None:
        """The consumer's end was dropped unfinished: close in full where a finalizer may wait, else release."""
        if may_wait():
            self.close()
        else:
            self.release()

    def release(self) -> None:
        """End the pass from a finalizer: signal only, wait for nothing, start no thread, loop or I/O.

        If zarr's loop still runs, it stops the driver's tasks and hands the
        pool its entries once the producer has seen the stop; at interpreter
        exit nothing is scheduled (the process's end releases it all).
        """
        if not self._mark_closed():
            return
        loop = live_loop()
        if loop is None or exiting():
            return
        try:
            loop.call_soon_threadsafe(lambda: loop.create_task(self._finish_on_loop()))
        except RuntimeError:  # the loop closed meanwhile
            pass

    async def _finish_on_loop(self) -> None:
        if self.driver is not None:
            await self.driver.stop_on_loop()
        while self.thread is not None and self.thread.is_alive():  # it still reads the entries it gathers from
            await asyncio.sleep(POLL_S)
        self._hand_back()

    def _hand_back(self) -> None:
        """The pass no longer holds its entries: an evicted chunk's memory (or mapping) goes with the pool's."""
        if self.owner is not None:  # (its entries, the pass's hold on them, go too)
            self.ctx.pool.close_owner(self.owner)
        if self.started_at is not None:
            stats = self.stats()
            log_pass(stats)
            if self.on_stats is not None:
                self.on_stats(stats)


class PassIterator:
    """The consumer's end of a pass: pops finished batches; ``close()`` ends the pass early."""

    def __init__(self, state: PassState, starter: object = None) -> None:
        self._state = state
        # the view that started the pass: its dataset stays open while the pass is iterated, even when the
        # caller keeps no reference to either (``for b in InSituDataset(...).train``)
        self._starter = starter
        # dropped unfinished (``break``, garbage collection): a finalizer may only signal (lifecycle)
        self._finalizer = weakref.finalize(self, state.dropped)
        self._finalizer.atexit = False  # at exit the dataset's close ends the pass, with the loop still running

    @property
    def counters(self) -> PassCounters:
        """This pass's own counters (hits, misses, GETs, batches)."""
        return self._state.counters

    @property
    def stats(self) -> PassStats:
        """This pass's :class:`~insitubatch._engine.stats.PassStats` so far (final once it ended)."""
        return self._state.stats()

    @property
    def plan(self) -> EpochPlan:
        return self._state.plan

    def __iter__(self) -> PassIterator:
        return self

    def __next__(self) -> Batch:
        state = self._state
        t0 = time.perf_counter()
        while True:
            if state.closed:
                self._ended()
            try:
                item = state.queue.get(timeout=POLL_S)
                break
            except queue.Empty:
                if state.thread is not None and not state.thread.is_alive() and state.queue.empty():
                    self.close()
                    self._ended()
        state.counters.trace.add("consumer_wait_s", time.perf_counter() - t0)
        if item is _END:
            self.close()
            state.ctx.warn_if_cache_useless(state.counters, state.epoch)
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        state.consumed += 1
        return item

    def _ended(self) -> None:
        """The pass is closed: a closed dataset is an error, a pass the caller closed simply ends."""
        if self._state.ctx.closed:
            raise DatasetClosedError(
                "the InSituDataset was closed while this pass was open; its remaining batches are gone"
            ) from None
        raise StopIteration from None

    def close(self) -> None:
        """End the pass now and wait until it has stopped (what ``break`` does, later, through the finalizer)."""
        self._finalizer.detach()
        self._state.close()

    def __enter__(self) -> PassIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

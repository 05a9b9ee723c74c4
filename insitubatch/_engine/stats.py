"""What one pass measured, and which stage limited it.

The scheduler and the producer add to a :class:`PassTrace` (seconds per
stage, waits, depth samples taken once per batch); :class:`PassStats` is the
frozen summary a user reads as ``view.last_pass`` or ``iterator.stats``,
with :attr:`PassStats.limiting_stage` naming one of ``"store"``,
``"decode"``, ``"budget"``, ``"consumer"`` or ``"unknown"`` by the rule
documented in ``docs/tuning.md`` (and on :attr:`PassStats.limiting_stage`).
Timing costs two ``perf_counter`` calls per tile and per batch.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from ..plan.sizing import READ_AHEAD_SHARE

__all__ = ["READ_AHEAD_SHARE", "PassCounters", "PassStats", "PassTrace", "PoolTotals", "Stage", "stats_from_trace"]

logger = logging.getLogger("insitubatch")

Stage = Literal["store", "decode", "budget", "consumer", "unknown"]
# Fewer batches than this say nothing about a steady state.
MIN_BATCHES = 2
# The consumer limits when it spent at most this share of the pass waiting for
# batches: the loader had the next one ready most of the time.
CONSUMER_WAIT_SHARE = 0.5
# A loader stage is named only when its pressure (mean concurrent work, or the
# share of the pass it held the driver back) reaches this; below it no stage
# stands out and the answer is "unknown".
MIN_PRESSURE = 0.25
# Under an explicit cache_budget_bytes, a starved pass whose fetches are at
# least this share re-reads (chunks the pool held before and let go) is
# limited by the budget, whatever stage the re-reading keeps busy.
RE_READ_SHARE = 0.5
# A store-limited pass is held back by its read-ahead, not by max_inflight,
# when its read-ahead window (the reads it may hold pinned at once, in GETs)
# is under READ_AHEAD_SHARE times max_inflight: about half the window holds the
# block being gathered, so only the rest can be in flight (the same share
# ``insitubatch inspect --latency-ms`` plans with). Measured on 30 ms emulated
# GETs: at block_chunks=4 (a 32-GET window) raising max_inflight from 32 to 128
# changed nothing, while at block_chunks=64 (512) it doubled the rate.
# Without a known window, a store-limited pass whose mean GETs outstanding stay
# under this share of max_inflight never used its concurrency: the read-ahead capped it.
FULL_CONCURRENCY_SHARE = 0.5

ADVICE = {
    "store": "reads wait on the store at full concurrency; raise max_inflight, or store larger chunks or read "
    "from a closer region",
    "decode": "decode and chunk transforms keep the decode threads busy; raise decode_threads, make the transform "
    "cheaper (or release the GIL), or persist transformed chunks with cache_dir and persist=True",
    "budget": "the pool's budget: the pass re-reads chunks the pool let go, or waits for room to read ahead while "
    "nothing is in flight; raise cache_budget_bytes (to keep what later passes reuse) or block_chunks "
    "(the read-ahead window is the working set)",
    "consumer": "the loader keeps batches ready; the training step is the bottleneck (prefetch_depth can shrink)",
    "unknown": "no stage stands out (too few batches, or a balanced pass)",
}
# The store verdict when the read-ahead, not max_inflight, caps the GETs in flight.
READ_AHEAD_ADVICE = (
    "reads wait on the store, but the read-ahead caps them below max_inflight: a pass fetches one shuffle "
    "block ahead, so raise block_chunks (raising max_inflight changes nothing here)"
)
# Which bound held a store-limited pass: every permit in use, or the read-ahead window.
StoreBound = Literal["concurrency", "read-ahead"]


@dataclass(eq=False)
class PassTrace:
    """Stage times, waits and depth samples of one pass, added to from several threads."""

    fetch_s: float = 0.0  # summed over concurrent GETs: awaiting store.get
    decode_s: float = 0.0  # codec work on the decode threads
    transform_s: float = 0.0  # chunk transforms on the decode threads
    gather_s: float = 0.0  # producer: gather into the batch + batch transforms
    consumer_wait_s: float = 0.0  # consumer blocked on an empty batch queue
    producer_wait_s: float = 0.0  # producer blocked on a full batch queue
    data_wait_s: float = 0.0  # producer waiting for a block's chunks
    budget_wait_s: float = 0.0  # driver held back by the budget with nothing of the pass in flight
    re_reads: int = 0
    bad_tiles: int = 0
    read_limit: int = 0  # reads the pass may hold pinned at once (its read-ahead window); 0: unknown
    inflight_reads: int = 0  # GETs awaiting the store now (event-loop thread only)
    inflight_peak: int = 0  # the most GETs this pass ever had awaiting the store at once (event-loop thread only)
    depth_samples: int = 0
    inflight_depth_sum: int = 0
    inflight_depth_max: int = 0
    queue_depth_sum: int = 0
    queue_depth_max: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to the time field ``name`` (safe from any thread)."""
        with self.lock:
            setattr(self, name, getattr(self, name) + seconds)

    def get_started(self) -> None:
        """A GET went to the store (event-loop thread): counted in flight, and in the peak."""
        self.inflight_reads += 1
        if self.inflight_reads > self.inflight_peak:
            self.inflight_peak = self.inflight_reads

    def get_ended(self) -> None:
        self.inflight_reads -= 1

    def sample(self, queue_depth: int) -> None:
        """Record the batch queue's depth and the GETs in flight (once per batch)."""
        inflight = self.inflight_reads
        with self.lock:
            self.depth_samples += 1
            self.inflight_depth_sum += inflight
            self.inflight_depth_max = max(self.inflight_depth_max, inflight)
            self.queue_depth_sum += queue_depth
            self.queue_depth_max = max(self.queue_depth_max, queue_depth)


@dataclass
class PassCounters:
    """What one pass did: hits skip fetch, decode and transform."""

    hits: int = 0
    misses: int = 0
    joins: int = 0  # reads that attached to a fetch or revival already in flight: no fetch of their own
    revived: int = 0
    revived_from_others: int = 0  # the part of revived another writer made (another process, or an earlier run)
    not_persisted: int = 0  # fetched chunks the disk cache did not keep (a full disk, cache_disk_bytes, claimed)
    gets: int = 0
    get_bytes: int = 0
    decoded_tiles: int = 0
    samples: int = 0
    batches: int = 0
    # the remote store's answers (``_engine.fetch``): duplicates sent and won, attempts repeated after a
    # failure or stall, attempts abandoned for silence, throttling answers
    hedged: int = 0
    hedge_wins: int = 0
    retries: int = 0
    stalls: int = 0
    throttled: int = 0
    trace: PassTrace = field(default_factory=PassTrace, repr=False, compare=False)  # stage times, waits, depths


@dataclass
class PoolTotals:
    """Cumulative pool-level counts (evictions and peaks belong to the pool, not a pass)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    peak_resident_bytes: int = 0
    recycled_tiles: int = 0  # decodes that reused an evicted tile's memory


@dataclass(frozen=True)
class PassStats:
    """One pass in numbers: counts, per-stage time, waits, sampled depths, and the limiting stage.

    Stage times are summed over concurrent work, so ``fetch_s / wall_s`` is
    the mean number of GETs outstanding and ``(decode_s + transform_s) /
    wall_s`` the mean number of decode threads busy. ``finished`` is False
    for a pass still running (the numbers so far).

    ``max_inflight`` is the reads-in-flight limit at the end of the pass:
    the pinned value, or under ``max_inflight="auto"`` (``inflight_auto``)
    the one the controller chose, with ``inflight_min`` / ``_median`` /
    ``_max`` over the pass and ``throttle_cuts``, the times a throttling
    answer halved it. ``throttled`` counts this pass's throttling answers,
    ``hedged`` the duplicate GETs it sent and ``hedge_wins`` those that
    answered first, ``stalls`` its attempts abandoned for silence and
    ``retries`` its attempts repeated after a stall or a failure.
    """

    split: str
    epoch: int
    samples: int
    batches: int
    wall_s: float
    gets: int
    get_bytes: int
    hits: int
    misses: int
    revived: int
    evictions: int
    re_reads: int
    bad_tiles: int
    fetch_s: float
    decode_s: float
    transform_s: float
    gather_s: float
    consumer_wait_s: float
    producer_wait_s: float
    data_wait_s: float
    budget_wait_s: float
    inflight_depth_mean: float
    inflight_depth_max: int
    queue_depth_mean: float
    queue_depth_max: int
    max_inflight: int
    decode_threads: int
    cache_budget_bytes: int | None
    finished: bool
    read_window: int = 0  # GETs the read-ahead may hold at once (pinned reads x tiles per read); 0: unknown
    inflight_auto: bool = False
    inflight_min: int = 0
    inflight_median: int = 0
    inflight_max: int = 0
    throttle_cuts: int = 0
    throttled: int = 0
    hedged: int = 0
    hedge_wins: int = 0
    stalls: int = 0
    retries: int = 0
    inflight_peak: int = 0  # the most GETs the pass had awaiting the store at once (0: a local store)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def store_bound(self) -> StoreBound | None:
        """For a ``store``-limited pass, what capped its GETs: ``"concurrency"`` or ``"read-ahead"``; else None.

        ``"read-ahead"`` when the read-ahead window (``read_window`` GETs) is
        under ``READ_AHEAD_SHARE`` × ``max_inflight`` — the pass could never
        have every permit in flight, so ``block_chunks`` binds; where the
        window is unknown, when the mean GETs outstanding stayed under
        ``FULL_CONCURRENCY_SHARE`` × ``max_inflight``. Else ``"concurrency"``:
        reads waited on the store with ``max_inflight`` in use.
        """
        if self.limiting_stage != "store":
            return None
        if self.read_window > 0:
            capped = self.read_window < READ_AHEAD_SHARE * self.max_inflight
        else:
            capped = self.pressures()["store"] < FULL_CONCURRENCY_SHARE * self.max_inflight
        return "read-ahead" if capped else "concurrency"

    def pressures(self) -> dict[Stage, float]:
        """Each loader stage's pressure: mean GETs outstanding, mean decodes running, budget-stall share.

        A budget stall counts only as far as the producer, too, waited for
        data (``data_wait_s``): a window full of ready chunks that the
        producer is still gathering is no stall, and a pass whose every read
        was a hit had nothing for the budget to hold back.
        """
        wall = self.wall_s if self.wall_s > 0 else float("inf")
        stalled = min(self.budget_wait_s, self.data_wait_s) if self.misses else 0.0
        return {
            "store": self.fetch_s / wall,
            "decode": (self.decode_s + self.transform_s) / wall,
            "budget": stalled / wall,
        }

    @property
    def limiting_stage(self) -> Stage:
        """The one stage that limited this pass: ``store``, ``decode``, ``budget``, ``consumer`` or ``unknown``.

        The rule, in order:

        1. ``unknown`` below ``MIN_BATCHES`` batches or without elapsed time.
        2. ``consumer`` when the consumer waited for batches at most
           ``CONSUMER_WAIT_SHARE`` of the wall time: the loader kept up.
        3. Otherwise the loader starved the consumer. ``budget`` when an
           explicit ``cache_budget_bytes`` is set and at least
           ``RE_READ_SHARE`` of the pass's fetched reads are re-reads (the
           pool held those chunks before and had to let them go).
        4. Else the stage with the highest pressure is named: ``store`` (mean
           GETs outstanding), ``decode`` (mean decode jobs running, chunk
           transforms included), ``budget`` (share of the pass the driver was
           held back by the read-ahead window or the pool budget while none of
           its reads were being fetched or decoded, capped by the share the
           producer waited for data), provided it reaches
           ``MIN_PRESSURE``; else ``unknown``.
        """
        if self.batches < MIN_BATCHES or self.wall_s <= 0:
            return "unknown"
        if self.consumer_wait_s <= CONSUMER_WAIT_SHARE * self.wall_s:
            return "consumer"
        if self.cache_budget_bytes is not None and self.misses and self.re_reads >= RE_READ_SHARE * self.misses:
            return "budget"
        pressures = self.pressures()
        stage = max(pressures, key=pressures.__getitem__)
        return stage if pressures[stage] >= MIN_PRESSURE else "unknown"

    @property
    def advice(self) -> str:
        """What to do about :attr:`limiting_stage`, in one sentence (for ``store``, about :attr:`store_bound`)."""
        bound = self.store_bound
        if bound is None:
            return ADVICE[self.limiting_stage]
        outstanding = self.pressures()["store"]
        if bound == "read-ahead":
            window = f"at most ~{self.read_window} GETs" if self.read_window else "fewer GETs"
            return (
                f"{READ_AHEAD_ADVICE} (the window holds {window} for max_inflight={self.max_inflight}; "
                f"{outstanding:.1f} were outstanding on average)"
            )
        return f"{ADVICE['store']} ({outstanding:.1f} of max_inflight={self.max_inflight} GETs outstanding on average)"

    def to_dict(self) -> dict[str, Any]:
        """The fields plus ``samples_per_s``, ``limiting_stage``, ``store_bound`` and ``advice``, JSON-able."""
        return {
            **dataclasses.asdict(self),
            "samples_per_s": self.samples_per_s,
            "limiting_stage": self.limiting_stage,
            "store_bound": self.store_bound,
            "advice": self.advice,
        }

    def summary(self) -> str:
        """One line: what the pass did, where its time went, and ``limited by: <stage> — <what to do>``."""
        return (
            f"pass {self.split!r} epoch {self.epoch}: {self.batches} batches, {self.samples} samples in "
            f"{self.wall_s:.2f} s ({self.samples_per_s:.0f} samples/s); {self.gets} GETs "
            f"({self.get_bytes / 1e6:.1f} MB), {self.hits} hits, {self.misses} misses, {self.evictions} evictions, "
            f"{self.re_reads} re-reads, {self.bad_tiles} bad tiles; stage time fetch {self.fetch_s:.2f} s, "
            f"decode {self.decode_s:.2f} s, transform {self.transform_s:.2f} s, gather {self.gather_s:.2f} s; "
            f"waits consumer {self.consumer_wait_s:.2f} s, producer {self.producer_wait_s:.2f} s, "
            f"budget {self.budget_wait_s:.2f} s; mean depth in flight {self.inflight_depth_mean:.1f}, "
            f"queue {self.queue_depth_mean:.1f}; {self.reads_in_flight()}; "
            f"limited by: {self.limiting_stage} — {self.advice}"
        )

    def reads_in_flight(self) -> str:
        """The reads-in-flight limit and what the store did to the reads, as the INFO line says it."""
        if self.inflight_auto:
            limit = (
                f"max_inflight auto {self.max_inflight} (min {self.inflight_min}, median {self.inflight_median}, "
                f"max {self.inflight_max}; {self.throttle_cuts} throttle cuts)"
            )
        else:
            limit = f"max_inflight {self.max_inflight}"
        return (
            f"{limit}, {self.throttled} throttled, {self.hedged} hedged ({self.hedge_wins} won), "
            f"{self.stalls} stalls, {self.retries} retries"
        )


def stats_from_trace(trace: PassTrace, counters: Any, **fields: Any) -> PassStats:
    """A pass's ``PassStats``: its counters (``PassCounters``) and trace with ``split``, ``epoch``, ``wall_s``, ..."""
    n = max(trace.depth_samples, 1)
    tiles_per_read = counters.gets / counters.misses if counters.misses else 1.0
    fields.setdefault("read_window", round(trace.read_limit * tiles_per_read))
    return PassStats(
        samples=counters.samples,
        batches=counters.batches,
        gets=counters.gets,
        get_bytes=counters.get_bytes,
        hits=counters.hits,
        misses=counters.misses,
        revived=counters.revived,
        re_reads=trace.re_reads,
        bad_tiles=trace.bad_tiles,
        fetch_s=trace.fetch_s,
        decode_s=trace.decode_s,
        transform_s=trace.transform_s,
        gather_s=trace.gather_s,
        consumer_wait_s=trace.consumer_wait_s,
        producer_wait_s=trace.producer_wait_s,
        data_wait_s=trace.data_wait_s,
        budget_wait_s=trace.budget_wait_s,
        inflight_depth_mean=trace.inflight_depth_sum / n,
        inflight_depth_max=trace.inflight_depth_max,
        inflight_peak=trace.inflight_peak,
        queue_depth_mean=trace.queue_depth_sum / n,
        queue_depth_max=trace.queue_depth_max,
        throttled=counters.throttled,
        hedged=counters.hedged,
        hedge_wins=counters.hedge_wins,
        stalls=counters.stalls,
        retries=counters.retries,
        **fields,
    )


def log_pass(stats: PassStats) -> None:
    """The per-pass INFO line on the ``insitubatch`` logger (silent unless the application configures logging)."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("insitubatch: %s", stats.summary())

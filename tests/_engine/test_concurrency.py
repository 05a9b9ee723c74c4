"""The ``max_inflight="auto"`` controller on a fake clock: a simulated link, no sockets, no event loop.

The link answers each GET in ``max(rtt, in_flight * tile / bandwidth)``
(its bytes share the bandwidth once the pipe is full), so its throughput is
``min(in_flight / rtt, bandwidth / tile)`` GETs/s and its bandwidth-delay
product is ``bandwidth * rtt / tile`` reads: fewer leave bandwidth unused,
more only queue. Each GET also gets a deterministic jitter of up to
``JITTER`` of its time (a low-discrepancy sequence), as a real link's
answers do, so the window's GETs do not all finish in lockstep.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from insitubatch._engine.reads.concurrency import (
    AUTO_START,
    AUTO_START_REMOTE,
    PROBE_DOWN,
    PROBE_UP,
    ConcurrencyController,
)

TILE = 65_536
RTT_S = 0.04
BANDWIDTH = 200e6  # bytes/s
BDP = BANDWIDTH * RTT_S / TILE  # ~122 reads
JITTER = 0.1
GOLDEN = (5**0.5 - 1) / 2


@dataclass
class Link:
    """A fake link driving one controller; records what it did."""

    controller: ConcurrencyController
    bandwidth: float = BANDWIDTH
    rtt_s: float = RTT_S
    demand: float = math.inf  # reads the passes have ready at any time
    throttle: Callable[[float], bool] = lambda now: False
    noise: random.Random | None = None  # exponential extra delay (a heavy tail) when set
    side: Callable[[float], float] = lambda now: 0.0  # share of reads that are shard indexes (a place, no bytes)
    now: float = 0.0
    inflight: int = 0
    max_inflight: int = 0
    done_bytes: list[tuple[float, int]] = field(default_factory=list)
    limits: list[tuple[float, int]] = field(default_factory=list)
    _heap: list[tuple[float, int, float]] = field(default_factory=list)
    _seq: int = 0
    _indexes: int = 0  # index reads in flight

    def run_until(self, t_end: float) -> None:
        c = self.controller
        while self.now < t_end:
            while self.inflight < min(c.limit, self.demand):
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
                self._seq += 1
                index = (self._seq * GOLDEN * GOLDEN) % 1.0 < self.side(self.now)
                seconds = max(self.rtt_s, (self.inflight - self._indexes) * TILE / self.bandwidth)
                seconds = self.rtt_s if index else seconds
                self._indexes += index
                seconds *= 1 + JITTER * (self._seq * GOLDEN % 1.0)
                if self.noise is not None:
                    seconds += self.noise.expovariate(1 / (0.25 * self.rtt_s))
                heapq.heappush(self._heap, (self.now + seconds, -self._seq if index else self._seq, seconds))
            self.now, seq, seconds = heapq.heappop(self._heap)
            full = self.inflight >= c.limit
            self.inflight -= 1
            if seq < 0:
                self._indexes -= 1
                c.on_side(self.now)
            elif self.throttle(self.now):
                c.on_throttle(self.now)
            else:
                c.on_complete(self.now, TILE, seconds, full)
                self.done_bytes.append((self.now, TILE))
            self.limits.append((self.now, c.limit))

    def rate(self, t0: float, t1: float) -> float:
        """Bytes/s completed in ``[t0, t1)``."""
        return sum(n for t, n in self.done_bytes if t0 <= t < t1) / (t1 - t0)

    def limits_between(self, t0: float, t1: float) -> list[int]:
        return [lim for t, lim in self.limits if t0 <= t < t1]

    def operating_point(self, t0: float, t1: float) -> int:
        """The limit the controller held most of ``[t0, t1)`` (probes are short excursions from it)."""
        return int(statistics.median_low(self.limits_between(t0, t1)))


def test_it_converges_to_the_bandwidth_delay_product_and_fills_the_link() -> None:
    link = Link(ConcurrencyController(cap=1024))
    link.run_until(20.0)
    point = link.operating_point(10.0, 20.0)
    assert BDP <= point <= 1.5 * BDP, (point, BDP)
    settled = link.limits_between(10.0, 20.0)  # probes go a quarter either way and come back
    assert int(PROBE_DOWN * point) <= min(settled) and max(settled) <= int(PROBE_UP * point) + 1
    assert link.rate(10.0, 20.0) >= 0.9 * BANDWIDTH


def test_it_never_exceeds_the_memory_cap() -> None:
    cap = 48  # well under the link's bandwidth-delay product: throughput rises all the way to it
    link = Link(ConcurrencyController(cap=cap))
    link.run_until(10.0)
    assert link.max_inflight <= cap
    assert max(lim for _, lim in link.limits) <= cap
    assert link.operating_point(5.0, 10.0) == cap
    # a lower cap (a reader with fatter tiles joined) takes effect at once
    capped_at = link.now
    link.controller.set_cap(20, capped_at)
    assert link.controller.limit == 20
    link.run_until(capped_at + 5.0)
    assert max(link.limits_between(capped_at + 1e-9, link.now)) <= 20


def test_throttling_halves_the_limit_once_per_window_and_it_recovers() -> None:
    storm = (12.0, 12.3)
    link = Link(ConcurrencyController(cap=1024), throttle=lambda now: storm[0] <= now < storm[1])
    link.run_until(storm[0] - 0.002)
    before = link.controller.limit
    assert before >= PROBE_DOWN * BDP
    cuts = link.controller.cuts
    link.run_until(storm[0])  # up to the first throttled answer
    assert link.controller.limit == before // 2
    link.run_until(storm[1])
    # many throttled answers, but one cut per CUT_TURNS mean GET times, not one per answer
    answers = link.controller.throttled
    assert answers > 20
    assert link.controller.cuts - cuts <= 1 + (storm[1] - storm[0]) / (2 * RTT_S)
    assert link.controller.limit < before // 2 + 1
    link.run_until(storm[1] + 8.0)
    assert link.operating_point(storm[1] + 6.0, storm[1] + 8.0) >= PROBE_DOWN * BDP  # crept back
    history = link.controller.history()
    assert history.throttled == answers and history.cuts == link.controller.cuts


def test_throttling_that_does_not_follow_the_rate_costs_one_cut_per_burst() -> None:
    """A store that throttles a share of the GETs in bursts whatever the rate (a bucket scaling, not us):
    the first answer of a burst cuts the limit; a cut that left the share as low as it was is not repeated."""
    period, burst, share, bursts = 6.0, 2.0, 0.05, 6
    draws = random.Random(7)
    link = Link(
        ConcurrencyController(cap=1024),
        throttle=lambda now: now % period >= period - burst and draws.random() < share,
    )
    link.run_until(period - burst)
    before = link.operating_point(burst, period - burst)  # the first quiet spell: no burst yet
    assert before >= PROBE_DOWN * BDP
    link.run_until(bursts * period)
    assert bursts <= link.controller.cuts <= 2 * bursts, link.controller.cuts
    for k in range(1, bursts + 1):
        during = link.limits_between(k * period - burst, k * period)
        assert min(during) >= PROBE_DOWN * before / 4, (k, min(during))
        if k > 1:  # and each quiet spell wins the cut back
            assert link.operating_point(k * period - burst - 1.0, k * period - burst) >= PROBE_DOWN * BDP, k


def test_throttling_that_follows_the_rate_settles_under_the_stores_rate() -> None:
    """A store that takes ``allowed`` reads in flight and throttles the excess share of the answers."""
    allowed = BDP / 3
    draws = random.Random(3)
    link = Link(ConcurrencyController(cap=1024))
    link.throttle = lambda now: draws.random() < 1.0 - allowed / max(allowed, link.inflight + 1)
    link.run_until(30.0)
    assert link.controller.cuts >= 1
    point = link.operating_point(15.0, 30.0)
    assert allowed / 4 <= point <= PROBE_UP * allowed + 1, point
    assert link.rate(15.0, 30.0) >= 0.3 * allowed * TILE / RTT_S


def test_a_pass_that_cannot_fill_the_window_leaves_the_limit_alone() -> None:
    link = Link(ConcurrencyController(cap=1024), demand=10)
    link.run_until(10.0)
    assert {lim for _, lim in link.limits} == {AUTO_START}


def test_it_follows_a_link_that_gets_faster() -> None:
    link = Link(ConcurrencyController(cap=1024), bandwidth=BANDWIDTH / 2)
    link.run_until(15.0)
    assert BDP / 2 <= link.operating_point(10.0, 15.0) <= 1.5 * BDP / 2
    link.bandwidth = BANDWIDTH
    link.run_until(30.0)
    assert BDP <= link.operating_point(25.0, 30.0) <= 1.5 * BDP


@pytest.mark.parametrize("seed", [1, 2])
def test_it_converges_on_a_heavy_tailed_link(seed: int) -> None:
    link = Link(ConcurrencyController(cap=1024), noise=random.Random(seed))
    link.run_until(30.0)
    # the tail lengthens every GET by a quarter RTT on average, and the link's product by as much
    point = link.operating_point(15.0, 30.0)
    assert BDP <= point <= 2 * BDP, point
    # a GET's tail holds its slot without moving bytes: past the product, more reads gain too little to stay
    assert link.rate(15.0, 30.0) >= 0.7 * BANDWIDTH


def test_the_history_of_a_pass_covers_only_its_own_intervals() -> None:
    link = Link(ConcurrencyController(cap=1024))
    link.run_until(2.0)
    since = link.controller.intervals
    seen_before = link.controller.history().min
    link.run_until(20.0)
    mine = link.controller.history(since)
    assert mine.min >= seen_before and mine.max <= PROBE_UP * 1.5 * BDP + 1
    assert BDP <= mine.median <= 1.5 * BDP


@pytest.mark.parametrize("start", [AUTO_START, AUTO_START_REMOTE])
@pytest.mark.parametrize("seed", [1, 2])
def test_where_more_reads_buy_nothing_it_does_not_climb(seed: int, start: int) -> None:
    small = 16 * TILE / RTT_S  # a pipe full at 16 reads in flight (a CPU-bound client looks like this)
    link = Link(ConcurrencyController(cap=1024, start=start), bandwidth=small, noise=random.Random(seed))
    link.run_until(30.0)
    assert link.operating_point(15.0, 30.0) <= 3 * 16


def test_shard_indexes_read_as_a_pass_starts_do_not_make_it_overshoot() -> None:
    """A pass reads most of its shards' indexes as its read-ahead fills: the first intervals' answers are
    largely indexes (a place in the window, no bytes), and fewer from one interval to the next. A limit
    measured then looks slow; compared with the next, slow start would double past what the link needs."""
    pipe = 64 * TILE / RTT_S  # full at 64 data reads in flight
    falling = lambda now: 0.4 if now < 0.3 else 0.15 if now < 0.6 else 0.0  # noqa: E731
    with_indexes = Link(ConcurrencyController(cap=1024, start=AUTO_START_REMOTE), bandwidth=pipe, side=falling)
    plain = Link(ConcurrencyController(cap=1024, start=AUTO_START_REMOTE), bandwidth=pipe)
    for link in (with_indexes, plain):
        link.run_until(4.0)
    assert max(with_indexes.limits_between(0.0, 4.0)) <= max(plain.limits_between(0.0, 4.0))
    assert with_indexes.operating_point(1.0, 4.0) == plain.operating_point(1.0, 4.0)
    # indexes at a steady share (a long pass reading new shards as it goes) leave it learning as before
    steady = Link(ConcurrencyController(cap=1024, start=AUTO_START_REMOTE), bandwidth=pipe, side=lambda now: 0.12)
    steady.run_until(8.0)
    assert 64 <= steady.operating_point(4.0, 8.0) <= 1.5 * 64 / (1 - 0.12)


@pytest.mark.parametrize("seed", [1, 2])
def test_on_a_clock_that_does_not_start_at_zero_no_doubling_is_free(seed: int) -> None:
    """The event loop's clock counts from the machine's boot. The first interval is measured from the
    first answer (not from zero: no bytes/s at all, and slow start's first two doublings would each
    compare with nothing), and only warms up: a link whose pipe is full at 16 reads never sees more than
    one doubling past the start, each of which holds twice the tiles in memory."""
    small = 16 * TILE / RTT_S
    boot = 86_400.0
    link = Link(
        ConcurrencyController(cap=1024, start=AUTO_START_REMOTE),
        bandwidth=small,
        noise=random.Random(seed),
        now=boot,
    )
    link.run_until(boot + 30.0)
    assert max(lim for _, lim in link.limits) <= 2 * AUTO_START_REMOTE
    assert link.operating_point(boot + 15.0, boot + 30.0) <= 3 * 16


def test_a_link_that_pays_for_more_reads_still_gets_them_after_the_warm_up() -> None:
    """The warm-up interval costs one interval, not the climb: from a late clock it reaches the product."""
    boot = 86_400.0
    link = Link(ConcurrencyController(cap=1024), now=boot)
    link.run_until(boot + 20.0)
    point = link.operating_point(boot + 10.0, boot + 20.0)
    assert BDP <= point <= 1.5 * BDP, (point, BDP)

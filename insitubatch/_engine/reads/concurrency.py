"""``max_inflight="auto"``: how many reads a store gets at once, found while the passes run.

A :class:`ConcurrencyController` is pure arithmetic over what the fetcher
tells it (bytes and duration of each finished GET, each throttling answer)
and the time it is told them at, so it runs the same on a fake clock.

The rule, in measurement intervals (each at least ``INTERVAL_TURNS`` mean
GET times and ``INTERVAL_MIN_GETS`` GETs long, started one mean GET time
after the limit last changed, so the window has refilled):

1. **Slow start.** From its start (``AUTO_START_REMOTE`` for a remote
   store's window) the limit doubles while each doubling still raises the
   completed bytes/s by ``START_GAIN``; at the first that does not, it
   falls back to the last limit that paid. The first interval is measured
   from the first answer and only warms up (the pipeline is still filling):
   the starting limit's bytes/s is the second interval's. Every doubling
   holds twice the tiles in memory, so one that did not pay is undone.
2. **Probing.** Every ``PROBE_EVERY`` steady intervals the limit tries
   ``PROBE_UP`` times itself (kept if bytes/s rose by ``PROBE_GAIN``, and
   then it climbs again) or, alternately, ``PROBE_DOWN`` times (kept if it
   still moves ``KEEP_SHARE`` of the operating point's bytes/s): it settles
   at the smallest limit that moves the most bytes, the link's
   bandwidth-delay product, and follows the link when it changes; where
   more reads in flight buy nothing (the CPU binds), it drifts down.
3. **Throttling.** A throttling answer (HTTP 429/503, S3 ``SlowDown``) halves
   the limit at once; while the store keeps throttling, again every
   ``CUT_TURNS`` mean GET times (the answers in between were to GETs sent
   at the old rate), as long as at least ``CUT_SHARE`` of the answers since
   the last cut were throttled: a store that throttles for our rate answers
   the excess share, and a cut lowers it; one that throttles a small share
   whatever the rate (a bucket scaling its partitions) leaves it where it
   was, and more cuts would only starve the pass. A throttle
   ``EPISODE_TURNS`` mean GET times after the last cut cuts again whatever
   the share. Once it has been quiet for ``QUIET_TURNS`` mean GET
   times the limit doubles every ``QUIET_TURNS`` up to what the first cut
   left (half the limit before the episode), then probes up as above: many
   clients on one bucket prefix back off together and creep back.
4. Reads the fetcher marks as not for learning (a shard's index: a round
   trip for a few bytes) hold a place in the window but move no bytes, so
   an interval's bytes/s depends on their share of its answers. Two
   intervals whose shares differ by more than ``SIDE_DRIFT`` are not
   compared: the limit goes back to the one the comparison was from, which
   is measured again (a pass reads most of its indexes as its read-ahead
   fills; a first limit measured then looks slow, and slow start would
   double past what the link needs once they are in).
5. An interval in which the window was mostly not full (the pass could not
   use the limit: a slow consumer, a small read-ahead) says nothing about
   the link and changes nothing; a probe it was testing is undone.

The limit never leaves ``[MIN_LIMIT, cap]``; the cap is the memory plan's
(``insitubatch.plan.sizing.auto_inflight_cap``), set by the window.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass

__all__ = ["ConcurrencyController", "LimitHistory"]

# Reads a store gets before anything is measured: the fixed default this engine used before "auto".
AUTO_START = 32
# A remote store's window starts wider: a default first shuffle block (16 stored chunks of a few variables,
# or a sharded array's indexes and then its inner chunks) goes out in one round trip, not two.
AUTO_START_REMOTE = 2 * AUTO_START
MIN_LIMIT = 1
# Slow start: a doubling must raise bytes/s at least this much (2x would be a link that scales perfectly).
START_GAIN = 1.3
# Steady state: an up-probe stays only for this gain, a down-probe only if it keeps this share of the best.
PROBE_UP = 1.25
PROBE_DOWN = 0.8
PROBE_GAIN = 1.08
KEEP_SHARE = 0.95
PROBE_EVERY = 2
# A measurement interval: long enough to average a heavy-tailed link (hundreds of GETs at typical limits)
# and to hold several turns of the window, so where its edges cut a burst of answers moves the rate little.
INTERVAL_TURNS = 6
INTERVAL_MIN_GETS = 64
INTERVAL_MIN_S = 0.05
# A share of an interval's completions that found the window full, below which the pass, not the link, limited.
SATURATED_SHARE = 0.5
# Throttling: the cut; how many mean GET times after a cut the next may come, and how many without a
# throttling answer before (and between) the doublings that take the limit back.
THROTTLE_CUT = 0.5
CUT_TURNS = 6
QUIET_TURNS = 4
# A further cut within EPISODE_TURNS mean GET times of the last needs this share of throttled answers since it.
CUT_SHARE = 0.2
EPISODE_TURNS = 30
# Intervals whose shares of side reads (shard indexes) differ by more than this are not compared.
SIDE_DRIFT = 0.1
# Mean GET time before any GET finished (a cloud store's tens of ms).
PRIOR_GET_S = 0.05
# How fast the mean GET time follows the link.
MEAN_WEIGHT = 0.05
# Limits kept for the per-pass history (one per interval).
HISTORY_LENGTH = 4096


@dataclass(frozen=True)
class LimitHistory:
    """The limit over some intervals: its min, median and max, and the throttling seen meanwhile."""

    min: int
    median: int
    max: int
    throttled: int  # throttling answers
    cuts: int  # multiplicative decreases they caused


class ConcurrencyController:
    """The reads-in-flight limit of one store, adjusted from the GETs it sees finish. Loop thread only."""

    def __init__(self, cap: int, start: int = AUTO_START) -> None:
        self.cap = max(MIN_LIMIT, int(cap))
        self.limit = min(self.cap, max(MIN_LIMIT, int(start)))
        self.mean_get_s = PRIOR_GET_S
        self.intervals = 0  # measurement intervals ended
        self.throttled = 0  # throttling answers seen
        self.side_reads = 0  # reads it was told held a place but not to learn from (shard indexes)
        self.cuts = 0
        self._history: collections.deque[int] = collections.deque([self.limit], maxlen=HISTORY_LENGTH)
        self._mode = "start"
        self._base_limit = self.limit  # the operating point and its bytes/s
        self._base_rate: float | None = None
        self._base_side = 0.0  # the share of side reads (shard indexes) in the interval _base_rate came from
        self._steady = 0  # steady intervals since the last probe or cut (negative: quiet after a cut)
        self._probe_up_next = True
        self._last_cut = -float("inf")
        self._last_throttle = -float("inf")
        self._regain = self.limit  # what recovery doubles back up to (the limit after an episode's first cut)
        self._since_cut = [0, 0]  # answers, and throttled answers, to GETs sent after the last cut
        self._capped_from = 0  # the limit a lower cap cut, restored when the cap rises again
        self._begin = 0.0
        self._restart(0.0)
        self._clock_started = False  # the first answer opens the first interval (the loop's clock is not 0-based)
        self._filled = False  # whether the first saturated interval (the pipeline filling) is over

    # -- what the fetcher and the window report ------------------------------------------
    def on_complete(self, now: float, nbytes: int, seconds: float, saturated: bool) -> None:
        """A GET finished at ``now`` with ``nbytes`` in ``seconds``; ``saturated``: the window was full."""
        self._start_clock(now)
        self.mean_get_s += MEAN_WEIGHT * (seconds - self.mean_get_s)
        self._answered(now, throttled=False)
        if self._mode == "recover":
            self._recover(now)
            return
        if now < self._begin:
            return  # the window is still refilling after a change
        self._bytes += nbytes
        self._gets += 1
        self._full += saturated
        elapsed = now - self._begin
        if self._gets >= max(INTERVAL_MIN_GETS, self.limit) and elapsed >= max(
            INTERVAL_MIN_S, INTERVAL_TURNS * self.mean_get_s
        ):
            side = self._side / (self._gets + self._side)
            self._end_interval(now, self._bytes / elapsed, self._full >= SATURATED_SHARE * self._gets, side)

    def on_side(self, now: float) -> None:
        """A read the controller does not learn from (a shard index) finished at ``now``: its place in the window."""
        self._start_clock(now)
        self.side_reads += 1
        if self._mode != "recover" and now >= self._begin:
            self._side += 1

    def on_throttle(self, now: float) -> None:
        """The store answered a GET with a throttling status at ``now``: halve the limit (once per window)."""
        self._start_clock(now)
        self.throttled += 1
        self._last_throttle = now
        self._answered(now, throttled=True)
        since = now - self._last_cut
        if since < CUT_TURNS * self.mean_get_s:
            return
        answers, throttled = self._since_cut
        if since < EPISODE_TURNS * self.mean_get_s and throttled < CUT_SHARE * answers:
            return  # the last cut did not move the share: the store is not throttling our rate
        self._last_cut = now
        self._since_cut = [0, 0]
        self._probe_up_next = True  # under the store's rate now: the next probe looks for it upward
        self.cuts += 1
        self._set(max(MIN_LIMIT, int(self.limit * THROTTLE_CUT)), now)
        if self._mode != "recover":  # the first cut of an episode: recovery will double back up to here
            self._regain = self.limit
        self._base_limit, self._base_rate = self.limit, None
        self._mode = "recover"
        self._history.append(self.limit)
        self.intervals += 1

    def _start_clock(self, now: float) -> None:
        """The first answer begins the first interval: measured from the controller's making, on a clock that
        counts from the machine's boot, it would see no bytes/s at all, and slow start's first two doublings
        (each compared with that) would be free, whatever the link needs."""
        if not self._clock_started:
            self._clock_started = True
            if self._begin < now:
                self._begin = now

    def _answered(self, now: float, throttled: bool) -> None:
        """Count an answer toward the throttled share since the last cut (once the GETs sent before it are in)."""
        if now - self._last_cut >= self.mean_get_s:
            self._since_cut[0] += 1
            self._since_cut[1] += throttled

    def _recover(self, now: float) -> None:
        """After throttling: nothing until the store is quiet, then a doubling per quiet spell up to ``_regain``."""
        quiet = QUIET_TURNS * self.mean_get_s
        if now - self._last_throttle < quiet or now - self._begin < quiet - self.mean_get_s:
            return
        if self.limit < min(self._regain, self.cap):
            self._set(min(self._regain, self.cap, 2 * self.limit), now)
            self._history.append(self.limit)
            self.intervals += 1
            return
        self._base_limit, self._mode, self._steady = self.limit, "steady", 0

    def set_cap(self, cap: int, now: float) -> None:
        """A new memory cap (readers came or went): the limit follows it down at once, and back up
        to what it was when the cap rises again."""
        self.cap = max(MIN_LIMIT, int(cap))
        if self.limit > self.cap:
            self._capped_from = max(self._capped_from, self.limit)
            self._set(self.cap, now)
        elif self._capped_from > self.limit:
            self._set(min(self.cap, self._capped_from), now)
        if self._capped_from <= self.cap:
            self._capped_from = 0
        self._base_limit = min(max(self._base_limit, self.limit), self.cap)

    def history(self, since: int = 0) -> LimitHistory:
        """The limits in force from the end of interval ``since`` (a pass notes ``intervals`` when it starts) on."""
        oldest = self.intervals - len(self._history) + 1  # the interval whose end set the oldest kept limit
        values = list(self._history)[max(0, since - oldest) :] or [self.limit]
        return LimitHistory(min(values), int(statistics.median_low(values)), max(values), self.throttled, self.cuts)

    # -- the rule ----------------------------------------------------------------------------
    def _end_interval(self, now: float, rate: float, saturated: bool, side: float = 0.0) -> None:
        self.intervals += 1
        if not saturated:  # the pass could not fill the window: nothing learned, a probe is undone
            if self._mode.startswith("probe"):
                self._mode = "steady"
                self._set(self._base_limit, now)
            self._history.append(self.limit)
            self._restart(now)
            return
        base = self._base_rate
        if self._mode == "start" and base is None and not self._filled:
            # the first interval saw the pipeline fill (decode threads, first batches, connections opening):
            # its bytes/s is low for reasons of its own, and a doubling compared with it would look like it paid
            self._filled = True
            self._history.append(self.limit)
            self._restart(now)
            return
        if base is not None and abs(side - self._base_side) > SIDE_DRIFT:  # another mix of reads: no comparison
            if self._mode == "steady":
                self._rebase(rate, side)
            else:
                self._mode = "start" if self._mode == "start" else "steady"
                self._base_rate = None
                self._set(self._base_limit, now)
            self._history.append(self.limit)
            self._restart(now)
            return
        if self._mode == "start":
            if base is None or rate >= START_GAIN * base:
                self._rebase(rate, side)
                if self.limit >= self.cap:
                    self._mode = "steady"
                else:
                    self._set(min(self.cap, 2 * self.limit), now)
            else:  # the doubling did not pay: back to the last limit that did
                self._mode = "steady"
                self._set(self._base_limit, now)
        elif self._mode == "probe_up":
            if base is not None and rate >= PROBE_GAIN * base and self.limit < self.cap:
                self._rebase(rate, side)
                self._set(min(self.cap, max(self.limit + 1, int(self.limit * PROBE_UP))), now)
            else:
                if base is not None and rate >= PROBE_GAIN * base:
                    self._rebase(rate, side)
                self._mode = "steady"
                self._set(self._base_limit, now)
        elif self._mode == "probe_down":
            if base is None or rate >= KEEP_SHARE * base:
                self._rebase(rate, side)
            self._mode = "steady"
            self._set(self._base_limit, now)
        else:
            self._steady += 1
            self._rebase(rate if base is None else 0.5 * (base + rate), side)
            if self._steady >= PROBE_EVERY:
                self._probe(now)
        self._history.append(self.limit)
        self._restart(now)

    def _rebase(self, rate: float, side: float) -> None:
        """The current limit becomes the operating point, moving ``rate`` bytes/s with ``side`` of its answers indexes."""
        self._base_limit, self._base_rate, self._base_side = self.limit, rate, side

    def _probe(self, now: float) -> None:
        self._steady = 0
        up = self._probe_up_next and self.limit < self.cap
        self._probe_up_next = not self._probe_up_next
        if up:
            self._mode = "probe_up"
            self._set(min(self.cap, max(self.limit + 1, int(self.limit * PROBE_UP))), now)
        elif self.limit > MIN_LIMIT:
            self._mode = "probe_down"
            self._set(max(MIN_LIMIT, min(self.limit - 1, int(self.limit * PROBE_DOWN))), now)

    def _set(self, limit: int, now: float) -> None:
        self.limit = limit
        self._restart(now)

    def _restart(self, now: float) -> None:
        """A new interval, measured from one mean GET time on (the window refills to the new limit first)."""
        self._begin = now + self.mean_get_s
        self._bytes = 0
        self._gets = 0
        self._side = 0
        self._full = 0

"""Recent per-GET times to first byte, summarised as the quantiles the hedge and stall rules read.

A ring of the last ``LATENCY_WINDOW`` samples; the quantiles are recomputed
every ``REFRESH_EVERY`` samples (a sort of a few hundred floats), so adding a
sample costs a store and an increment. Loop thread only.
"""

from __future__ import annotations

import math

__all__ = ["LatencyWindow"]

# Samples the quantiles are taken over: a few seconds of GETs at typical rates,
# so the rules follow a link that changes without forgetting its tail at once.
LATENCY_WINDOW = 512
# Quantiles are refreshed this often (and on every sample until this many have arrived).
REFRESH_EVERY = 32


class LatencyWindow:
    """The last ``size`` latencies and their p50/p90/p99 (``nan`` before the first sample)."""

    def __init__(self, size: int = LATENCY_WINDOW, refresh: int = REFRESH_EVERY) -> None:
        self._ring = [0.0] * size
        self._size = size
        self._refresh = refresh
        self.count = 0  # samples ever added
        self.p50 = self.p90 = self.p99 = math.nan

    def add(self, seconds: float) -> None:
        self._ring[self.count % self._size] = seconds
        self.count += 1
        if self.count <= self._refresh or self.count % self._refresh == 0:
            self._summarise()

    def _summarise(self) -> None:
        recent = sorted(self._ring[: min(self.count, self._size)])
        last = len(recent) - 1
        self.p50 = recent[round(0.50 * last)]
        self.p90 = recent[round(0.90 * last)]
        self.p99 = recent[round(0.99 * last)]

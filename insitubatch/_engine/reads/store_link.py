"""A remote store as the engine reads it: the store's own reader, and what all readers of one endpoint share.

:func:`client_for` returns a :class:`StoreClient` for a store that is not
read synchronously (``io.sync_get``): the backend, the read policy and the
route its reader carries (``stores.reading``: the store decides which
client reads it, with which retries, and why), and its :class:`StoreLink`.
A link is shared by every store on one endpoint (an HTTP host, an
S3/GCS bucket, an Azure container; the store names it) in this process, so
ranks and concurrent passes reading one bucket share one
:class:`~.concurrency.ConcurrencyController` and window, one latency
distribution, one hedge budget and one timer for their reads' hedge and
stall times (:class:`~.deadlines.Deadlines`); a store read through its own ``get``
names no endpoint and gets a link of its own.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from typing import Any

from zarr.abc.store import Store

from ...plan.sizing import AUTO_INFLIGHT_CEILING
from ...stores.read_policy import ReadPolicy
from ...stores.reading import LOCAL_ROUTE, Route, reading_store
from .concurrency import AUTO_START_REMOTE, ConcurrencyController
from .deadlines import Deadlines
from .latency import LatencyWindow
from .window import ReadWindow

__all__ = ["Route", "StoreClient", "StoreLink", "client_for", "link_named", "route_report"]

# Hedging: a GET outstanding HEDGE_FACTOR x the recent p90 time (at least HEDGE_FLOOR_S, which keeps a
# busy event loop's hiccups from looking like a slow store) gets one duplicate. Duplicates are paid from a
# budget that grows by HEDGE_SHARE per GET, holds at most HEDGE_BURST, and is not spent in the
# HEDGE_QUIET_S after a throttling answer (a store asking for less gets no extra requests).
HEDGE_FACTOR = 3.0
HEDGE_FLOOR_S = 0.1
HEDGE_SHARE = 0.05
HEDGE_BURST = 10.0
HEDGE_QUIET_S = 1.0
# No duplicates on a link whose median GET is under this: a local or loopback store has no tail worth one,
# and there a busy machine's pauses would pass for stragglers.
HEDGE_MIN_P50_S = 0.010
# The quantiles mean nothing before this many GETs: no hedging, and the stall timer at its floor.
MIN_SAMPLES = 32
# Stalls: an attempt with no answer for STALL_FACTOR x the recent p99 (at least STALL_FLOOR_S, at most the
# store's read_timeout) is abandoned; each further stall of the same read waits STALL_GROWTH times longer.
STALL_FACTOR = 10.0
STALL_FLOOR_S = 2.0
STALL_GROWTH = 1.5


class StoreLink:
    """What every reader of one endpoint shares: the auto window, the latency distribution, the hedge budget,
    the deadline heap.

    Loop thread only (created anywhere).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.latency = LatencyWindow()
        self.controller = ConcurrencyController(cap=AUTO_INFLIGHT_CEILING, start=AUTO_START_REMOTE)
        self.window = ReadWindow(AUTO_START_REMOTE, controller=self.controller, ceiling=AUTO_INFLIGHT_CEILING)
        self._hedge_tokens = HEDGE_BURST
        self._quiet_until = -math.inf
        self._deadlines: Deadlines | None = None

    def deadlines(self, loop: asyncio.AbstractEventLoop) -> Deadlines:
        """The hedge and stall times of every read on this link and ``loop``: one heap, one timer (made at the
        first read on ``loop``; a new one if the reads moved to another loop)."""
        if self._deadlines is None or self._deadlines.loop is not loop:
            self._deadlines = Deadlines(loop)
        return self._deadlines

    def hedge_after(self) -> float:
        """Seconds after which an outstanding GET gets a duplicate (``inf``: not yet known)."""
        if self.latency.count < MIN_SAMPLES or self.latency.p50 < HEDGE_MIN_P50_S:
            return math.inf
        return max(HEDGE_FLOOR_S, HEDGE_FACTOR * self.latency.p90)

    def stall_after(self, policy: ReadPolicy) -> float:
        """Seconds without an answer after which an attempt is abandoned and tried afresh."""
        p99 = self.latency.p99 if self.latency.count >= MIN_SAMPLES else 0.0
        return min(policy.read_timeout_s, max(STALL_FLOOR_S, STALL_FACTOR * p99))

    def requested(self) -> None:
        """A GET went out: it earns the hedge budget its share."""
        self._hedge_tokens = min(HEDGE_BURST, self._hedge_tokens + HEDGE_SHARE)

    def take_hedge(self, now: float) -> bool:
        """Spend the budget on one duplicate, if there is budget and the store has not throttled lately."""
        if now < self._quiet_until or self._hedge_tokens < 1.0:
            return False
        self._hedge_tokens -= 1.0
        return True

    def throttled(self, now: float) -> None:
        """A throttling answer: the auto window backs off and hedging pauses."""
        self.window.throttled()
        self._quiet_until = now + HEDGE_QUIET_S


# The route of a client built without one: the store read through its own get.
OWN_GET = Route("store", "its own get")


class StoreClient:
    """One store's backend, retry bounds, link and route."""

    def __init__(
        self,
        backend: Any,
        policy: ReadPolicy,
        link: StoreLink,
        route: Route = OWN_GET,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.link = link
        self.route = route

    def close(self, wait_s: float = 0.0) -> None:
        """Close what the backend keeps open (the engine's own connections); any thread, more than once.

        ``wait_s``: from another thread than the loop's, how long to wait for the sockets to close.
        """
        closer = getattr(self.backend, "close", None)  # (a client of its own: the engine's, or another)
        if closer is not None:
            closer(wait_s=wait_s)


def route_report(client: StoreClient | None) -> dict[str, str]:
    """``{"client": ..., "reason": ...}`` for ``describe()``: ``client``'s route, or a local store's."""
    route = LOCAL_ROUTE if client is None else client.route
    return {"client": route.client, "reason": route.reason}


_links: dict[str, StoreLink] = {}
_lock = threading.Lock()


def link_named(endpoint: str | None) -> StoreLink:
    """The link every reader of ``endpoint`` shares in this process (``None``: a link of its own)."""
    if endpoint is None:
        return StoreLink("store")
    with _lock:
        link = _links.get(endpoint)
        if link is None:
            link = _links[endpoint] = StoreLink(endpoint)
        return link


def client_for(store: Store) -> StoreClient:
    """The engine's client for ``store``: the reader the store carries, on its endpoint's shared link.

    A store that carries no reader (one insitubatch did not build) is
    adapted here (``stores.reading.reading_store``), and the client's
    ``close()`` closes what its reader opened; the dataset adapts such a
    store once, at its door, and closes the adapter.

    Raises
    ------
    ValueError
        The store's ``client`` setting (or ``INSITUBATCH_CLIENT``) is
        ``"engine"`` and the engine's client cannot read it; the message names why.
    """
    reader = reading_store(store).reader()
    return StoreClient(reader.backend, reader.policy, link_named(reader.endpoint), reader.route)


def _forget_links_in_child() -> None:
    # a forked child builds its own links: its parent's windows count the parent's reads, and their lock may
    # have been held by a thread the fork left behind
    global _lock
    _links.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_links_in_child)

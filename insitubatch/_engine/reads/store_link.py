"""A remote store as the engine reads it: a retry-free client per store, and what all readers of it share.

:func:`client_for` returns a :class:`StoreClient` for a zarr store that is
not read synchronously (``io.sync_get``): its backend, the
:class:`~.read_policy.ReadPolicy` its settings give, and its
:class:`StoreLink`. A link is shared by every store on one endpoint (an
HTTP host, an S3/GCS bucket, an Azure container) in this process, so ranks
and concurrent passes reading one bucket share one
:class:`~.concurrency.ConcurrencyController` and window, one latency
distribution and one hedge budget.

Backends. Behind zarr's ``ObjectStore`` over obstore's HTTP, S3, GCS or
Azure store, the engine calls obstore directly, through a twin of the
store built from its own config with obstore's retries turned off, so
that every throttling answer and every stalled attempt comes back to the
engine's retry loop (``fetch``); a whole key is one ranged GET (``bytes=0-``
far past any object), which obstore answers in one future instead of a
header future and a body future. Where ``stores.wire_settings`` finds the
engine's own client can read the store (plain HTTP(S), and S3 with static
keys or none, and a region) and the store's ``client`` setting
(``ForkSafeObjectStore.client_setting``: ``"auto"``, ``"engine"`` or ``"obstore"``) allows it,
the engine sends the GETs itself instead, on the loop (``_wire``), with the
twin kept for bodies too large to take whole and for what it hands over.
Any other store is read through its own ``get``, which has already retried
by its own rules. The backends are in ``_wire.backends``; a client's
:class:`Route` says which one reads the store and why, for ``describe()``
and ``insitubatch inspect``. ``close_store`` closes a store's client (its
connections), and a later read builds a fresh one.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlsplit

import obstore
import obstore.store
from zarr.abc.store import Store
from zarr.storage import ObjectStore, WrapperStore

from ..._wire.backends import _ObstoreBackend, _StoreBackend
from ..._wire.engine_client import NativeBackend
from ..._zarr_compat import wrapper_stack
from ...plan.sizing import AUTO_INFLIGHT_CEILING
from ...stores.client_choice import resolve_client
from ...stores.obstore_runtime import ForkSafeObjectStore
from ...stores.owned import on_close
from ...stores.wire_settings import engine_settings
from .concurrency import AUTO_START_REMOTE, ConcurrencyController
from .latency import LatencyWindow
from .read_policy import ReadPolicy, policy_for
from .window import ReadWindow

__all__ = ["Route", "StoreClient", "StoreLink", "client_for", "route_report"]

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
# close_store, from the caller's thread, waits at most this long for the engine's sockets to be closed on the loop.
CLOSE_WAIT_S = 1.0


class StoreLink:
    """What every reader of one endpoint shares: the auto window, the latency distribution, the hedge budget.

    Loop thread only (created anywhere).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.latency = LatencyWindow()
        self.controller = ConcurrencyController(cap=AUTO_INFLIGHT_CEILING, start=AUTO_START_REMOTE)
        self.window = ReadWindow(AUTO_START_REMOTE, controller=self.controller, ceiling=AUTO_INFLIGHT_CEILING)
        self._hedge_tokens = HEDGE_BURST
        self._quiet_until = -math.inf

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


@dataclass(frozen=True)
class Route:
    """Which client reads a store (``"engine"``, ``"obstore"``, ``"store"``: its own ``get``) and why, in a few words."""

    client: str
    reason: str


# How describe() names a store read from local files, with no client at all.
LOCAL_ROUTE = Route("local", "read from files directly, no HTTP client")


class StoreClient:
    """One store's backend, retry bounds, link and route."""

    def __init__(
        self,
        backend: _ObstoreBackend | _StoreBackend | NativeBackend,
        policy: ReadPolicy,
        link: StoreLink,
        route: Route = Route("store", "its own get"),
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
_clients: dict[int, tuple[weakref.ref[Store], StoreClient]] = {}
_lock = threading.Lock()
_REMOTE = (obstore.store.HTTPStore, obstore.store.S3Store, obstore.store.GCSStore, obstore.store.AzureStore)


def _endpoint(raw: Any) -> str:
    """The name readers of one endpoint share a link under."""
    if isinstance(raw, obstore.store.HTTPStore):
        parts = urlsplit(raw.url)
        return f"http:{parts.scheme}://{parts.netloc}"
    config = dict(raw.config or {})
    if isinstance(raw, obstore.store.S3Store):
        return f"s3:{config.get('endpoint', '')}/{config.get('bucket', '')}"
    if isinstance(raw, obstore.store.GCSStore):
        return f"gcs:{config.get('base_url', '')}/{config.get('bucket', '')}"
    return f"azure:{config.get('account_name', '')}/{config.get('container_name', '')}"


def _retry_free(raw: Any) -> Any:
    """``raw`` rebuilt from its own config with obstore's retries off, or ``raw`` itself if that fails."""
    no_retries: Any = {"max_retries": 0, "retry_timeout": timedelta(0)}
    try:
        if isinstance(raw, obstore.store.HTTPStore):
            return obstore.store.HTTPStore.from_url(raw.url, client_options=raw.client_options, retry_config=no_retries)
        return type(raw)(
            prefix=raw.prefix,
            config=raw.config,
            client_options=raw.client_options,
            retry_config=no_retries,
            credential_provider=raw.credential_provider,
        )
    except Exception:  # a store we cannot rebuild keeps obstore's retries: it still hedges and stalls
        return raw


def _read_by(store: Store) -> Store:
    """The store whose reads ``store`` passes on unchanged: inside every ``WrapperStore`` that defines no read.

    A wrapper that reads itself (zarr's ``LoggingStore`` logs each read) is
    read through its own ``get``, so it sees every read.
    """
    stack = wrapper_stack(store)
    for wrapper, inner in zip(stack, stack[1:], strict=False):
        own = (
            vars(klass)
            for klass in type(wrapper).__mro__
            if issubclass(klass, WrapperStore) and klass is not WrapperStore
        )
        if any(name in defined for defined in own for name in _READS):
            return wrapper
        store = inner
    return store


# A wrapper defining any of these reads itself; one defining none passes every read on to the store it wraps.
_READS = ("get", "get_partial_values")


def _build(store: Store) -> StoreClient:
    store = _read_by(store)
    raw = cast(ObjectStore, store).store if type(store) in (ObjectStore, ForkSafeObjectStore) else None
    if not isinstance(raw, _REMOTE):
        # any other store: its own get and retries; stalls and hedging still apply, with a link of its own
        route = Route("store", f"a {type(store).__name__}: read through its own get, which retries by its own rules")
        own = StoreLink(f"store:{type(store).__name__}:{id(store)}")
        return StoreClient(_StoreBackend(store), ReadPolicy(), own, route)
    choice, source = store.client_setting if isinstance(store, ForkSafeObjectStore) else resolve_client(None)
    settings = engine_settings(raw) if choice != "obstore" else f"{source}"
    if choice == "engine" and isinstance(settings, str):
        raise ValueError(
            f"{source}, but the engine's client cannot read {raw!r}: {settings}; "
            "use client='auto' (or 'obstore') to read it with obstore's client"
        )
    twin = _retry_free(raw)
    policy = policy_for(raw.retry_config, raw.client_options)
    name = _endpoint(raw)
    with _lock:
        link = _links.get(name)
        if link is None:
            link = _links[name] = StoreLink(name)
    if twin is raw:  # (obstore's own retries stay on: the engine would retry each of its retries)
        reason = "its config could not be rebuilt without retries: obstore's client, with obstore's retries"
        return StoreClient(_ObstoreBackend(raw, own_retries=True), policy, link, Route("obstore", reason))
    if isinstance(settings, str):
        return StoreClient(_ObstoreBackend(twin), policy, link, Route("obstore", settings))
    return StoreClient(NativeBackend(twin, settings), policy, link, Route("engine", settings.reason))


def client_for(store: Store) -> StoreClient:
    """The engine's client for ``store`` (one per store object, built on first use, dropped by ``close_store``).

    Raises
    ------
    ValueError
        The store's ``client`` setting (or ``INSITUBATCH_CLIENT``) is
        ``"engine"`` and the engine's client cannot read it; the message names why.
    """
    key = id(store)
    with _lock:
        held = _clients.get(key)
        if held is not None and held[0]() is store:
            return held[1]
    client = _build(store)

    # the registry and its lock ride along as defaults: at interpreter exit the module's globals may be gone
    def forget(ref: weakref.ref[Store], key: int = key, clients: dict = _clients, lock: Any = _lock) -> None:
        with lock:
            held = clients.get(key)
            if held is not None and held[0] is ref:
                del clients[key]
        if held is not None and held[0] is ref:
            held[1].close()

    with _lock:
        held = _clients.get(key)
        if held is not None and held[0]() is store:
            return held[1]
        ref = weakref.ref(store, forget)
        _clients[key] = (ref, client)
    on_close(store, lambda: _closed(key, ref, client))
    return client


def _forget_clients_in_child() -> None:
    # a forked child builds its own clients: its parent's hold connections (shared sockets) on the parent's
    # loop, and their lock may have been held by a thread the fork left behind
    global _lock
    _clients.clear()
    _links.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_clients_in_child)


def _closed(key: int, ref: weakref.ref[Store], client: StoreClient) -> None:
    """``close_store`` ran: the client's connections close, and the next read builds a fresh client."""
    with _lock:
        held = _clients.get(key)
        if held is not None and held[0] is ref and held[1] is client:
            del _clients[key]
    client.close(wait_s=CLOSE_WAIT_S)

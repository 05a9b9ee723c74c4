"""What a store carries for the engine: which client reads it and why, its read policy, its endpoint and its reader.

Every store insitubatch builds carries a :class:`StoreReader` (built on the
first ask, held by the store in a :class:`HeldReader`, closed with the
store): the backend that sends its GETs (``_wire.backends``,
``_wire.engine_client``), the :class:`~.read_policy.ReadPolicy` its settings
give, the name of the endpoint whose link (window, latency, hedge budget)
every reader of it shares in the engine, and the :class:`Route` that
``describe()`` and ``insitubatch inspect`` show. A store that reads on the
calling thread (a local directory, memory) says so with ``local_reader()``.

Any other store (zarr's own ``ObjectStore`` or ``LocalStore``, a
``LoggingStore``, a user's subclass) is adapted once, at the dataset's door,
by :func:`reading_store` into a :class:`StoreAdapter`: every call delegated
to it, plus a reader of its own, which the adapter's ``close()`` closes
(never the store it adapts). A wrapper that defines its own reads
(``LoggingStore``) is read through its own ``get``, and its route says so.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import obstore.store
from zarr.abc.store import Store, SupportsGetSync
from zarr.storage import ObjectStore, WrapperStore

from .._wire.backends import ObstoreBackend, StoreBackend
from .._wire.engine_client import NativeBackend
from .._zarr_compat import wrapper_stack
from .client_choice import resolve_client
from .local_files import LocalFiles, obstore_get_sync
from .read_policy import ReadPolicy, policy_for
from .wire_settings import engine_settings

__all__ = [
    "CLOSE_WAIT_S",
    "LOCAL_ROUTE",
    "OWN_READS",
    "REMOTE_OBSTORES",
    "CarriesReader",
    "HeldReader",
    "Route",
    "StoreAdapter",
    "StoreReader",
    "endpoint_name",
    "obstore_local_reader",
    "obstore_reader",
    "own_get_reader",
    "read_by",
    "reading_store",
    "sync_get_of",
]

# A store's close, from the caller's thread, waits at most this long for the engine's sockets to close on the loop.
CLOSE_WAIT_S = 1.0
# obstore's remote backends: read through obstore (or the engine's own client) rather than a store's get.
REMOTE_OBSTORES = (obstore.store.HTTPStore, obstore.store.S3Store, obstore.store.GCSStore, obstore.store.AzureStore)
# A wrapper defining any of these reads itself; one defining none passes every read on to the store it wraps.
OWN_READS = ("get", "get_partial_values")


@dataclass(frozen=True)
class Route:
    """Which client reads a store (``"engine"``, ``"obstore"``, ``"store"``: its own ``get``, ``"local"``) and why."""

    client: str
    reason: str


# How describe() names a store read from local files, with no client at all.
LOCAL_ROUTE = Route("local", "read from files directly, no HTTP client")


class StoreReader:
    """What the engine reads one store with: its backend, retry bounds, endpoint name and route.

    ``endpoint``: the name the engine's link to it is shared under (every
    reader of one HTTP host, bucket or container shares one); ``None``
    for a store read through its own ``get``, whose link is its own.
    """

    def __init__(self, backend: Any, policy: ReadPolicy, endpoint: str | None, route: Route) -> None:
        self.backend = backend
        self.policy = policy
        self.endpoint = endpoint
        self.route = route

    def close(self, wait_s: float = 0.0) -> None:
        """Close what the backend keeps open (the engine's own connections); any thread, more than once."""
        closer = getattr(self.backend, "close", None)  # (a client of its own: the engine's, or another)
        if closer is not None:
            closer(wait_s=wait_s)


class HeldReader:
    """A store's reader: built on the first ask, held until the store closes it (a later ask builds a fresh one).

    Made by :meth:`of`, which also closes the reader when its store is
    garbage collected. A forked child builds its own: the parent's reader
    holds connections (sockets shared with the parent) on the parent's loop.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reader: StoreReader | None = None
        self.pid = os.getpid()

    @classmethod
    def of(cls, store: object) -> HeldReader:
        """A holder for ``store``'s reader, closed when ``store`` is collected (at exit the pools close their own)."""
        held = cls()
        weakref.finalize(store, held.close).atexit = False
        return held

    def get(self, build: Callable[[], StoreReader]) -> StoreReader:
        """The held reader, or a new one from ``build()`` if none is held in this process."""
        if self.pid != os.getpid():  # (the lock, too, may have been held by a thread the fork left behind)
            self.lock, self.reader, self.pid = threading.Lock(), None, os.getpid()
        with self.lock:
            if self.reader is None:
                self.reader = build()
            return self.reader

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Close the held reader's connections, if one was built in this process."""
        with self.lock:
            reader, self.reader = self.reader, None
        if reader is not None and self.pid == os.getpid():
            reader.close(wait_s=wait_s)


@runtime_checkable
class CarriesReader(Protocol):
    """A store that carries its reader: every store insitubatch builds, and the adapter of any other."""

    def reader(self) -> StoreReader: ...

    def local_reader(self) -> Callable[..., Any] | None: ...

    def close(self) -> None: ...


def endpoint_name(raw: Any) -> str:
    """The name readers of one obstore endpoint share a link under (an HTTP host, a bucket, a container)."""
    if isinstance(raw, obstore.store.HTTPStore):
        parts = urlsplit(raw.url)
        return f"http:{parts.scheme}://{parts.netloc}"
    config = dict(raw.config or {})
    if isinstance(raw, obstore.store.S3Store):
        return f"s3:{config.get('endpoint', '')}/{config.get('bucket', '')}"
    if isinstance(raw, obstore.store.GCSStore):
        return f"gcs:{config.get('base_url', '')}/{config.get('bucket', '')}"
    return f"azure:{config.get('account_name', '')}/{config.get('container_name', '')}"


def obstore_reader(raw: Any, twin: Any, client: tuple[str, str]) -> StoreReader:
    """The reader of remote obstore store ``raw``; ``twin`` its retry-free copy (``None``: none was built).

    ``client`` is ``(choice, what set it)``: ``"engine"`` or ``"auto"`` read
    with the engine's own client where ``stores.wire_settings`` finds it can,
    ``"obstore"`` (and ``"auto"`` elsewhere) with obstore's, through the twin,
    so that every failure comes back to the engine's retry loop. Without a
    twin obstore's own retries stay on (the engine would retry each of them).

    Raises
    ------
    ValueError
        ``client`` is ``"engine"`` and the engine's client cannot read ``raw``; the message names why.
    """
    choice, source = client
    policy = policy_for(raw.retry_config, raw.client_options)
    name = endpoint_name(raw)
    settings = engine_settings(raw) if choice != "obstore" else source
    if choice == "engine" and isinstance(settings, str):
        raise ValueError(
            f"{source}, but the engine's client cannot read {raw!r}: {settings}; "
            "use client='auto' (or 'obstore') to read it with obstore's client"
        )
    retry_free = raw if twin is None else twin
    if not isinstance(settings, str):
        return StoreReader(NativeBackend(retry_free, settings), policy, name, Route("engine", settings.reason))
    if twin is None:
        reason = f"{settings}; obstore's client, with obstore's own retries (a store insitubatch did not build)"
        return StoreReader(ObstoreBackend(raw, own_retries=True), policy, name, Route("obstore", reason))
    return StoreReader(ObstoreBackend(twin), policy, name, Route("obstore", settings))


def own_get_reader(store: Store, why: str = "") -> StoreReader:
    """A reader of ``store`` through its own ``get``, which retries by its own rules; stalls and hedging still apply."""
    reason = why or f"a {type(store).__name__}: read through its own get, which retries by its own rules"
    return StoreReader(StoreBackend(store), ReadPolicy(), None, Route("store", reason))


def obstore_local_reader(raw: Any) -> Callable[..., Any] | None:
    """A synchronous read of a local or in-memory obstore store's keys on the calling thread, else None."""
    if isinstance(raw, obstore.store.LocalStore) and raw.prefix is not None:
        return LocalFiles(raw)
    if isinstance(raw, (obstore.store.LocalStore, obstore.store.MemoryStore)):
        return functools.partial(obstore_get_sync, raw)
    return None


def read_by(store: Store) -> Store:
    """The store whose reads ``store`` passes on unchanged: inside every ``WrapperStore`` that defines no read.

    A wrapper that reads itself (zarr's ``LoggingStore`` logs each read) is
    read through its own ``get``, so it sees every read; one of ours (it
    carries its reader: an icechunk session's store) is read as it says.
    """
    stack = wrapper_stack(store)
    for wrapper, inner in zip(stack, stack[1:], strict=False):
        if isinstance(wrapper, CarriesReader):
            return wrapper
        own = (
            vars(klass)
            for klass in type(wrapper).__mro__
            if issubclass(klass, WrapperStore) and klass is not WrapperStore
        )
        if any(name in defined for defined in own for name in OWN_READS):
            return wrapper
        store = inner
    return store


def sync_get_of(store: Store) -> Callable[..., Any] | None:
    """zarr's own ``get_sync`` of a store that reads on the calling thread and whose ``get`` it matches, else None.

    A subclass that overrides ``get`` without a matching ``get_sync`` (a
    wrapping or fault-injecting store) is read through its ``get``.
    """
    if not isinstance(store, SupportsGetSync):
        return None
    if not isinstance(wrapper_stack(store)[-1], SupportsGetSync):  # a wrapper's get_sync calls the wrapped store's
        return None
    for klass in type(store).__mro__:  # the class that defines get must define get_sync too
        if "get" in vars(klass):
            return store.get_sync if "get_sync" in vars(klass) else None
    return None


class StoreAdapter(WrapperStore[Store]):
    """A store insitubatch did not build, as the engine reads it: every call delegated, plus a reader of its own.

    Made once, at the dataset's door (:func:`reading_store`). Behind zarr's
    plain ``ObjectStore`` over a remote obstore store the engine reads
    obstore's store directly (obstore's own retries on: no retry-free twin
    was built with it); a wrapper that defines no read passes on to what it
    wraps; a wrapper that reads itself, and any other store, is read through
    its own ``get``. :meth:`close` closes the adapter's reader, never the
    store it adapts.
    """

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.adapted = store
        self.held = HeldReader.of(self)

    def build_reader(self) -> StoreReader:
        inner = read_by(self.adapted)
        if isinstance(inner, CarriesReader):  # one of ours inside wrappers that pass every read on
            return inner.reader()
        if type(inner) is ObjectStore and isinstance(inner.store, REMOTE_OBSTORES):
            return obstore_reader(inner.store, None, resolve_client(None))
        return own_get_reader(inner)

    def reader(self) -> StoreReader:
        """The engine's reader of the adapted store (built once, until :meth:`close`)."""
        return self.held.get(self.build_reader)

    def local_reader(self) -> Callable[..., Any] | None:
        """A synchronous read on the calling thread for a store that reads there (files, memory), else None."""
        inner = self.adapted
        if isinstance(inner, CarriesReader):
            return inner.local_reader()
        if type(inner) is ObjectStore:
            return obstore_local_reader(inner.store)
        return sync_get_of(inner)

    def close(self) -> None:
        """Close the engine's connections to the adapted store; the store itself stays open (its owner closes it)."""
        self.held.close()

    def __enter__(self) -> StoreAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreAdapter({self.adapted!r})"


def reading_store(store: Store) -> CarriesReader:
    """``store`` if it carries its reader, else a :class:`StoreAdapter` of it (the dataset's door; the caller closes it)."""
    return store if isinstance(store, CarriesReader) else StoreAdapter(store)

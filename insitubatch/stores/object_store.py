"""The store ``obstore_store`` builds: zarr's ``ObjectStore`` carrying its settings and reader, and fork-safe.

See :class:`ForkSafeObjectStore`. In a process forked after obstore's
runtime started (``stores.obstore_runtime``) a local directory is read as
the plain files it is, a store the engine's own HTTP client can read
(plain HTTP(S), S3 with static keys or none) is read through it
(:class:`ReadsOnly`), and any other backend, or any other request
(listing, writing), refuses with :class:`~insitubatch.errors.ForkError`.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any

import obstore.store
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest
from zarr.buffer import default_buffer_prototype
from zarr.storage import LocalStore, ObjectStore

from .._wire.engine_client import native_backend
from .client_choice import resolve_client
from .obstore_runtime import obstore_usable, refuse_dead_obstore
from .read_policy import ReadPolicy, policy_for
from .reading import (
    LOCAL_ROUTE,
    REMOTE_OBSTORES,
    HeldReader,
    Route,
    StoreReader,
    endpoint_name,
    obstore_local_reader,
    obstore_reader,
    own_get_reader,
)

__all__ = ["ForkSafeObjectStore", "ReadsOnly"]


class ForkSafeObjectStore(ObjectStore[Any]):
    """The store ``obstore_store`` builds: zarr's ``ObjectStore`` that carries how the engine reads it.

    It carries its ``client=`` setting (``stores.client_choice``: ``client``
    is ``(choice, what set it)``, e.g. ``("engine", "client='engine'")``;
    ``None`` takes the process default when asked), the retry-free twin of
    its obstore store that the factory built from the same arguments
    (``twin``; ``None``: obstore's own retries stay on), its :attr:`route`,
    :attr:`policy` and :attr:`endpoint`, and the :meth:`reader` the engine
    reads it with, held until :meth:`close`, which closes the engine's
    connections and the store (also on leaving a ``with`` block).

    It never waits on obstore in a process forked after obstore's runtime
    started: there a local directory is read and written as files (zarr's
    ``LocalStore`` on the same directory: the keys obstore would map to
    files under it); a remote store the engine's own client can read is
    read through it (reads only); anything else raises :class:`ForkError`
    at its first request. Anywhere else every call is ``ObjectStore``'s own.
    """

    def __init__(
        self, store: Any, *, read_only: bool = False, client: tuple[str, str] | None = None, twin: Any = None
    ) -> None:
        super().__init__(store, read_only=read_only)
        self._client = client
        self.twin = twin
        self.held = HeldReader.of(self)

    @property
    def client_setting(self) -> tuple[str, str]:
        """``(choice, what set it)``: which HTTP client reads this store, as set when it was built, else the default."""
        return self._client if self._client is not None else resolve_client(None)

    @property
    def remote(self) -> bool:
        """Whether the engine reads this store over the network (else on the calling thread: files, memory)."""
        return isinstance(self.store, REMOTE_OBSTORES)

    @property
    def route(self) -> Route:
        """Which client reads this store and why (``describe()``, ``insitubatch inspect``)."""
        return self.reader().route if self.remote else LOCAL_ROUTE

    @property
    def policy(self) -> ReadPolicy:
        """The engine's retry bounds for this store, from its retry and client options."""
        return policy_for(self.store.retry_config, self.store.client_options) if self.remote else ReadPolicy()

    @property
    def endpoint(self) -> str | None:
        """The name the engine's link to this store is shared under (``None`` for a local or memory store)."""
        return endpoint_name(self.store) if self.remote else None

    def build_reader(self) -> StoreReader:
        return obstore_reader(self.store, self.twin, self.client_setting)

    def reader(self) -> StoreReader:
        """The engine's reader of this store: built on the first ask, held until :meth:`close`.

        A local or memory store is read on the calling thread (:meth:`local_reader`); asked for a reader, it
        gives one through its own ``get``, with nothing to hold or close.

        Raises
        ------
        ValueError
            The store's ``client`` setting is ``"engine"`` and the engine's client cannot read it.
        """
        if not self.remote:
            return own_get_reader(self, f"a {type(self.store).__name__}: read on the calling thread")
        return self.held.get(self.build_reader)

    def local_reader(self) -> Callable[..., Any] | None:
        """A synchronous read on the calling thread for a local directory or memory store, else None."""
        return obstore_local_reader(self.store)

    def with_read_only(self, read_only: bool = False) -> ForkSafeObjectStore:
        return type(self)(self.store, read_only=read_only, client=self._client, twin=self.twin)

    def close(self) -> None:
        """Close the engine's connections to this store, then the store (also on leaving a ``with`` block)."""
        self.held.close()
        super().close()

    def _instead(self) -> Any:
        """What serves requests in a process where obstore cannot answer (a store, or reads only); None where it can."""
        if obstore_usable():
            return None
        other = self.__dict__.get("_without_obstore")
        if other is None:
            raw = self.store
            if isinstance(raw, obstore.store.LocalStore) and raw.prefix is not None:
                other = LocalStore(str(raw.prefix), read_only=self.read_only)
            else:
                backend = native_backend(raw, raw) if isinstance(raw, REMOTE_OBSTORES) else None
                if backend is None:
                    refuse_dead_obstore(self)
                other = ReadsOnly(backend, str(self))
            self._without_obstore = other
        return other

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state.pop("_without_obstore", None)  # (a process it is unpickled in decides for itself)
        state.pop("held", None)  # (a reader's connections stay with the process that opened them)
        state["twin"] = pickle.dumps(self.twin)
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        state["twin"] = pickle.loads(state["twin"])
        super().__setstate__(state)
        self.held = HeldReader.of(self)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        other = self._instead()
        if other is None:
            return await super().get(key, prototype, byte_range)
        return await other.get(key, prototype, byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        other = self._instead()
        if other is None:
            return await super().get_partial_values(prototype, key_ranges)
        return await other.get_partial_values(prototype, key_ranges)

    async def exists(self, key: str) -> bool:
        other = self._instead()
        return await (super().exists(key) if other is None else other.exists(key))

    async def set(self, key: str, value: Buffer) -> None:
        other = self._instead()
        await (super().set(key, value) if other is None else other.set(key, value))

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        other = self._instead()
        await (super().set_if_not_exists(key, value) if other is None else other.set_if_not_exists(key, value))

    async def delete(self, key: str) -> None:
        other = self._instead()
        await (super().delete(key) if other is None else other.delete(key))

    async def delete_dir(self, prefix: str) -> None:
        other = self._instead()
        await (super().delete_dir(prefix) if other is None else other.delete_dir(prefix))

    async def getsize(self, key: str) -> int:
        other = self._instead()
        return await (super().getsize(key) if other is None else other.getsize(key))

    async def getsize_prefix(self, prefix: str) -> int:
        other = self._instead()
        return await (super().getsize_prefix(prefix) if other is None else other.getsize_prefix(prefix))

    async def list(self) -> AsyncGenerator[str, None]:
        other = self._instead()
        async for key in super().list() if other is None else other.list():
            yield key

    async def list_prefix(self, prefix: str) -> AsyncGenerator[str, None]:
        other = self._instead()
        async for key in super().list_prefix(prefix) if other is None else other.list_prefix(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncGenerator[str, None]:
        other = self._instead()
        async for key in super().list_dir(prefix) if other is None else other.list_dir(prefix):
            yield key


class ReadsOnly:
    """A remote store's reads through a backend that needs no obstore (the engine's own client); nothing else.

    One attempt per read, as zarr asks: a missing key is None, any other
    failure raises. Listing and writing need obstore and refuse.
    """

    def __init__(self, backend: Any, name: str) -> None:
        self.backend = backend
        self.name = name

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        try:
            data = await self.backend.request(key, byte_range)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if byte_range is not None or "status code: 416" not in str(exc):
                raise
            data = await self.backend.whole(key)  # an empty object, which no byte range can name
        return prototype.buffer.from_bytes(data)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(key, prototype, rng) for key, rng in key_ranges)))

    async def exists(self, key: str) -> bool:
        return await self.get(key, default_buffer_prototype()) is not None

    def __getattr__(self, name: str) -> Any:
        refuse_dead_obstore(f"{self.name} ({name})")
        raise AttributeError(name)

"""``RoutedStore``: a read-only zarr store whose keys live in other stores (or in small documents of its own).

The stores that make one dataset from many (``join_stores``, ``concat_stores``)
are zarr stores like any other, so the engine, the planner and zarr itself
read them through the one ``Store`` interface: a key is routed to the member
store that holds its bytes (under that store's own key), or answered with a
metadata document the routing store wrote itself. Each member keeps its own
client, credentials and retries: its own ``get`` reads its bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest, Store

from ...stores.byte_ranges import byte_span
from ...stores.reading import StoreReader, own_get_reader, reading_store

__all__ = ["Route", "RoutedStore", "close_with", "member_keys", "slice_bytes"]

# Where a key's bytes are: (member name, member store, key in it), or bytes the routing store holds itself.
Route = tuple[str, Store, str] | bytes | None


def slice_bytes(data: bytes, byte_range: ByteRequest | None) -> bytes:
    """``data`` cut to a zarr byte request (what a store returns for a ranged read)."""
    return data if byte_range is None else byte_span(byte_range).cut(data)


class RoutedStore(Store):
    """A read-only store over named member stores; subclasses say where each key is (``route``) and what to list.

    Parameters
    ----------
    members
        ``{name: Store}``: the stores read, in the order given.
    """

    def __init__(self, members: Mapping[str, Store]) -> None:
        super().__init__(read_only=True)
        self.members: dict[str, Store] = dict(members)
        self.opened: list[Store] = []  # the members it opened itself (from a URL or path): its close() closes them

    # -- what subclasses define ------------------------------------------------
    def route(self, key: str) -> Route:
        """Where ``key``'s bytes are: a member and its key, bytes of this store's own, or ``None`` (absent)."""
        raise NotImplementedError

    async def _member_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, as this store names them."""
        raise NotImplementedError

    def member_of_read(self, path: str, chunk: int) -> str:
        """The member whose bytes chunk ``chunk`` (along the sample axis) of array ``path`` is."""
        raise NotImplementedError

    # -- zarr's Store interface ---------------------------------------------------
    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        where = self.route(key)
        if where is None:
            return None
        if isinstance(where, bytes):
            return prototype.buffer.from_bytes(slice_bytes(where, byte_range))
        _, store, inner = where
        return await store.get(inner, prototype=prototype, byte_range=byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        where = self.route(key)
        if where is None:
            return False
        if isinstance(where, bytes):
            return True
        _, store, inner = where
        return await store.exists(inner)

    @property
    def supports_writes(self) -> bool:
        return False

    @property
    def supports_deletes(self) -> bool:
        return False

    @property
    def supports_listing(self) -> bool:
        return True

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()  # raises: write to a member store instead

    async def delete(self, key: str) -> None:
        self._check_writable()

    async def list(self) -> AsyncIterator[str]:
        for key in await self._member_keys(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await self._member_keys(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = prefix.rstrip("/")
        start = f"{prefix}/" if prefix else ""
        seen: set[str] = set()
        for key in await self._member_keys(start):
            child = key[len(start) :].split("/", 1)[0]
            if child and child not in seen:
                seen.add(child)
                yield child

    def sync_reader(self, resolve: Callable[[Store], Callable[..., Any] | None]) -> Callable[..., Any] | None:
        """A synchronous ``get`` routed as :meth:`get` is, when ``resolve`` gives one for every member, else ``None``.

        Local members are then read on the engine's decode threads, as each
        would be alone; one member that must be read asynchronously (a remote
        store, a wrapping store) keeps the whole store on the async path.
        """
        getters: dict[str, Callable[..., Any]] = {}
        for name, member in self.members.items():
            getter = resolve(member)
            if getter is None:
                return None
            getters[name] = getter

        def get(key: str, *, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Any:
            where = self.route(key)
            if where is None:
                return None
            if isinstance(where, bytes):
                return prototype.buffer.from_bytes(slice_bytes(where, byte_range))
            name, _, inner = where
            return getters[name](inner, prototype=prototype, byte_range=byte_range)

        return get

    def reader(self) -> StoreReader:
        """The engine's reader of this store: its own ``get``, each member read by its own client (nothing to close)."""
        return own_get_reader(self, f"a {type(self).__name__}: each member read through its own get")

    def local_reader(self) -> Callable[..., Any] | None:
        """A synchronous ``get`` when every member reads on the calling thread, else None (:meth:`sync_reader`)."""
        return self.sync_reader(lambda member: reading_store(member).local_reader())

    def __eq__(self, other: object) -> bool:
        return other is self

    __hash__ = object.__hash__

    def close(self) -> None:
        """Close this store and the members it opened; a member the caller gave stays open (its owner closes it)."""
        opened, self.opened = self.opened, []
        for member in opened:
            member.close()
        super().close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.members)})"


def close_with(routed: RoutedStore, given: Mapping[str, object]) -> None:
    """Have ``routed.close()`` close each member it opened from a URL or path (``given`` is what the caller gave)."""
    routed.opened.extend(member for name, member in routed.members.items() if not isinstance(given[name], Store))


async def member_keys(store: Store, prefix: str) -> list[str]:
    """Every key of ``store`` under ``prefix``."""
    return [k async for k in store.list_prefix(prefix)]

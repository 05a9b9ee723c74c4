"""Whether obstore can still answer in this process: its runtime's threads do not survive ``fork``.

obstore runs every request on a tokio runtime whose worker threads start
with the process's first request (one runtime for blocking calls, one for
async ones) and never stop. ``fork`` copies only the thread that forks, so a
child forked after its parent's first obstore request holds a runtime with
no workers: every request the child makes through obstore, on a store it
inherited or on one it builds anew, waits for ever (obstore 0.12: a parent's
blocking ``get`` leaves the child's blocking ``get`` hanging, an async one
its async ``get``; a parent that never sent a request leaves the child able
to). Python can neither restart that runtime nor ask whether it runs.

So at every fork the parent looks for the runtime's threads by name
(``os.register_at_fork``; Linux lists a process's threads and their names
under ``/proc/self/task``, and tokio names its threads ``tokio-...``), and the
child remembers what it found, for its own children too. Where the threads
cannot be listed, a fork is taken to have left the runtime dead: a clear
error, never a hang. :func:`refuse_dead_obstore` raises :class:`ForkError` at
a store's first use in such a child, before anything waits for an answer.

:class:`ForkSafeObjectStore`, the store ``obstore_store`` builds, is zarr's
``ObjectStore`` until then; in such a child a local directory is read as the
plain files it is (zarr's ``LocalStore`` over the same directory), a store
the engine's own HTTP client can read (plain HTTP(S), S3 with static keys or
none) is read through it (:func:`read_without_obstore`: the client registers
itself, from the layer above), and any other backend, or any other request
(listing, writing), refuses with :class:`ForkError`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any

from obstore.store import LocalStore as _ObstoreLocal
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest
from zarr.buffer import default_buffer_prototype
from zarr.storage import LocalStore, ObjectStore

from ..errors import ForkError
from .client_choice import resolve_client
from .owned import close_held

__all__ = ["FORK_WAY_OUT", "ForkSafeObjectStore", "obstore_usable", "read_without_obstore", "refuse_dead_obstore"]

# What a user does instead, named in every ForkError (the start methods that begin a fresh interpreter).
FORK_WAY_OUT = (
    'start the worker processes with multiprocessing.get_context("forkserver") or get_context("spawn") '
    '(torch: DataLoader(..., multiprocessing_context="spawn")), or create the pool before the parent reads'
)
# The name tokio gives its runtime's threads (worker and blocking ones), as Linux shows it in ``comm``.
_TOKIO_THREAD_PREFIX = b"tokio-"
_TASKS = "/proc/self/task"

_runtime_at_fork = False  # set in the parent just before a fork, read by the child
_dead = False  # this process was forked after obstore's runtime started (in it or in an ancestor)
# What builds a reader of an obstore store's keys that needs no obstore (None where it cannot read that store):
# the engine's own HTTP client, which registers itself here (``_wire.engine_client``, a layer above this one).
_reader_factories: list[Callable[[Any], Any]] = []


def read_without_obstore(factory: Callable[[Any], Any]) -> None:
    """Register ``factory(raw)``: a backend with ``request(key, byte_range)`` and ``whole(key)`` futures, or None."""
    _reader_factories.append(factory)


def _runtime_threads() -> bool:
    """Whether this process runs threads of a tokio runtime (True when they cannot be listed)."""
    try:
        tasks = os.listdir(_TASKS)
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"{_TASKS}/{task}/comm", "rb") as f:
                if f.read().startswith(_TOKIO_THREAD_PREFIX):
                    return True
        except OSError:  # the thread ended while we looked
            continue
    return False


def _before_fork() -> None:
    global _runtime_at_fork
    _runtime_at_fork = _runtime_threads()


def _in_child() -> None:
    global _dead
    _dead = _dead or _runtime_at_fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)


def obstore_usable() -> bool:
    """False in a process forked after obstore's runtime started (there, obstore never answers)."""
    return not _dead


def refuse_dead_obstore(store: object, key: str | None = None) -> None:
    """Raise :class:`ForkError` naming ``store`` (and ``key``) if obstore cannot answer in this process; else nothing.

    Cheap where obstore answers (one flag), so the engine checks it on every request it sends through obstore.

    Raises
    ------
    ForkError
        This process was forked after obstore's runtime started in its parent.
    """
    if _dead:
        what = f"the store {store}" if key is None else f"reading {key!r} from {store}"
        raise ForkError(
            f"{what} needs obstore, which cannot answer in this process: it was forked (a fork "
            "multiprocessing start method, or os.fork) after its parent had read through obstore, and "
            "obstore's runtime threads do not survive fork. To read here, "
            f"{FORK_WAY_OUT}"
        )


class ForkSafeObjectStore(ObjectStore[Any]):
    """zarr's ``ObjectStore``, that never waits on obstore in a process forked after obstore's runtime started.

    There a local directory is read and written as files (zarr's
    ``LocalStore`` on the same directory: the keys obstore would map to
    files under it); a remote store the engine's own client can read is
    read through it (reads only); anything else raises :class:`ForkError`
    at its first request. Anywhere else every call is ``ObjectStore``'s own.

    The store carries its ``client=`` setting (``stores.client_choice``):
    ``client`` is ``(choice, what set it)``, e.g. ``("engine",
    "client='engine'")``; ``None`` takes the process default when asked.
    """

    def __init__(self, store: Any, *, read_only: bool = False, client: tuple[str, str] | None = None) -> None:
        super().__init__(store, read_only=read_only)
        self._client = client

    @property
    def client_setting(self) -> tuple[str, str]:
        """``(choice, what set it)``: which HTTP client reads this store, as set when it was built, else the default."""
        return self._client if self._client is not None else resolve_client(None)

    def with_read_only(self, read_only: bool = False) -> ForkSafeObjectStore:
        return type(self)(self.store, read_only=read_only, client=self._client)

    def close(self) -> None:
        """Close the engine's connections to this store, then the store (also on leaving a ``with`` block)."""
        close_held(self)
        super().close()

    def _instead(self) -> Any:
        """What serves requests in a process where obstore cannot answer (a store, or reads only); None where it can."""
        if not _dead:
            return None
        other = self.__dict__.get("_without_obstore")
        if other is None:
            raw = self.store
            if isinstance(raw, _ObstoreLocal) and raw.prefix is not None:
                other = LocalStore(str(raw.prefix), read_only=self.read_only)
            else:
                backend = next(filter(None, (make(raw) for make in _reader_factories)), None)
                if backend is None:
                    refuse_dead_obstore(self)
                other = _ReadsOnly(backend, str(self))
            self._without_obstore = other
        return other

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state.pop("_without_obstore", None)  # (a process it is unpickled in decides for itself)
        return state

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


class _ReadsOnly:
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

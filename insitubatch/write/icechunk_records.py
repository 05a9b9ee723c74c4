"""Claim and coverage records inside an icechunk session: what a slot writer on a fork reads and writes.

On icechunk a slot writer works in a session of its own (a fork of the
coordinator's, ``write.icechunk``), so its records are part of its
transaction: the coverage of a slot is committed with the slot's chunks or
not at all, and a claim, created and deleted inside one fork, never reaches
a snapshot. Nobody else sees a fork before it is merged, so "atomic"
create-if-absent only has to hold between the threads of this process (a
writer and its heartbeat, or writers sharing a fork): one lock serializes them.
"""

from __future__ import annotations

import threading

from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype

from .._zarr_compat import sync

__all__ = ["IcechunkRecords"]

# One lock for every icechunk session's records in this process: nobody outside it sees a fork before it is merged.
_LOCK = threading.Lock()


async def _keys(store: Store, prefix: str) -> list[str]:
    # icechunk lists only below a node that exists (a group or an array), and refuses any other prefix
    if not await store.exists(f"{prefix}zarr.json"):
        return []
    return [key async for key in store.list_prefix(prefix)]


class IcechunkRecords:
    """Records as group documents in an icechunk session's store; versions are the documents' bytes.

    The operations of ``records._Backend``, which ``records`` picks it for.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = _LOCK
        self._buffer = default_buffer_prototype().buffer

    def _get(self, key: str) -> bytes | None:
        found = sync(self._store.get(key, default_buffer_prototype()))
        return None if found is None else found.to_bytes()

    def _set(self, key: str, data: bytes) -> None:
        sync(self._store.set(key, self._buffer.from_bytes(data)))

    def create(self, key: str, data: bytes) -> object | None:
        with self._lock:
            if self._get(key) is not None:
                return None
            self._set(key, data)
        return data

    def read(self, key: str) -> tuple[bytes, object] | None:
        with self._lock:
            data = self._get(key)
        return None if data is None else (data, data)

    def replace(self, key: str, data: bytes, expected: object) -> object | None:
        with self._lock:
            if self._get(key) != expected:
                return None
            self._set(key, data)
        return data

    def overwrite(self, key: str, data: bytes) -> object:
        with self._lock:
            self._set(key, data)
        return data

    def delete(self, key: str) -> None:
        with self._lock:
            if self._get(key) is not None:
                sync(self._store.delete(key))

    def keys_under(self, prefix: str) -> list[str]:
        with self._lock:
            return sync(_keys(self._store, prefix.rstrip("/") + "/"))

"""Which stores the engine's decode threads read themselves, on the calling thread: the store says so.

A local directory or memory store has no latency to overlap, so the
decode thread reads its own tile: no hop to zarr's loop, the store's
runtime or a ``to_thread`` worker and back. Every store insitubatch builds
answers ``local_reader()`` (a store of several: when every member does);
any other store is asked through its adapter (``stores.reading``). Network
stores keep the async path (a blocking read would hold a decode thread for
a round trip), and so does a wrapping store whose reads must go through its
``get``. What a local directory returns is a view of the calling thread's
reused buffer (``stores.local_files.LocalFiles``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zarr.abc.store import Store

from ..stores.reading import reading_store

__all__ = ["sync_get"]


def sync_get(store: Store) -> Callable[..., Any] | None:
    """A synchronous ``get(key, prototype=..., byte_range=...)`` for a store that reads on the calling thread, else None."""
    return reading_store(store).local_reader()

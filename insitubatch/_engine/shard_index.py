"""Shard indexes: where each inner chunk of a shard lies, read once per shard with a ranged GET and kept.

A sharded array whose tiles are inner chunks (``ArrayGeometry.sharded_reads``)
needs its shard's index before it can fetch an inner chunk by byte range.
One ``ShardIndexes`` per dataset holds every index it has read (16 bytes per
inner chunk, a term of the memory plan), so each shard's index costs one
GET however many passes, epochs and selections read it; concurrent
requests for one index wait for the same read.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest

from ..errors import BadChunkError
from ..io.decode import _ShardStage
from ..io.direct import ChunkData, _as_uint8, _DecodeFailure

__all__ = ["ShardIndex", "ShardIndexes", "index_request"]

# what a shard's index entries cost held: an offset and a length per inner chunk
INDEX_ENTRY_BYTES = 16


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index: per inner chunk its byte range, or absent (read as the fill value)."""

    offsets: np.ndarray
    lengths: np.ndarray
    present: np.ndarray

    def span(self, place: tuple[int, ...]) -> tuple[int, int] | None:
        """``(start, stop)`` bytes of the inner chunk at ``place``, or None when it was never written."""
        if not self.present[place]:
            return None
        start = int(self.offsets[place])
        return start, start + int(self.lengths[place])

    @property
    def nbytes(self) -> int:
        return int(self.present.size) * INDEX_ENTRY_BYTES


def index_request(stage: _ShardStage) -> ByteRequest:
    """The byte range that holds a shard's index: its first or its last ``index_nbytes``."""
    if stage.index_at_start:
        return RangeByteRequest(0, stage.index_nbytes)
    return SuffixByteRequest(stage.index_nbytes)


def _parse(stage: _ShardStage, key: str, data: ChunkData) -> ShardIndex:
    try:
        offsets, lengths, present = stage.read_index(_as_uint8(data), None)
    except _DecodeFailure as exc:
        raise BadChunkError(f"cannot read the shard index of key {key!r}: {exc}") from exc.__cause__
    # copies: the index may be a view of a read buffer its reader reuses
    return ShardIndex(np.array(offsets, dtype=np.uint64), np.array(lengths, dtype=np.uint64), np.array(present))


@dataclass(eq=False)
class ShardIndexes:
    """Every shard index a dataset has read, by store key; ``None`` records a shard that does not exist."""

    _held: dict[str, ShardIndex | None] = field(default_factory=dict)
    _loading: dict[str, asyncio.Future] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    gets: int = 0
    get_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes the held indexes occupy (their entries)."""
        with self._lock:
            return sum(i.nbytes for i in self._held.values() if i is not None)

    def _keep(self, key: str, data: ChunkData | None, stage: _ShardStage) -> ShardIndex | None:
        index = None if data is None else _parse(stage, key, data)
        with self._lock:
            self.gets += 1
            self.get_bytes += 0 if data is None else len(data)
            self._held[key] = index
        return index

    def read_sync(self, key: str, stage: _ShardStage, get: Callable[..., ChunkData | None]) -> ShardIndex | None:
        """Any thread: the index of shard ``key``, read with the blocking ``get(key, byte_range=...)`` the first time."""
        with self._lock:
            if key in self._held:
                return self._held[key]
        return self._keep(key, get(key, byte_range=index_request(stage)), stage)

    async def read(
        self, key: str, stage: _ShardStage, fetch: Callable[[str, ByteRequest], Awaitable[Any]]
    ) -> ShardIndex | None:
        """Loop: the index of shard ``key``, fetched once with ``await fetch(key, byte_range)``; others wait for it."""
        with self._lock:
            if key in self._held:
                return self._held[key]
            pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            index = self._keep(key, await fetch(key, index_request(stage)), stage)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failure nobody else awaited is not logged
            raise
        finally:
            self._loading.pop(key, None)
        future.set_result(index)
        return index

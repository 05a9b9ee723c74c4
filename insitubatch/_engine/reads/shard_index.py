"""Shard indexes: where each inner chunk of a shard lies, read once per shard with a ranged GET and kept.

A damaged index (its checksum) raises ``_DecodeFailure`` for every inner
chunk read through it; a damaged entry, only for its own inner chunk.

A sharded array whose tiles are inner chunks (``ArrayGeometry.sharded_reads``)
needs its shard's index before it can fetch an inner chunk by byte range.
One ``ShardIndexes`` per dataset holds every index it has read (16 bytes per
inner chunk, a term of the memory plan), so each shard's index costs one
GET however many passes, epochs and selections read it; concurrent
requests for one index wait for the same read.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest

from ...errors import BadChunkError
from ...io.chain import _ABSENT, INDEX_ENTRY_BYTES, INDEX_HALF_EMPTY, INDEX_OUTSIDE, _ShardStage
from ...io.decode import ChunkDecoder
from ...io.direct import ChunkData, _as_uint8, _DecodeFailure
from ...io.geometry import ArrayGeometry
from ...plan.epoch import EpochPlan
from ...plan.first_use import admission_order
from .reader import ArrayReader

__all__ = [
    "ShardIndex",
    "ShardIndexes",
    "check_span",
    "index_request",
    "plan_shards",
    "prefetch",
    "read_inner_chunk",
]


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index: per inner chunk its byte range, or absent (read as the fill value), or damaged."""

    offsets: np.ndarray
    lengths: np.ndarray
    problems: np.ndarray  # INDEX_OK, or why an entry cannot be read (its inner chunk is a bad chunk)

    def span(self, place: tuple[int, ...]) -> tuple[int, int] | None:
        """``(start, stop)`` bytes of the inner chunk at ``place``, or None when it was never written.

        Raises ``_DecodeFailure`` for a damaged entry.
        """
        problem = int(self.problems[place])
        if problem == INDEX_HALF_EMPTY:
            raise _DecodeFailure(f"shard index entry {place} is half empty")
        offset, length = int(self.offsets[place]), int(self.lengths[place])
        if problem == INDEX_OUTSIDE:
            raise _DecodeFailure(
                f"shard index entry {place} (offset {offset}, length {length}) points outside the shard's data bytes"
            )
        if offset == _ABSENT:
            return None
        return offset, offset + length

    @property
    def nbytes(self) -> int:
        return int(self.problems.size) * INDEX_ENTRY_BYTES


def index_request(stage: _ShardStage) -> ByteRequest:
    """The byte range that holds a shard's index: its first or its last ``index_nbytes``."""
    if stage.index_at_start:
        return RangeByteRequest(0, stage.index_nbytes)
    return SuffixByteRequest(stage.index_nbytes)


def _parse(stage: _ShardStage, data: ChunkData) -> ShardIndex:
    """The index (copied out of ``data``, a read buffer its reader may reuse); raises ``_DecodeFailure``."""
    return ShardIndex(*stage.read_index(_as_uint8(data)))


@dataclass(eq=False)
class ShardIndexes:
    """Every shard index a dataset has read, by store key; ``None`` records a shard that does not exist."""

    _held: dict[str, ShardIndex | None] = field(default_factory=dict)
    _broken: dict[str, str] = field(default_factory=dict)  # indexes that did not decode, with why
    _loading: dict[str, asyncio.Future] = field(default_factory=dict)
    _reading: dict[str, threading.Event] = field(default_factory=dict)  # read_sync's reads under way
    _lock: threading.Lock = field(default_factory=threading.Lock)
    gets: int = 0
    get_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes the held indexes occupy (their entries)."""
        with self._lock:
            return sum(i.nbytes for i in self._held.values() if i is not None)

    def known(self) -> dict[str, ShardIndex | None]:
        """The indexes read so far, by shard key (``None``: the shard does not exist)."""
        with self._lock:
            return dict(self._held)

    def _keep(self, key: str, data: ChunkData | None, stage: _ShardStage) -> ShardIndex | None:
        with self._lock:
            self.gets += 1
            self.get_bytes += 0 if data is None else len(data)
        try:
            index = None if data is None else _parse(stage, data)
        except _DecodeFailure as exc:
            with self._lock:
                self._broken[key] = str(exc)  # not read again: every inner chunk of it is a bad chunk
            raise
        with self._lock:
            self._held[key] = index
        return index

    def _known(self, key: str) -> tuple[bool, ShardIndex | None]:
        """Under the lock: whether ``key``'s index was read, and it; a broken one raises again."""
        if key in self._broken:
            raise _DecodeFailure(self._broken[key])
        return key in self._held, self._held.get(key)

    def read_sync(self, key: str, stage: _ShardStage, get: Callable[..., ChunkData | None]) -> ShardIndex | None:
        """Any thread: the index of shard ``key``, read with the blocking ``get(key, byte_range=...)`` the first time.

        Threads asking at once read it once: the others wait for that read.
        """
        while True:
            with self._lock:
                known, index = self._known(key)
                if known:
                    return index
                reading = self._reading.get(key)
                if reading is None:
                    reading = self._reading[key] = threading.Event()
                    break
            reading.wait()  # (a failed read leaves the key unknown: the next waiter tries it itself)
        try:
            return self._keep(key, get(key, byte_range=index_request(stage)), stage)
        finally:
            with self._lock:
                del self._reading[key]
            reading.set()

    async def read(
        self,
        key: str,
        stage: _ShardStage,
        fetch: Callable[[str, ByteRequest], Awaitable[Any]],
        permits: Any = None,
        ticket: int | None = None,
        background: bool = False,
    ) -> ShardIndex | None:
        """Loop: the index of shard ``key``, fetched once with ``await fetch(key, byte_range)``; others wait for it.

        With ``permits`` (a ``window.WindowUser``) the read that fetches takes
        one, in ``ticket`` order, or with ``background`` only one no other read waits for; a
        caller that finds the index being read waits without one, and reads
        it itself if that read is cancelled (its pass closed).
        """
        while True:
            with self._lock:
                known, index = self._known(key)
                pending = self._loading.get(key)
            if known:
                return index
            if pending is not None:
                answer = await _outcome_of(pending)
                if answer is _CANCELLED:
                    continue
                return answer
            if permits is None:
                return await self._fetch(key, stage, fetch, None)
            await (permits.acquire_idle() if background else permits.acquire(ticket))
            with self._lock:  # read, or being read, meanwhile
                meanwhile = key in self._loading or key in self._held or key in self._broken
            if meanwhile:
                permits.release()
                continue
            return await self._fetch(key, stage, fetch, permits)

    async def _fetch(
        self, key: str, stage: _ShardStage, fetch: Callable[..., Awaitable[Any]], held: Any
    ) -> ShardIndex | None:
        """Fetch and keep the index; ``held``: the permits this read holds one of, given back when it ends."""
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
            if held is not None:
                held.release()
        future.set_result(index)
        return index


_CANCELLED = object()


async def _outcome_of(pending: asyncio.Future) -> Any:
    """Another read's index (or its error); ``_CANCELLED`` when that read was cancelled and this task was not."""
    try:
        return await asyncio.shield(pending)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if pending.cancelled() and (task is None or not task.cancelling()):
            return _CANCELLED
        raise


def check_span(decoder: ChunkDecoder, coord: Any, span: tuple[int, int], buf: ChunkData | None) -> ChunkData:
    """An inner chunk's bytes as read by range: exactly ``span``'s length, else a bad chunk naming where it points."""
    got = 0 if buf is None else len(buf)
    if buf is None or got != span[1] - span[0]:
        raise decoder._bad(
            coord,
            f"the shard index points at bytes [{span[0]}, {span[1]}) and the store returned {got}: "
            "the entry points outside the shard",
        )
    return buf


async def read_inner_chunk(
    indexes: ShardIndexes,
    stage: _ShardStage,
    decoder: ChunkDecoder,
    coord: Any,
    get_range: Callable[[str, ByteRequest], Awaitable[Any]],
    get_index: Callable[[str, ByteRequest], Awaitable[Any]] | None = None,
) -> ChunkData | BadChunkError | None:
    """Loop: the bytes of the inner chunk at tile ``coord`` (None: never written), after its shard's index.

    ``get_index`` reads the index, if not with ``get_range``.

    Bytes found bad (a damaged index or entry, a short range) come back as
    the ``BadChunkError`` a decode job treats as a bad tile; a store failure
    raises.
    """
    stored, place = decoder.geometry.tile_key(coord)
    assert place is not None  # sharded reads place every tile in its shard
    try:
        index = await indexes.read(stored, stage, get_index or get_range)
        span = None if index is None else index.span(place)
    except _DecodeFailure as exc:
        return decoder._bad(coord, str(exc))
    if span is None:
        return None  # the shard, or this inner chunk of it, was never written
    try:
        return check_span(decoder, coord, span, await get_range(stored, RangeByteRequest(*span)))
    except BadChunkError as exc:
        return exc


def _shard_rows(g: ArrayGeometry, tiles: Sequence[int], chunks: Iterable[int]) -> Iterator[list[str]]:
    """Per chunk of ``chunks``, the keys of the shards it reads for tiles ``tiles``."""
    axis = g.sample_axis
    per = [s // c for s, c in zip(g.stored_chunks, g.tile_chunks)]
    field = sorted({tuple(c // p for c, p in zip(g.tile_coord(t), per[:axis] + per[axis + 1 :])) for t in tiles})
    for c in chunks:
        row = int(c) // per[axis]
        yield [g.chunk_key((*f[:axis], row, *f[axis:])) for f in field]


def plan_shards(
    plan: EpochPlan,
    readers: Mapping[str, ArrayReader],
    stages: Mapping[str, _ShardStage],
    first_block: int,
    last_block: int | None = None,
) -> list[tuple[str, _ShardStage]]:
    """The shards whose indexes the reads of blocks ``first_block`` to ``last_block`` need, each once, in first use.

    ``readers`` are the sharded sources (by source), ``stages`` their shard
    stages (by array path); ``last_block=None`` runs to the plan's end.
    First use is by block, then by the order the pass admits the block's
    reads (``plan.first_use.admission_order``): a block's shards of every source come
    before the next block's, and the first block's in its first batch's
    order.
    """
    order = admission_order(plan, first_block)
    if last_block is not None:
        order = [i for i in order if plan.read_first[i] <= last_block]
    position = {i: at for at, i in enumerate(order)}
    wanted: dict[str, tuple[int, int, str, _ShardStage]] = {}
    for source, r in readers.items():
        mine = [i for i in order if plan.reads[i][0] == source]
        rows = _shard_rows(r.geometry, r.layout.tiles, (plan.reads[i][1] for i in mine))
        for i, keys in zip(mine, rows):
            block = max(first_block, int(plan.read_first[i]))
            for key in keys:
                wanted.setdefault(key, (block, position[i], key, stages[r.geometry.path]))
    return [(key, stage) for _, _, key, stage in sorted(wanted.values(), key=lambda w: w[:2])]


async def prefetch(
    indexes: ShardIndexes,
    wanted: Sequence[tuple[str, _ShardStage]],
    get_range: Callable[[str, ByteRequest], Awaitable[Any]],
    permits: Any,
    concurrency: int,
) -> None:
    """Loop: read the indexes of ``wanted`` shards, in order, ``concurrency`` at a time, ahead of their tiles.

    Reading ahead is background work: each read takes one of the pass's
    read ``permits`` (a ``window.WindowUser``) only when no other read
    waits for one, so the first batches' reads go first and later shards'
    indexes fill the permits they leave idle; a tile whose index is not in
    yet reads it itself. Failures are left for those tiles to meet and report.
    """
    pending = iter(wanted)

    async def worker() -> None:
        for key, stage in pending:
            with contextlib.suppress(Exception):
                await indexes.read(key, stage, get_range, permits, background=True)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))

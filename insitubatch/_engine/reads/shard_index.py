"""Shard indexes: where each inner chunk of a shard lies, read with a ranged GET and held within a budget.

A damaged index (its checksum; a shard shorter than its index, the store
answering its read with 416) raises ``DecodeFailure`` for every inner chunk
read through it; a damaged entry, only for its own inner chunk.

A sharded array whose tiles are inner chunks (``ArrayGeometry.sharded_reads``)
needs its shard's index before it can fetch an inner chunk by byte range.
One ``ShardIndexes`` per dataset holds, per split, the indexes that split's
passes read (``SplitIndexes``: 17 bytes per inner chunk and about a KB an
index, at most ``SHARD_INDEX_BUDGET_BYTES`` a split, a term of the memory plan), so a
shard's index costs one GET however many passes, epochs and selections of
the split read it while it is held; one let go is read again when next
needed. Concurrent requests for one index wait for the same read.

A held index is of one version of its shard: the index read records the
shard's ``ETag`` (``IndexSlot.tag``; a local file's inode, size and
mtime; None where the store sends none or a weak one, or tells none, as a
zarr store's own ``get``), and every inner chunk read through it is
conditional on it (``If-Match``). A shard rewritten since,
by another writer or between epochs, answers 412: its slot is let go
(``SplitIndexes.let_go``), the index read again and the inner chunks read
through the new one, once; a shard that changed again meanwhile makes
them bad chunks ("the shard kept changing"). Without a tag, inner chunks
are read through the held index as they are, whatever the shard became.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest

from ...io.chain import ABSENT, INDEX_HALF_EMPTY, INDEX_OUTSIDE, ShardStage
from ...io.decode import ChunkDecoder
from ...io.direct import ChunkData, DecodeFailure, as_uint8
from ...io.geometry import ArrayGeometry
from ...plan.epoch import EpochPlan
from ...plan.first_use import admission_order
from ...stores.read_policy import http_status
from .reader import ArrayReader

__all__ = [
    "HELD_ENTRY_BYTES",
    "HELD_INDEX_OVERHEAD_BYTES",
    "SHARD_INDEX_BUDGET_BYTES",
    "IndexSlot",
    "ShardIndex",
    "ShardIndexes",
    "SplitIndexes",
    "check_span",
    "held_index_bytes",
    "index_request",
    "plan_shards",
    "prefetch",
    "unsatisfiable",
]

# The status a store answers a range that starts past an object's end with (RFC 9110 15.5.17).
RANGE_NOT_SATISFIABLE = 416
# How a weak ETag begins (RFC 9110 8.8.3): If-Match compares strongly, so no weak tag ever matches.
WEAK_TAG = "W/"


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index: per inner chunk its byte range, or absent (read as the fill value), or damaged."""

    offsets: np.ndarray
    lengths: np.ndarray
    problems: np.ndarray  # INDEX_OK, or why an entry cannot be read (its inner chunk is a bad chunk)

    def span(self, place: tuple[int, ...]) -> tuple[int, int] | None:
        """``(start, stop)`` bytes of the inner chunk at ``place``, or None when it was never written.

        Raises ``DecodeFailure`` for a damaged entry.
        """
        problem = int(self.problems[place])
        if problem == INDEX_HALF_EMPTY:
            raise DecodeFailure(f"shard index entry {place} is half empty")
        offset, length = int(self.offsets[place]), int(self.lengths[place])
        if problem == INDEX_OUTSIDE:
            raise DecodeFailure(
                f"shard index entry {place} (offset {offset}, length {length}) points outside the shard's data bytes"
            )
        if offset == ABSENT:
            return None
        return offset, offset + length

    @property
    def nbytes(self) -> int:
        """Bytes its entries take in memory (``HELD_ENTRY_BYTES`` per inner chunk)."""
        return int(self.offsets.nbytes + self.lengths.nbytes + self.problems.nbytes)


def index_request(stage: ShardStage) -> ByteRequest:
    """The byte range that holds a shard's index: its first or its last ``index_nbytes``."""
    if stage.index_at_start:
        return RangeByteRequest(0, stage.index_nbytes)
    return SuffixByteRequest(stage.index_nbytes)


def unsatisfiable(exc: BaseException) -> bool:
    """Whether a shard's read failed with 416: the range starts past the shard's end (the shard, not the store, is bad)."""
    return http_status(exc) == RANGE_NOT_SATISFIABLE


def _parse(stage: ShardStage, data: ChunkData) -> ShardIndex:
    """The index (copied out of ``data``, a read buffer its reader may reuse); raises ``DecodeFailure``."""
    return ShardIndex(*stage.read_index(as_uint8(data)))


# The most bytes of shard indexes one split's passes hold (``held_index_bytes`` each): past it the least
# recently used are let go, and read again when a pass next needs them. 32 MiB holds the indexes of about
# two million inner chunks: every index of most archives, a bounded share of the largest.
SHARD_INDEX_BUDGET_BYTES = 32 << 20
# Memory one held index takes per inner chunk: its offset and length (8 bytes each) and a problem flag (1).
HELD_ENTRY_BYTES = 17
# Memory one held index takes besides its entries: its three arrays' headers, the index, its slot and key in
# the split's cache (tracemalloc: about 740 bytes on CPython 3.11 and numpy 2, tests/test_memory.py; rounded up).
HELD_INDEX_OVERHEAD_BYTES = 1024


def held_index_bytes(stage: ShardStage) -> int:
    """Memory one held index of ``stage``'s shards takes: what the budget and the memory plan count for it."""
    return math.prod(stage.grid) * HELD_ENTRY_BYTES + HELD_INDEX_OVERHEAD_BYTES


@dataclass(eq=False)
class IndexSlot:
    """One shard's place in a split's index cache: not read yet, being read, read (``index``), or broken.

    A tile that will need the index holds its slot from the moment its pass
    admits it, so an index let go meanwhile is still read (once) for it.
    """

    key: str
    stage: ShardStage
    read: bool = False
    index: ShardIndex | None = None  # None once read: the shard does not exist
    broken: str | None = None  # why the index did not decode: every inner chunk of it is a bad chunk
    tag: str | None = None  # the shard's ETag when its index was read (None: the store sent none)
    loading: asyncio.Future | None = None  # the loop's read under way
    reading: threading.Event | None = None  # a blocking read under way (``read_sync``)

    def known(self) -> tuple[bool, ShardIndex | None]:
        """Under the cache's lock: whether the index was read, and it; a broken one raises again."""
        if self.broken is not None:
            raise DecodeFailure(self.broken)
        return self.read, self.index


@dataclass(eq=False)
class SplitIndexes:
    """The shard indexes one split's passes hold: at most ``budget_bytes`` of entries, least recently used out.

    Which indexes are held, and so which a pass reads, depends only on the
    order its tiles are admitted (``touch``), never on when a read lands:
    ``reads.shard_runs.pass_reads`` replays that order to predict the GETs.
    """

    budget_bytes: int = field(default_factory=lambda: SHARD_INDEX_BUDGET_BYTES)
    _slots: collections.OrderedDict[str, IndexSlot] = field(default_factory=collections.OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    held_bytes: int = 0  # ``held_index_bytes`` of the slots held (read or not): at most the budget, or one slot
    gets: int = 0
    get_bytes: int = 0
    evictions: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes the entries of the indexes read and held take (without ``HELD_INDEX_OVERHEAD_BYTES`` each)."""
        with self._lock:
            return sum(s.index.nbytes for s in self._slots.values() if s.index is not None)

    def held(self) -> list[tuple[str, int]]:
        """``(shard key, entry bytes)`` of the slots held, least recently used first (``shard_runs.index_gets``)."""
        with self._lock:
            return [(key, held_index_bytes(slot.stage)) for key, slot in self._slots.items()]

    def known(self) -> dict[str, ShardIndex | None]:
        """The indexes read and held, by shard key (``None``: the shard does not exist)."""
        with self._lock:
            return {k: s.index for k, s in self._slots.items() if s.read}

    def touch(self, key: str, stage: ShardStage) -> IndexSlot:
        """Any thread: the slot of shard ``key``, now the most recently used; a new one (to read) if none is held.

        Holding a new slot past the budget lets go of the least recently
        used others (their holders still read and use them).
        """
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                self._slots.move_to_end(key)
                return slot
            slot = self._slots[key] = IndexSlot(key, stage)
            self.held_bytes += held_index_bytes(stage)
            while self.held_bytes > self.budget_bytes and len(self._slots) > 1:
                _, old = self._slots.popitem(last=False)
                self.held_bytes -= held_index_bytes(old.stage)
                self.evictions += 1
            return slot

    def let_go(self, key: str, tag: str) -> None:
        """Any thread: shard ``key`` is no longer version ``tag``: a held index of that version is let go, and the
        next ``touch`` reads the index anew.

        (One read again since, of another version, stays: of several reads
        that met the change, the first lets the index go.)
        """
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None and slot.read and slot.tag == tag:
                del self._slots[key]
                self.held_bytes -= held_index_bytes(slot.stage)

    def _keep(
        self, slot: IndexSlot, data: ChunkData | None | BaseException, tag: str | None = None
    ) -> ShardIndex | None:
        """The index read as ``data`` (of the shard at ETag ``tag``), kept in ``slot``; a read refused with 416
        (``unsatisfiable``) broke it."""
        if isinstance(data, BaseException) and not unsatisfiable(data):
            raise data
        with self._lock:
            self.gets += 1
            self.get_bytes += 0 if data is None or isinstance(data, BaseException) else len(data)
        try:
            if isinstance(data, BaseException):
                n = slot.stage.index_nbytes
                raise DecodeFailure(
                    f"the shard is shorter than its {n}-byte index: the store answered its read with 416"
                )
            index = None if data is None else _parse(slot.stage, data)
        except DecodeFailure as exc:
            with self._lock:
                slot.broken = str(exc)  # not read again: every inner chunk of it is a bad chunk
            raise
        if tag is not None and tag.startswith(WEAK_TAG):
            tag = None  # never matched by If-Match (a strong comparison): reads through it go unconditional
        with self._lock:
            slot.index, slot.tag, slot.read = index, tag, True
        return index

    def read_sync(self, slot: IndexSlot, get: Callable[..., tuple[ChunkData | None, str | None]]) -> ShardIndex | None:
        """Any thread: ``slot``'s index, read with the blocking ``get(key, byte_range=...)`` the first time.

        ``get`` returns the bytes and the shard's version tag (or None).

        Threads asking at once read it once: the others wait for that read.
        """
        while True:
            with self._lock:
                known, index = slot.known()
                if known:
                    return index
                reading = slot.reading
                if reading is None:
                    reading = slot.reading = threading.Event()
                    break
            reading.wait()  # (a failed read leaves the slot unread: the next waiter tries it itself)
        try:
            tag = None
            try:
                data: ChunkData | None | BaseException
                data, tag = get(slot.key, byte_range=index_request(slot.stage))
            except Exception as exc:
                data = exc
            return self._keep(slot, data, tag)
        finally:
            with self._lock:
                slot.reading = None
            reading.set()

    async def read(
        self,
        slot: IndexSlot,
        fetch: Callable[[str, ByteRequest], Awaitable[tuple[Any, str | None]]],
        permits: Any = None,
        ticket: int | None = None,
        background: bool = False,
    ) -> ShardIndex | None:
        """Loop: ``slot``'s index, fetched once with ``await fetch(key, byte_range)`` (its bytes and the shard's
        ETag, or None); others wait for it.

        With ``permits`` (a ``window.WindowUser``) the read that fetches takes
        one, in ``ticket`` order, or with ``background`` only one no other read waits for; a
        caller that finds the index being read waits without one, and reads
        it itself if that read is cancelled (its pass closed).
        """
        while True:
            with self._lock:
                known, index = slot.known()
                pending = slot.loading
            if known:
                return index
            if pending is not None:
                answer = await _outcome_of(pending)
                if answer is _CANCELLED:
                    continue
                return answer
            if permits is None:
                return await self._fetch(slot, fetch, None)
            await (permits.acquire_idle() if background else permits.acquire(ticket))
            with self._lock:  # read, or being read, meanwhile
                meanwhile = slot.loading is not None or slot.read or slot.broken is not None
            if meanwhile:
                permits.release()
                continue
            return await self._fetch(slot, fetch, permits)

    async def _fetch(self, slot: IndexSlot, fetch: Callable[..., Awaitable[Any]], held: Any) -> ShardIndex | None:
        """Fetch and keep the index; ``held``: the permits this read holds one of, given back when it ends."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        slot.loading = future
        try:
            tag = None
            try:
                data: ChunkData | None | BaseException
                data, tag = await fetch(slot.key, index_request(slot.stage))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                data = exc
            index = self._keep(slot, data, tag)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failure nobody else awaited is not logged
            raise
        finally:
            slot.loading = None
            if held is not None:
                held.release()
        future.set_result(index)
        return index


@dataclass(eq=False)
class ShardIndexes:
    """A dataset's shard indexes: each split's passes hold their own (``SplitIndexes``), within its budget.

    Splits apart, the indexes a split's pass reads depend on that split's
    passes alone, whichever split ran before (a shard two splits share is
    read once for each).
    """

    budget_bytes: int = field(default_factory=lambda: SHARD_INDEX_BUDGET_BYTES)
    _splits: dict[str, SplitIndexes] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, split: str) -> SplitIndexes:
        """The indexes ``split``'s passes hold (made on first use)."""
        with self._lock:
            held = self._splits.get(split)
            if held is None:
                held = self._splits[split] = SplitIndexes(self.budget_bytes)
            return held

    def _all(self) -> list[SplitIndexes]:
        with self._lock:
            return list(self._splits.values())

    @property
    def gets(self) -> int:
        """Index GETs every split's passes (and the warm-up) sent."""
        return sum(s.gets for s in self._all())

    @property
    def get_bytes(self) -> int:
        return sum(s.get_bytes for s in self._all())

    @property
    def nbytes(self) -> int:
        """Bytes the entries of every split's held indexes take."""
        return sum(s.nbytes for s in self._all())

    def known(self) -> dict[str, ShardIndex | None]:
        """Every index read and held by any split, by shard key (a shard's layout is the same for all)."""
        out: dict[str, ShardIndex | None] = {}
        for s in self._all():
            out.update(s.known())
        return out


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
        raise decoder.bad_chunk(
            coord,
            f"the shard index points at bytes [{span[0]}, {span[1]}) and {got} of them could be read: "
            "the entry points outside the shard",
        )
    return buf


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
    stages: Mapping[str, ShardStage],
    first_block: int,
    last_block: int | None = None,
) -> list[tuple[str, ShardStage]]:
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
    wanted: dict[str, tuple[int, int, str, ShardStage]] = {}
    for source, r in readers.items():
        mine = [i for i in order if plan.reads[i][0] == source]
        rows = _shard_rows(r.geometry, r.layout.tiles, (plan.reads[i][1] for i in mine))
        for i, keys in zip(mine, rows):
            block = max(first_block, int(plan.read_first[i]))
            for key in keys:
                wanted.setdefault(key, (block, position[i], key, stages[r.geometry.path]))
    return [(key, stage) for _, _, key, stage in sorted(wanted.values(), key=lambda w: w[:2])]


async def prefetch(
    indexes: SplitIndexes,
    slots: Sequence[IndexSlot],
    get_range: Callable[[str, ByteRequest], Awaitable[tuple[Any, str | None]]],
    permits: Any,
    concurrency: int,
) -> None:
    """Loop: read the indexes of ``slots``, in order, ``concurrency`` at a time, ahead of their tiles.

    Reading ahead is background work: each read takes one of the pass's
    read ``permits`` (a ``window.WindowUser``) only when no other read
    waits for one, so the first batches' reads go first and later shards'
    indexes fill the permits they leave idle; a tile whose index is not in
    yet reads it itself. Failures are left for those tiles to meet and report.
    """
    pending = iter(slots)

    async def worker() -> None:
        for slot in pending:
            with contextlib.suppress(Exception):
                await indexes.read(slot, get_range, permits, background=True)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))

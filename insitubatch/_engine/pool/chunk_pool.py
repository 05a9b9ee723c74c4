"""``ChunkPool``: residency and cache in one object, under a byte budget.

An entry holds one read (an array path's sample-axis chunk): its decoded
tiles, adopted by reference. Entries are pinned while a pass still needs them
and evicted least-recently-used once unpinned and the budget needs room.
Every open iteration is an owner with its own reservation (its working set)
and counters; the pool keeps the cumulative totals.

An entry in flight is fetched by one owner (``fetcher``) but may be pinned by
several. When the fetcher closes first, the entry is handed to an owner that
still pins it, whose listener fetches it again (``OwnerListener.adopted``): no iteration ever
waits on a fetch nobody is doing.

An evicted entry whose tiles the engine decoded itself (``Entry.recyclable``)
gives them to ``FreeTiles``, where the decode threads take their destination
(``take_tile``). The list never holds more than the pending entries still
await (bytes the budget already counts but no tile occupies yet, kept as a
running sum), so tiles plus free list stay within the budget.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from ...errors import InSituError
from ...plan.epoch import ReadKey
from ..stats import PoolTotals
from .entry import FAILED, PENDING, READY, Entry, EntryState, Owner, OwnerListener
from .free_tiles import FreeTiles

__all__ = ["FAILED", "PENDING", "READY", "ChunkPool", "Entry", "EntryState", "Owner", "OwnerListener"]

logger = logging.getLogger("insitubatch")


class ChunkPool:
    """Byte-budgeted entries with pin/unpin and LRU eviction of unpinned entries.

    ``budget=None`` is the automatic budget: the sum of the open owners'
    working sets, so each iteration open at once (``zip(ds.train, ds.val)``,
    ``ds.infer()`` beside a pass) adds its own working set, as
    ``insitubatch inspect --iterations N`` prints. Growing past one
    iteration's working set is logged (a WARNING naming the bytes), never
    silent. An explicit budget that cannot hold a new owner's working set
    next to the others makes ``open_owner`` raise.
    """

    def __init__(self, budget: int | None = None, on_evict: Callable[[Entry], None] | None = None) -> None:
        # ``budget`` is a positive int or None: the dataset's door checked ``cache_budget_bytes``
        self.explicit_budget = None if budget is None else int(budget)
        self.budget = self.explicit_budget or 0
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self._entries: OrderedDict[ReadKey, Entry] = OrderedDict()
        self._owners: dict[int, Owner] = {}
        self._ids = itertools.count(1)
        self.resident_bytes = 0
        self.totals = PoolTotals()
        self.on_evict = on_evict
        self.free = FreeTiles()
        self.awaited_bytes = 0  # the pending entries' ``awaited``, summed

    # -- owners ------------------------------------------------------------
    def open_owner(
        self, working_set_bytes: int, read_ahead_bound: int, extra_bytes: int = 0, extra_reads: int = 0, reads: int = 0
    ) -> Owner:
        """Register an iteration of ``reads`` reads; raise if an explicit budget cannot hold its working set.

        ``extra_bytes`` / ``extra_reads`` is read-ahead beyond the working set
        (``max_inflight="auto"`` on a remote store), granted in full under the
        automatic budget and as far as it fits under an explicit one.
        """
        with self.lock:
            reserved = sum(o.reservation for o in self._owners.values())
            if self.explicit_budget is not None and extra_bytes > 0:
                room = max(0, self.explicit_budget - reserved - working_set_bytes)
                extra_reads = extra_reads * min(room, extra_bytes) // extra_bytes
                extra_bytes = min(room, extra_bytes)
            working_set_bytes += extra_bytes
            read_ahead_bound += extra_reads
            need = reserved + working_set_bytes
            if self.explicit_budget is None:
                if self._owners and need > self.budget:
                    logger.warning(
                        "insitubatch: %d iterations open at once: the automatic pool budget grows from %d to %d "
                        "bytes (the sum of their working sets; `insitubatch inspect --iterations %d` prints this "
                        "bound); pass cache_budget_bytes to cap it, then an iteration that does not fit raises",
                        len(self._owners) + 1,
                        self.budget,
                        need,
                        len(self._owners) + 1,
                    )
                self.budget = max(self.budget, need)
            elif need > self.explicit_budget:
                others = (
                    f" next to {len(self._owners)} open iteration(s) reserving {reserved} bytes" if self._owners else ""
                )
                raise ValueError(
                    f"cache_budget_bytes={self.explicit_budget} cannot hold this iteration's working set of "
                    f"{working_set_bytes} bytes{others}; raise cache_budget_bytes to at least {need} "
                    f"or lower block_chunks"
                )
            owner = Owner(
                id=next(self._ids),
                reservation=working_set_bytes,
                read_limit=max(read_ahead_bound, 1),
                entries=[None] * reads,
            )
            owner.counters.trace.read_limit = owner.read_limit  # the read-ahead window the pass's stats judge by
            self._owners[owner.id] = owner
            return owner

    def close_owner(self, owner: Owner) -> list[Entry]:
        """Drop every pin ``owner`` holds, and its entries list; return its in-flight entries nobody else needs (to cancel).

        Call it once the owner's own fetches are stopped. An in-flight entry it
        was fetching that another owner still pins is reset and handed over:
        the adopter becomes its fetcher and its listener re-admits it.
        """
        abandoned: list[Entry] = []
        adopted: list[tuple[Owner, Entry]] = []
        with self.lock:
            if owner.closed:
                return abandoned
            owner.closed = True
            owner.entries = [None] * len(owner.entries)  # rebound: a consumer still gathering keeps its copy
            for entry in list(self._entries.values()):
                if owner.id in entry.pins:
                    del entry.pins[owner.id]
                if entry.state != PENDING or entry.fetcher != owner.id:
                    continue
                adopter = next((self._owners[i] for i in entry.pins if i in self._owners), None)
                if adopter is None:
                    abandoned.append(entry)
                    self._drop(entry)
                else:
                    entry.tiles = [None] * entry.n_tiles  # rebound: a finishing decode thread keeps its copy
                    entry.remaining = entry.n_tiles
                    self.awaited_bytes += entry.nbytes - entry.awaited
                    entry.awaited = entry.nbytes
                    entry.bad_records = []
                    entry.fetcher = adopter.id
                    adopted.append((adopter, entry))
            self._owners.pop(owner.id, None)
            if self.explicit_budget is None:
                self.budget = max(sum(o.reservation for o in self._owners.values()), self._pinned_bytes())
            self.cond.notify_all()
        for adopter, entry in adopted:
            if adopter.listener is not None:
                adopter.listener.adopted(entry)
            else:  # an owner that cannot fetch: its waiters get an error, never a hang
                self.fail(
                    entry,
                    InSituError(
                        f"array {entry.key[0]!r} chunk {entry.key[1]} was being fetched by an iteration that closed, "
                        "and the iteration still waiting on it cannot fetch"
                    ),
                )
        return abandoned

    def kept_for_others(self, key: ReadKey, owner: Owner) -> bool:
        """Whether an entry of ``key`` lives on past ``owner``: its disk-cache mapping is not ``owner``'s to drop.

        True when another owner fetches the entry or still pins it (it will be handed over).
        """
        with self.lock:
            entry = self._entries.get(key)
            return entry is not None and (entry.fetcher != owner.id or any(i != owner.id for i in entry.pins))

    def _pinned_bytes(self) -> int:
        return sum(s.nbytes for s in self._entries.values() if s.pinned)

    # -- admission (event-loop side) ------------------------------------------
    def can_take(self, owner: Owner, nbytes: int, reads: int = 1) -> bool:
        """Whether ``owner`` has read-ahead room for ``reads`` more reads of ``nbytes`` in all."""
        with self.lock:
            return self._can_take(owner, nbytes, reads)

    def _can_take(self, owner: Owner, nbytes: int, reads: int = 1) -> bool:
        return (
            owner.pinned_bytes + nbytes <= owner.reservation and owner.pinned_reads + reads <= owner.read_limit
        ) or owner.pinned_reads == 0

    def pin_existing(self, key: ReadKey, owner: Owner) -> Entry | None:
        """Pin a resident or in-flight entry for ``owner``; ``None`` if it must be fetched."""
        with self.lock:
            return self._pin_existing(key, owner)

    def _pin_existing(self, key: ReadKey, owner: Owner) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None or entry.state == FAILED:
            return None
        self._pin(entry, owner)
        self._entries.move_to_end(key)
        if entry.state == READY:
            owner.counters.hits += 1
            self.totals.hits += 1
        else:
            owner.counters.joins += 1
        return entry

    def admit(
        self, key: ReadKey, nbytes: int, origins: np.ndarray, owner: Owner, recyclable: bool = False
    ) -> Entry | None:
        """Reserve room for a new pending entry pinned by ``owner``; ``None`` if the budget is full of pins.

        ``recyclable``: the fetcher decodes every tile into memory it owns
        (no transform output, no disk-cache mapping), so the tiles may be
        reused once the entry is evicted.
        """
        with self.lock:
            return self._admit(key, nbytes, origins, owner, recyclable)

    def claim(
        self, key: ReadKey, nbytes: int, origins: np.ndarray, owner: Owner, recyclable: bool, index: int
    ) -> tuple[Entry | None, bool]:
        """Read ``index`` of ``owner``'s pass under one lock: ``can_take``, then ``pin_existing``, else ``admit``.

        Returns ``(entry, admitted)``, or ``(None, False)`` while ``owner``
        must wait for room. The entry is stored at ``owner.entries[index]``
        under the same lock (a consumer waiting on ``cond`` reads it there),
        and a ready one wakes the consumer.
        """
        with self.lock:
            if owner.closed or not self._can_take(owner, nbytes):  # closed: its driver is being cancelled
                return None, False
            entry = self._pin_existing(key, owner)
            admitted = entry is None
            if entry is None and (entry := self._admit(key, nbytes, origins, owner, recyclable)) is None:
                return None, False
            owner.entries[index] = entry
            if entry.state != PENDING:  # a pending entry wakes the consumer when it lands
                self.cond.notify_all()
            return entry, admitted

    def _admit(self, key: ReadKey, nbytes: int, origins: np.ndarray, owner: Owner, recyclable: bool) -> Entry | None:
        if not self._make_room(nbytes):
            return None
        n_tiles = len(origins)
        entry = Entry(
            key=key,
            nbytes=nbytes,
            n_tiles=n_tiles,
            origins=origins,
            tiles=[None] * n_tiles,
            remaining=n_tiles,
            fetcher=owner.id,
            recyclable=recyclable,
            awaited=nbytes,
        )
        self._entries[key] = entry
        self.awaited_bytes += nbytes
        self.resident_bytes += nbytes
        self.totals.peak_resident_bytes = max(self.totals.peak_resident_bytes, self.resident_bytes)
        self._pin(entry, owner)
        owner.counters.misses += 1
        self.totals.misses += 1
        return entry

    def _make_room(self, nbytes: int) -> bool:
        if self.resident_bytes + nbytes <= self.budget:
            return True
        victims = []
        free = self.budget - self.resident_bytes
        for entry in self._entries.values():  # oldest first
            if free >= nbytes:
                break
            if not entry.pinned and entry.state != PENDING:
                victims.append(entry)
                free += entry.nbytes
        if free < nbytes:
            return False
        # free tiles the pending reads (this one too) will decode into: no more than they await
        room = self.awaited_bytes + nbytes - self.free.nbytes
        for entry in victims:
            tiles = entry.tiles
            self._drop(entry)
            self.totals.evictions += 1
            if entry.recyclable and entry.state == READY:
                room = self.free.keep(tiles, room)
        return True

    def _settle(self, entry: Entry) -> None:
        """An entry stops awaiting tiles (ready, failed or dropped): out of ``awaited_bytes`` (lock held)."""
        self.awaited_bytes -= entry.awaited
        entry.awaited = 0

    def _landed(self, entry: Entry, tile_index: int, tile: object) -> None:
        """A tile took its place in a pending entry (lock held)."""
        if entry.tiles[tile_index] is None:
            entry.remaining -= 1
            if isinstance(tile, np.ndarray):  # a bad tile's mark holds no memory
                owed = min(tile.nbytes, entry.awaited)
                entry.awaited -= owed
                self.awaited_bytes -= owed
        entry.tiles[tile_index] = cast("np.ndarray", tile)  # or a bad tile's mark, until the chunk is assembled

    def _drop(self, entry: Entry) -> None:
        """Forget an entry and let go of its tiles at once (only unpinned or unfinished entries are dropped).

        The tiles list is rebound, not cleared in place, so a decode thread
        still finishing an abandoned entry keeps the list it copied.
        """
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
            self._settle(entry)
            self.resident_bytes -= entry.nbytes
            if self.on_evict is not None and entry.state == READY:
                self.on_evict(entry)
            entry.tiles = [None] * entry.n_tiles

    def take_tile(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` to decode into: a recycled tile when one fits, else new.

        Its contents are stale: the caller overwrites every element.
        """
        with self.lock:
            tile = self.free.take(shape, dtype)
            if tile is not None:
                self.totals.recycled_tiles += 1
                return tile
        return np.empty(shape, dtype=dtype)

    def _pin(self, entry: Entry, owner: Owner) -> None:
        entry.pins[owner.id] = entry.pins.get(owner.id, 0) + 1
        owner.pinned_bytes += entry.nbytes
        owner.pinned_reads += 1

    # -- delivery (decode side) ---------------------------------------------
    def deliver(self, entry: Entry, tile_index: int, tile: np.ndarray) -> None:
        """Adopt a decoded tile by reference; the entry is ready once every tile landed."""
        self.deliver_many(((entry, tile_index, tile),))

    def deliver_many(self, landed: Sequence[tuple[Entry, int, np.ndarray]]) -> None:
        """``deliver`` for several ``(entry, tile_index, tile)`` under one lock, with one wake-up.

        A decode job that placed a group of tiles lands them together, so the
        consumer waiting on ``cond`` is woken once per group, not per tile.
        """
        if not landed:
            return
        ready = False
        with self.lock:
            for entry, tile_index, tile in landed:
                if entry.state != PENDING:
                    continue
                if entry.recyclable and tile.base is not None:  # a view of another array: not the engine's own
                    entry.recyclable = False
                self._landed(entry, tile_index, tile)
                if entry.remaining == 0:
                    entry.state = READY
                    self._settle(entry)
                    ready = True
            if ready:
                self.cond.notify_all()

    def stage(self, entry: Entry, tile_index: int, tile: object) -> bool:
        """Hold a tile of an entry finished as a whole (assembled, transformed or persisted); True for its last."""
        with self.lock:
            if entry.state != PENDING:  # finished or failed meanwhile (a late tile of a handed-over fetch)
                return False
            self._landed(entry, tile_index, tile)
            return entry.remaining == 0

    def replace_tiles(
        self, entry: Entry, tiles: list[np.ndarray], origins: np.ndarray, revived_for: Owner | None = None
    ) -> bool:
        """Swap an entry's tiles for an assembled/transformed version and mark it ready.

        ``revived_for``: the tiles came from the disk cache for that owner, counted
        as its hit under the same lock, so a consumer that saw the data sees the count.
        Returns False when the entry was abandoned or failed meanwhile (the tiles are not adopted).
        """
        with self.lock:
            if entry.state != PENDING or self._entries.get(entry.key) is not entry:
                return False
            if revived_for is not None:
                self._count_revival(revived_for)
            entry.tiles = list(tiles)
            entry.recyclable = False  # assembled, transformed or mapped: not memory the decode owns
            entry.origins = origins
            entry.n_tiles = len(tiles)
            entry.remaining = 0
            entry.state = READY
            self._settle(entry)
            self.cond.notify_all()
            return True

    def _count_revival(self, owner: Owner) -> None:
        """A miss in memory served from the disk cache: a hit for the pass, not a fetch (lock held)."""
        owner.counters.misses -= 1
        owner.counters.hits += 1
        owner.counters.revived += 1
        self.totals.misses -= 1
        self.totals.hits += 1

    def fail(self, entry: Entry, error: BaseException) -> None:
        """Mark an entry failed (its waiters raise ``error``) and forget it so a later pass retries."""
        with self.lock:
            if entry.state == FAILED:
                return
            entry.state = FAILED
            entry.error = error
            self._settle(entry)
            self._drop(entry)
            self.cond.notify_all()

    # -- consumer side ---------------------------------------------------------
    def unpin(self, entry: Entry, owner: Owner) -> None:
        with self.lock:
            n = entry.pins.get(owner.id, 0)
            if n == 0:
                return
            if n == 1:
                del entry.pins[owner.id]
            else:
                entry.pins[owner.id] = n - 1
            owner.pinned_bytes -= entry.nbytes
            owner.pinned_reads -= 1
        if owner.listener is not None:
            owner.listener.room_freed()

    def contains(self, key: ReadKey) -> bool:
        with self.lock:
            s = self._entries.get(key)
            return s is not None and s.state == READY

    def __len__(self) -> int:
        with self.lock:
            return len(self._entries)

    def clear(self) -> None:
        """Drop every unpinned entry and the recycled tiles."""
        with self.lock:
            for entry in [s for s in self._entries.values() if not s.pinned]:
                self._drop(entry)
            self.free.clear()

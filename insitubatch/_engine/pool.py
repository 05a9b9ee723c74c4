"""``ChunkPool``: residency and cache in one object, under a byte budget.

A slot holds one read (an array path's sample-axis chunk): its decoded
tiles, adopted by reference. Slots are pinned while a pass still needs them
and evicted least-recently-used once unpinned and the budget needs room.
Every open iteration is an owner with its own reservation (its working set)
and counters; the pool keeps the cumulative totals.

A slot in flight is fetched by one owner (``fetcher``) but may be pinned by
several. When the fetcher closes first, the slot is handed to an owner that
still pins it, which fetches it again (``Owner.refetch``): no iteration ever
waits on a fetch nobody is doing.

An evicted slot whose tiles the engine decoded itself (``Slot.recyclable``)
and nobody else references gives them to a small free list keyed by shape
and dtype; the decode threads take their destination from it
(``take_tile``), so a pass past its budget reuses the same pages instead of
faulting in fresh ones and fragmenting the heap. The list never holds more
than the pending slots still await (bytes the budget already counts but no
tile occupies yet), so tiles plus free list stay within the budget.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import InSituError
from ..plan.epoch import ReadKey
from .stats import PassCounters, PoolTotals

__all__ = ["ChunkPool", "Owner", "Slot"]

# a slot's life: tiles arriving, every tile placed, or the fetch/decode failed (``Slot.error``)
SlotState = Literal["pending", "ready", "failed"]
PENDING: SlotState = "pending"
READY: SlotState = "ready"
FAILED: SlotState = "failed"
# references to a tile that only the free-list check itself holds: the tiles
# list it was taken from, the loop variable and getrefcount's argument
_OWN_TILE_REFS = 3
# ... and to that tiles list: ``_make_room``'s local name, ``_recycle``'s parameter and getrefcount's argument
_OWN_LIST_REFS = 3

logger = logging.getLogger("insitubatch")


@dataclass(eq=False)
class Slot:
    """One resident read: a chunk's tiles (sample axis first) and where each sits in the field."""

    key: ReadKey
    nbytes: int
    n_tiles: int
    origins: np.ndarray
    tiles: list[np.ndarray | None]
    state: SlotState = PENDING
    error: BaseException | None = None
    remaining: int = 0
    pins: dict[int, int] = field(default_factory=dict)
    fetcher: int | None = None
    # tiles replaced under on_bad_chunk="nan" (the driver's records), listed again by every pass that hits it
    bad_records: list = field(default_factory=list)
    # its tiles are arrays the engine decoded into (never a transform's output or a
    # disk-cache mapping): once evicted and unreferenced they may be reused
    recyclable: bool = False

    @property
    def pinned(self) -> bool:
        return bool(self.pins)

    @property
    def bad(self) -> bool:
        return bool(self.bad_records)


@dataclass(eq=False)
class Owner:
    """One open iteration inside a pool: its reservation, pinned bytes and counters."""

    id: int
    reservation: int
    read_limit: int
    pinned_bytes: int = 0
    pinned_reads: int = 0
    counters: PassCounters = field(default_factory=PassCounters)
    wake: Callable[[], object] | None = None
    # re-admit a slot this owner adopted from an owner that closed mid-fetch (called off the lock)
    refetch: Callable[[Slot], object] | None = None
    closed: bool = False


class ChunkPool:
    """Byte-budgeted slots with pin/unpin and LRU eviction of unpinned slots.

    ``budget=None`` is the automatic budget: the sum of the open owners'
    working sets, so each iteration open at once (``zip(ds.train, ds.val)``,
    ``ds.infer()`` beside a pass) adds its own working set, as
    ``insitubatch inspect --iterations N`` prints. Growing past one
    iteration's working set is logged (a WARNING naming the bytes), never
    silent. An explicit budget that cannot hold a new owner's working set
    next to the others makes ``open_owner`` raise.
    """

    def __init__(self, budget: int | None = None, on_evict: Callable[[Slot], None] | None = None) -> None:
        if budget is not None and (not isinstance(budget, (int, np.integer)) or budget <= 0):
            raise ValueError(f"cache_budget_bytes={budget!r} must be a positive int or None (auto: the working set)")
        self.explicit_budget = None if budget is None else int(budget)
        self.budget = self.explicit_budget or 0
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self._slots: OrderedDict[ReadKey, Slot] = OrderedDict()
        self._owners: dict[int, Owner] = {}
        self._ids = itertools.count(1)
        self.resident_bytes = 0
        self.totals = PoolTotals()
        self.on_evict = on_evict
        self._free: dict[tuple[tuple[int, ...], np.dtype], list[np.ndarray]] = {}
        self.free_bytes = 0
        self._pending: list[Slot] = []  # admitted slots, pruned of those no longer pending when read

    # -- owners ------------------------------------------------------------
    def open_owner(self, working_set_bytes: int, read_ahead_bound: int) -> Owner:
        """Register an iteration; raise if an explicit budget cannot hold its working set."""
        with self.lock:
            reserved = sum(o.reservation for o in self._owners.values())
            need = reserved + working_set_bytes
            if self.explicit_budget is None:
                if self._owners and need > self.budget:
                    logger.warning(
                        "insitubatch: %d iterations open at once: the automatic pool budget grows from %d to %d "
                        "bytes (the sum of their working sets; `insitubatch inspect --iterations %d` prints this "
                        "bound); pass cache_budget_bytes to cap it, then an iteration that does not fit raises",
                        len(self._owners) + 1, self.budget, need, len(self._owners) + 1,
                    )
                self.budget = max(self.budget, need)
            elif need > self.explicit_budget:
                others = f" next to {len(self._owners)} open iteration(s) reserving {reserved} bytes" if self._owners else ""
                raise ValueError(
                    f"cache_budget_bytes={self.explicit_budget} cannot hold this iteration's working set of "
                    f"{working_set_bytes} bytes{others}; raise cache_budget_bytes to at least {need} "
                    f"or lower block_chunks"
                )
            owner = Owner(id=next(self._ids), reservation=working_set_bytes, read_limit=max(read_ahead_bound, 1))
            self._owners[owner.id] = owner
            return owner

    def close_owner(self, owner: Owner) -> list[Slot]:
        """Drop every pin ``owner`` holds; return its in-flight slots nobody else needs (to cancel).

        Call it once the owner's own fetches are stopped. An in-flight slot it
        was fetching that another owner still pins is reset and handed over:
        the adopter becomes its fetcher and its ``refetch`` re-admits it.
        """
        abandoned: list[Slot] = []
        adopted: list[tuple[Owner, Slot]] = []
        with self.lock:
            if owner.closed:
                return abandoned
            owner.closed = True
            for slot in list(self._slots.values()):
                if owner.id in slot.pins:
                    del slot.pins[owner.id]
                if slot.state != PENDING or slot.fetcher != owner.id:
                    continue
                adopter = next((self._owners[i] for i in slot.pins if i in self._owners), None)
                if adopter is None:
                    abandoned.append(slot)
                    self._drop(slot)
                else:
                    slot.tiles = [None] * slot.n_tiles  # rebound: a finishing decode thread keeps its copy
                    slot.remaining = slot.n_tiles
                    slot.bad_records = []
                    slot.fetcher = adopter.id
                    adopted.append((adopter, slot))
            self._owners.pop(owner.id, None)
            if self.explicit_budget is None:
                self.budget = max(sum(o.reservation for o in self._owners.values()), self._pinned_bytes())
            self.cond.notify_all()
        for adopter, slot in adopted:
            if adopter.refetch is not None:
                adopter.refetch(slot)
            else:  # an owner that cannot fetch: its waiters get an error, never a hang
                self.fail(slot, InSituError(
                    f"array {slot.key[0]!r} chunk {slot.key[1]} was being fetched by an iteration that closed, "
                    "and the iteration still waiting on it cannot fetch"
                ))
        return abandoned

    def kept_for_others(self, key: ReadKey, owner: Owner) -> bool:
        """Whether a slot of ``key`` lives on past ``owner``: its disk-cache mapping is not ``owner``'s to drop.

        True when another owner fetches the slot or still pins it (it will be handed over).
        """
        with self.lock:
            slot = self._slots.get(key)
            return slot is not None and (slot.fetcher != owner.id or any(i != owner.id for i in slot.pins))

    def _pinned_bytes(self) -> int:
        return sum(s.nbytes for s in self._slots.values() if s.pinned)

    # -- admission (event-loop side) ------------------------------------------
    def can_take(self, owner: Owner, nbytes: int) -> bool:
        """Whether ``owner`` has read-ahead room for one more read of ``nbytes``."""
        with self.lock:
            return (
                owner.pinned_bytes + nbytes <= owner.reservation and owner.pinned_reads + 1 <= owner.read_limit
            ) or owner.pinned_reads == 0

    def pin_existing(self, key: ReadKey, owner: Owner) -> Slot | None:
        """Pin a resident or in-flight slot for ``owner``; ``None`` if it must be fetched."""
        with self.lock:
            slot = self._slots.get(key)
            if slot is None or slot.state == FAILED:
                return None
            self._pin(slot, owner)
            self._slots.move_to_end(key)
            if slot.state == READY:
                owner.counters.hits += 1
                self.totals.hits += 1
            else:
                owner.counters.joins += 1
            return slot

    def admit(self, key: ReadKey, nbytes: int, origins: np.ndarray, owner: Owner,
              recyclable: bool = False) -> Slot | None:
        """Reserve room for a new pending slot pinned by ``owner``; ``None`` if the budget is full of pins.

        ``recyclable``: the fetcher decodes every tile into memory it owns
        (no transform output, no disk-cache mapping), so the tiles may be
        reused once the slot is evicted.
        """
        with self.lock:
            if not self._make_room(nbytes):
                return None
            n_tiles = len(origins)
            slot = Slot(key=key, nbytes=nbytes, n_tiles=n_tiles, origins=origins,
                        tiles=[None] * n_tiles, remaining=n_tiles, fetcher=owner.id, recyclable=recyclable)
            self._slots[key] = slot
            self._pending.append(slot)
            self.resident_bytes += nbytes
            self.totals.peak_resident_bytes = max(self.totals.peak_resident_bytes, self.resident_bytes)
            self._pin(slot, owner)
            owner.counters.misses += 1
            self.totals.misses += 1
            return slot

    def _make_room(self, nbytes: int) -> bool:
        if self.resident_bytes + nbytes <= self.budget:
            return True
        victims = []
        free = self.budget - self.resident_bytes
        for slot in self._slots.values():  # oldest first
            if free >= nbytes:
                break
            if not slot.pinned and slot.state != PENDING:
                victims.append(slot)
                free += slot.nbytes
        if free < nbytes:
            return False
        # free tiles the pending reads (this one too) will decode into: no more than they await
        room = self._awaited_bytes() + nbytes - self.free_bytes
        for slot in victims:
            tiles = slot.tiles
            self._drop(slot)
            self.totals.evictions += 1
            if slot.recyclable and slot.state == READY:
                room = self._recycle(tiles, room)
        return True

    def _awaited_bytes(self) -> int:
        """Bytes the pending slots count against the budget that no landed tile occupies yet (lock held)."""
        self._pending = [s for s in self._pending if s.state == PENDING and self._slots.get(s.key) is s]
        return sum(s.nbytes - sum(t.nbytes for t in s.tiles if isinstance(t, np.ndarray)) for s in self._pending)

    def _drop(self, slot: Slot) -> None:
        """Forget a slot and let go of its tiles at once (only unpinned or unfinished slots are dropped).

        The tiles list is rebound, not cleared in place, so a decode thread
        still finishing an abandoned slot keeps the list it copied.
        """
        if self._slots.get(slot.key) is slot:
            del self._slots[slot.key]
            self.resident_bytes -= slot.nbytes
            if self.on_evict is not None and slot.state == READY:
                self.on_evict(slot)
            slot.tiles = [None] * slot.n_tiles

    def _recycle(self, tiles: list[np.ndarray | None], room: int) -> int:
        """Keep up to ``room`` bytes of an evicted slot's tiles for reuse; returns the room left (lock held).

        Only tiles provably referenced by nobody else are kept.

        A ready slot's tiles are read only by gathers of the passes that pin
        it, so once it is unpinned the references counted here are the only
        ones; the count is checked anyway (a view, a tensor or an exported
        buffer of a tile holds a reference to it), and a tile that does not
        own its memory is never kept.
        """
        if sys.getrefcount(tiles) > _OWN_LIST_REFS:
            return room  # someone still holds the list itself
        for tile in tiles:
            if (tile is None or tile.base is not None or not tile.flags.owndata or not tile.flags.writeable
                    or tile.nbytes > room or sys.getrefcount(tile) > _OWN_TILE_REFS):
                continue
            room -= tile.nbytes
            self._free.setdefault((tile.shape, tile.dtype), []).append(tile)
            self.free_bytes += tile.nbytes
        return room

    def take_tile(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` to decode into: a recycled tile when one fits, else new.

        Its contents are stale: the caller overwrites every element.
        """
        with self.lock:
            free = self._free.get((shape, dtype))
            if free:
                tile = free.pop()
                self.free_bytes -= tile.nbytes
                self.totals.recycled_tiles += 1
                return tile
        return np.empty(shape, dtype=dtype)

    def _pin(self, slot: Slot, owner: Owner) -> None:
        slot.pins[owner.id] = slot.pins.get(owner.id, 0) + 1
        owner.pinned_bytes += slot.nbytes
        owner.pinned_reads += 1

    # -- delivery (decode side) ---------------------------------------------
    def deliver(self, slot: Slot, tile_index: int, tile: np.ndarray) -> None:
        """Adopt a decoded tile by reference; the slot is ready once every tile landed."""
        self.deliver_many(((slot, tile_index, tile),))

    def deliver_many(self, landed: Sequence[tuple[Slot, int, np.ndarray]]) -> None:
        """``deliver`` for several ``(slot, tile_index, tile)`` under one lock, with one wake-up.

        A decode job that placed a group of tiles lands them together, so the
        consumer waiting on ``cond`` is woken once per group, not per tile.
        """
        if not landed:
            return
        ready = False
        with self.lock:
            for slot, tile_index, tile in landed:
                if slot.state != PENDING:
                    continue
                if slot.recyclable and tile.base is not None:  # a view of another array: not the engine's own
                    slot.recyclable = False
                if slot.tiles[tile_index] is None:
                    slot.remaining -= 1
                slot.tiles[tile_index] = tile
                if slot.remaining == 0:
                    slot.state = READY
                    ready = True
            if ready:
                self.cond.notify_all()

    def replace_tiles(self, slot: Slot, tiles: list[np.ndarray], origins: np.ndarray,
                      revived_for: Owner | None = None) -> bool:
        """Swap a slot's tiles for an assembled/transformed version and mark it ready.

        ``revived_for``: the tiles came from the disk cache for that owner, counted
        as its hit under the same lock, so a consumer that saw the data sees the count.
        Returns False when the slot was abandoned or failed meanwhile (the tiles are not adopted).
        """
        with self.lock:
            if slot.state != PENDING or self._slots.get(slot.key) is not slot:
                return False
            if revived_for is not None:
                self._count_revival(revived_for)
            slot.tiles = list(tiles)
            slot.recyclable = False  # assembled, transformed or mapped: not memory the decode owns
            slot.origins = origins
            slot.n_tiles = len(tiles)
            slot.remaining = 0
            slot.state = READY
            self.cond.notify_all()
            return True

    def _count_revival(self, owner: Owner) -> None:
        """A miss in memory served from the disk cache: a hit for the pass, not a fetch (lock held)."""
        owner.counters.misses -= 1
        owner.counters.hits += 1
        owner.counters.revived += 1
        self.totals.misses -= 1
        self.totals.hits += 1

    def fail(self, slot: Slot, error: BaseException) -> None:
        """Mark a slot failed (its waiters raise ``error``) and forget it so a later pass retries."""
        with self.lock:
            if slot.state == FAILED:
                return
            slot.state = FAILED
            slot.error = error
            self._drop(slot)
            self.cond.notify_all()

    # -- consumer side ---------------------------------------------------------
    def unpin(self, slot: Slot, owner: Owner) -> None:
        with self.lock:
            n = slot.pins.get(owner.id, 0)
            if n == 0:
                return
            if n == 1:
                del slot.pins[owner.id]
            else:
                slot.pins[owner.id] = n - 1
            owner.pinned_bytes -= slot.nbytes
            owner.pinned_reads -= 1
        if owner.wake is not None:
            owner.wake()

    def contains(self, key: ReadKey) -> bool:
        with self.lock:
            s = self._slots.get(key)
            return s is not None and s.state == READY

    def __len__(self) -> int:
        with self.lock:
            return len(self._slots)

    def clear(self) -> None:
        """Drop every unpinned slot and the recycled tiles."""
        with self.lock:
            for slot in [s for s in self._slots.values() if not s.pinned]:
                self._drop(slot)
            self._free.clear()
            self.free_bytes = 0
            self._pending = [s for s in self._pending if s.state == PENDING and self._slots.get(s.key) is s]

"""ChunkPool on its own: pins keep entries resident, LRU evicts only unpinned ready entries, budgets bound bytes."""

from __future__ import annotations

import numpy as np
import pytest

from insitubatch._engine.pool.chunk_pool import FAILED, PENDING, READY, ChunkPool
from insitubatch.errors import InSituError

TILE = np.zeros(4, dtype=np.float32)
ENTRY_BYTES = 100


class Listener:
    """An owner's listener that records what the pool told it."""

    def __init__(self, adopted=None) -> None:
        self.freed = 0
        self._adopted = adopted

    def room_freed(self) -> None:
        self.freed += 1

    def adopted(self, entry) -> None:
        if self._adopted is not None:
            self._adopted(entry)


def admit_ready(pool: ChunkPool, owner, chunk: int, nbytes: int = ENTRY_BYTES):
    """Admit a one-tile entry of array ``a`` chunk ``chunk`` and deliver its tile."""
    entry = pool.admit(("a", chunk), nbytes, np.zeros((1, 1), dtype=np.int64), owner)
    assert entry is not None
    pool.deliver(entry, 0, TILE)
    return entry


def test_an_entry_is_ready_once_every_tile_landed() -> None:
    pool = ChunkPool(1000)
    owner = pool.open_owner(500, 4)
    entry = pool.admit(("a", 0), ENTRY_BYTES, np.zeros((2, 1), dtype=np.int64), owner)
    assert entry.state == PENDING and not pool.contains(("a", 0))
    pool.deliver(entry, 0, TILE)
    pool.deliver(entry, 0, TILE)  # a repeated tile does not count twice
    assert entry.state == PENDING
    pool.deliver(entry, 1, TILE)
    assert entry.state == READY and pool.contains(("a", 0))
    assert (owner.counters.misses, owner.counters.hits) == (1, 0)


@pytest.mark.invariant
def test_pinned_entries_are_never_evicted_and_admission_waits_for_room() -> None:
    pool = ChunkPool(2 * ENTRY_BYTES)
    owner = pool.open_owner(2 * ENTRY_BYTES, 4)
    a0, a1 = admit_ready(pool, owner, 0), admit_ready(pool, owner, 1)
    assert pool.admit(("a", 2), ENTRY_BYTES, np.zeros((1, 1), dtype=np.int64), owner) is None  # all pinned
    pool.unpin(a0, owner)
    assert pool.admit(("a", 2), ENTRY_BYTES, np.zeros((1, 1), dtype=np.int64), owner) is not None
    assert not pool.contains(("a", 0)) and pool.contains(("a", 1))
    assert pool.totals.evictions == 1 and pool.resident_bytes == 2 * ENTRY_BYTES
    assert a1.pinned and not a0.pinned


def test_eviction_takes_the_least_recently_used_unpinned_entry() -> None:
    evicted = []
    pool = ChunkPool(3 * ENTRY_BYTES, on_evict=lambda entry: evicted.append(entry.key))
    owner = pool.open_owner(ENTRY_BYTES, 4)
    entries = [admit_ready(pool, owner, c) for c in range(3)]
    for entry in entries:
        pool.unpin(entry, owner)
    # chunk 0 is used again: chunk 1 becomes the oldest
    hit = pool.pin_existing(("a", 0), owner)
    assert hit is entries[0] and owner.counters.hits == 1
    pool.unpin(hit, owner)
    admit_ready(pool, owner, 3)
    assert evicted == [("a", 1)]
    assert [pool.contains(("a", c)) for c in range(4)] == [True, False, True, True]


def test_an_explicit_budget_refuses_a_working_set_it_cannot_hold() -> None:
    pool = ChunkPool(1000)
    pool.open_owner(600, 4)
    with pytest.raises(ValueError, match=r"cache_budget_bytes=1000 .* 600 bytes next to 1 .* at least 1200"):
        pool.open_owner(600, 4)


def test_the_automatic_budget_is_the_sum_of_open_working_sets() -> None:
    pool = ChunkPool(None)
    first = pool.open_owner(300, 4)
    second = pool.open_owner(200, 4)
    assert pool.budget == 500
    pool.close_owner(second)
    assert pool.budget == 300
    pool.close_owner(first)
    pool.close_owner(first)  # idempotent
    assert pool.budget == 0


def test_read_ahead_is_bounded_by_the_reservation_and_the_read_limit() -> None:
    pool = ChunkPool(None)
    owner = pool.open_owner(2 * ENTRY_BYTES, 2)
    assert pool.can_take(owner, 10 * ENTRY_BYTES)  # the first read always fits, however large
    admit_ready(pool, owner, 0)
    admit_ready(pool, owner, 1)
    assert not pool.can_take(owner, 1)  # two reads pinned: the read limit
    pool.unpin(pool.pin_existing(("a", 0), owner), owner)
    assert owner.pinned_reads == 2


def test_a_closing_fetcher_hands_an_in_flight_entry_to_a_pass_still_waiting() -> None:
    pool = ChunkPool(None)
    fetcher, waiter = pool.open_owner(ENTRY_BYTES, 4), pool.open_owner(ENTRY_BYTES, 4)
    entry = pool.admit(("a", 0), ENTRY_BYTES, np.zeros((1, 1), dtype=np.int64), fetcher)
    assert pool.pin_existing(("a", 0), waiter) is entry
    refetched = []
    waiter.listen(Listener(adopted=refetched.append))
    assert pool.close_owner(fetcher) == []  # nothing to cancel: the waiter adopted it
    assert refetched == [entry] and entry.fetcher == waiter.id and entry.state == PENDING


def test_an_in_flight_entry_nobody_else_pins_is_abandoned_and_one_nobody_can_fetch_fails() -> None:
    pool = ChunkPool(None)
    fetcher = pool.open_owner(ENTRY_BYTES, 4)
    entry = pool.admit(("a", 0), ENTRY_BYTES, np.zeros((1, 1), dtype=np.int64), fetcher)
    assert pool.close_owner(fetcher) == [entry] and len(pool) == 0 and pool.resident_bytes == 0

    fetcher, waiter = pool.open_owner(ENTRY_BYTES, 4), pool.open_owner(ENTRY_BYTES, 4)
    entry = pool.admit(("a", 1), ENTRY_BYTES, np.zeros((1, 1), dtype=np.int64), fetcher)
    pool.pin_existing(("a", 1), waiter)  # no refetch hook: it cannot fetch
    pool.close_owner(fetcher)
    assert entry.state == FAILED and isinstance(entry.error, InSituError) and "chunk 1" in str(entry.error)
    assert pool.pin_existing(("a", 1), waiter) is None  # a failed entry is forgotten: a later pass retries


def test_clear_keeps_pinned_entries() -> None:
    pool = ChunkPool(None)
    owner = pool.open_owner(2 * ENTRY_BYTES, 4)
    kept, dropped = admit_ready(pool, owner, 0), admit_ready(pool, owner, 1)
    pool.unpin(dropped, owner)
    pool.clear()
    assert pool.contains(("a", 0)) and not pool.contains(("a", 1)) and kept.tiles[0] is TILE
    assert dropped.tiles == [None]


def _awaited_by_hand(pool: ChunkPool) -> int:
    """What the pending entries await, summed from their tiles (what ``awaited_bytes`` keeps as it goes)."""
    pending = [e for e in pool._entries.values() if e.state == PENDING]
    return sum(e.nbytes - sum(t.nbytes for t in e.tiles if isinstance(t, np.ndarray)) for e in pending)


def test_awaited_bytes_follow_every_landing_failure_and_hand_over() -> None:
    tile = np.zeros(10, dtype=np.float32)  # 40 bytes
    origins = np.zeros((2, 1), dtype=np.int64)
    pool = ChunkPool(None)
    fetcher, waiter = pool.open_owner(4 * ENTRY_BYTES, 8), pool.open_owner(4 * ENTRY_BYTES, 8)
    waiter.listen(Listener())
    a, b, c = (pool.admit(("a", k), ENTRY_BYTES, origins, fetcher) for k in range(3))
    assert pool.awaited_bytes == 3 * ENTRY_BYTES == _awaited_by_hand(pool)
    pool.deliver(a, 0, tile)
    pool.deliver(a, 0, tile)  # a repeated tile is owed once
    assert pool.awaited_bytes == 3 * ENTRY_BYTES - tile.nbytes == _awaited_by_hand(pool)
    pool.deliver(a, 1, tile)  # ready: it awaits nothing, whatever its estimate
    assert a.state == READY and pool.awaited_bytes == 2 * ENTRY_BYTES == _awaited_by_hand(pool)
    assert not pool.stage(b, 0, tile) and pool.awaited_bytes == 2 * ENTRY_BYTES - tile.nbytes
    pool.fail(c, RuntimeError("boom"))
    assert pool.awaited_bytes == ENTRY_BYTES - tile.nbytes == _awaited_by_hand(pool)
    pool.pin_existing(("a", 1), waiter)
    pool.close_owner(fetcher)  # b is handed to the waiter and fetched again from nothing
    assert b.state == PENDING and b.fetcher == waiter.id
    assert pool.awaited_bytes == ENTRY_BYTES == _awaited_by_hand(pool)
    pool.close_owner(waiter)  # abandoned: dropped, awaiting nothing
    assert pool.awaited_bytes == 0 == _awaited_by_hand(pool)


def test_a_closed_owner_claims_nothing_and_a_finished_entry_takes_no_late_tile() -> None:
    pool = ChunkPool(None)
    owner = pool.open_owner(4 * ENTRY_BYTES, 8, reads=1)
    pool.close_owner(owner)  # its driver may still run a step before it is cancelled
    assert pool.claim(("a", 0), ENTRY_BYTES, np.zeros((1, 1), np.int64), owner, True, 0) == (None, False)
    assert len(pool) == 0 and owner.entries == [None]  # nothing pinned for, or fetched by, a closed pass

    live = pool.open_owner(4 * ENTRY_BYTES, 8)
    entry = pool.admit(("a", 1), ENTRY_BYTES, np.zeros((2, 1), np.int64), live)
    assert pool.replace_tiles(entry, [TILE], np.zeros((1, 1), np.int64))  # finished as a whole
    assert not pool.stage(entry, 1, TILE)  # a late tile of an earlier fetcher changes nothing
    assert entry.state == READY and entry.tiles == [TILE] and entry.remaining == 0


def test_an_unpin_tells_the_owners_listener_and_a_claim_sets_the_owners_entry() -> None:
    pool = ChunkPool(None)
    owner = pool.open_owner(2 * ENTRY_BYTES, 4, reads=2)
    listener = Listener()
    owner.listen(listener)
    entry, admitted = pool.claim(("a", 0), ENTRY_BYTES, np.zeros((1, 1), np.int64), owner, True, 1)
    assert admitted and owner.entries == [None, entry]
    pool.unpin(entry, owner)
    assert listener.freed == 1 and owner.pinned_reads == 0
    pool.unpin(entry, owner)  # nothing pinned: nothing freed, nobody told
    assert listener.freed == 1
    pool.close_owner(owner)
    assert owner.entries == [None, None]  # the closed pass holds no entry

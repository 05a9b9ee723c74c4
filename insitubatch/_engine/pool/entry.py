"""What the chunk pool holds and who holds it: ``Entry`` (one read's tiles) and ``Owner`` (one open iteration).

``ChunkPool`` (``pool``) creates and guards both under its lock. What an
owner's fetching side hears from the pool (room freed, an entry to fetch
again) is the ``OwnerListener`` it registers: the pool tells, the listener
decides what to do on its own thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from ...plan.epoch import ReadKey
from ..stats import PassCounters

__all__ = ["FAILED", "PENDING", "READY", "Entry", "EntryState", "Owner", "OwnerListener"]

# an entry's life: tiles arriving, every tile placed, or the fetch/decode failed (``Entry.error``)
EntryState = Literal["pending", "ready", "failed"]
PENDING: EntryState = "pending"
READY: EntryState = "ready"
FAILED: EntryState = "failed"


@dataclass(eq=False)
class Entry:
    """One resident read: a chunk's tiles (sample axis first) and where each sits in the field."""

    key: ReadKey
    nbytes: int
    n_tiles: int
    origins: np.ndarray
    tiles: list[np.ndarray | None]
    state: EntryState = PENDING
    error: BaseException | None = None
    remaining: int = 0
    pins: dict[int, int] = field(default_factory=dict)
    fetcher: int | None = None
    # tiles replaced under on_bad_chunk="nan" (the driver's records), listed again by every pass that hits it
    bad_records: list = field(default_factory=list)
    # its tiles are arrays the engine decoded into (never a transform's output or a
    # disk-cache mapping): once evicted and unreferenced they may be reused
    recyclable: bool = False
    awaited: int = 0  # bytes of it no landed tile occupies yet, while pending (``ChunkPool.awaited_bytes``)

    @property
    def pinned(self) -> bool:
        return bool(self.pins)

    @property
    def bad(self) -> bool:
        return bool(self.bad_records)


class OwnerListener(Protocol):
    """What fetches an owner's reads (its pass's driver) hears from the pool; called off the pool's lock, any thread."""

    def room_freed(self) -> None:
        """The owner unpinned a read: its read-ahead may have room again."""

    def adopted(self, entry: Entry) -> None:
        """The owner now fetches ``entry`` (pending, from nothing): its fetcher closed before it landed."""


@dataclass(eq=False)
class Owner:
    """One open iteration inside a pool: its reservation, pinned bytes, counters and the entries of its reads.

    ``entries[i]`` is the entry of the pass's read ``i`` once claimed (the
    pool sets it under its lock; the consumer waiting on the pool's
    condition reads it there).
    """

    id: int
    reservation: int
    read_limit: int
    pinned_bytes: int = 0
    pinned_reads: int = 0
    counters: PassCounters = field(default_factory=PassCounters)
    entries: list[Entry | None] = field(default_factory=list)
    # who fetches this owner's reads (None: an owner that cannot fetch; an entry handed to it fails)
    listener: OwnerListener | None = None
    closed: bool = False

    def listen(self, listener: OwnerListener) -> None:
        """Have ``listener`` hear when this owner's room frees and which entries it must fetch again."""
        self.listener = listener

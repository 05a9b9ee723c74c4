"""What the chunk pool holds and who holds it: ``Entry`` (one read's tiles) and ``Owner`` (one open iteration).

``ChunkPool`` (``pool``) creates and guards both under its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ...plan.epoch import ReadKey
from ..stats import PassCounters

__all__ = ["FAILED", "PENDING", "READY", "Entry", "EntryState", "Owner"]

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
    # re-admit an entry this owner adopted from an owner that closed mid-fetch (called off the lock)
    refetch: Callable[[Entry], object] | None = None
    closed: bool = False

"""Receive buffers for bodies of known length, used again once nothing refers to them.

A body received into fresh memory costs the kernel more than the copy:
a large allocation is mapped for it and unmapped when the body is
dropped, and every page of it faults in (and is zeroed) as ``recv``
fills it. Measured on loopback with ERA5-shaped chunks (279 KB), that is
about 40% of a GET's CPU. :class:`BodyBuffers` keeps the slabs it handed
out and gives a slab again only when the slab's reference count says
nobody else holds it: every view of a body (a numpy slice, a
``memoryview``, zarr's ``Buffer``, a decoder's argument) holds the slab,
so a body still in use is never written over. One per connection pool,
used on its event loop's thread only.
"""

from __future__ import annotations

import collections
import sys

import numpy as np

__all__ = ["MAX_KEPT_BYTES", "MIN_SLAB_BYTES", "SLAB_STEP_BYTES", "BodyBuffers"]

# Bodies smaller than this come from plain allocations: the C allocator keeps such blocks on its heap and
# hands them out again without the kernel (its default threshold for mapping a block is 128 KiB).
MIN_SLAB_BYTES = 128 << 10
# Slabs are sized in steps of this, and a slab serves a body up to one step and a quarter smaller than itself,
# so chunks whose compressed sizes differ a little share slabs.
SLAB_STEP_BYTES = 64 << 10
FIT_SLACK = 1.25
# The slabs one pool keeps for reuse, busy or free, at most (a pass's reads in flight are a few hundred tiles);
# past it a body takes a plain allocation, dropped with the body.
MAX_KEPT_BYTES = 64 << 20
# How many kept slabs one request looks at for a free one that fits, before it allocates.
LOOK_AT = 8


def _refs_when_free() -> int:
    """The reference count :meth:`BodyBuffers.take` reads for a slab that only the ring holds."""
    ring = collections.deque([np.empty(1, dtype=np.uint8)])
    slab = ring.popleft()
    ring.append(slab)
    return sys.getrefcount(slab)  # take's steps exactly: a slab held by the ring and its local name alone


_FREE = _refs_when_free()


class BodyBuffers:
    """Slabs for received bodies: a free one that fits is used again, else a new one is made (and kept, within bounds)."""

    def __init__(self, max_kept_bytes: int = MAX_KEPT_BYTES) -> None:
        self.max_kept_bytes = max_kept_bytes
        self.kept_bytes = 0
        self.reused = 0  # bodies received into a slab used before
        self._ring: collections.deque[np.ndarray] = collections.deque()

    def take(self, size: int) -> np.ndarray:
        """A ``uint8`` array of ``size`` bytes (uninitialised) to receive a body into."""
        if size < MIN_SLAB_BYTES:
            return np.empty(size, dtype=np.uint8)
        ring = self._ring
        for _ in range(min(LOOK_AT, len(ring))):
            slab = ring.popleft()
            ring.append(slab)  # to the back: busy slabs are looked at again only after the others
            if sys.getrefcount(slab) == _FREE and size <= len(slab) <= size * FIT_SLACK:
                self.reused += 1
                return slab[:size]
        slab = np.empty(-(-size // SLAB_STEP_BYTES) * SLAB_STEP_BYTES, dtype=np.uint8)
        if self.kept_bytes + len(slab) <= self.max_kept_bytes:
            ring.append(slab)
            self.kept_bytes += len(slab)
        return slab[:size]

    def clear(self) -> None:
        """Let go of every kept slab (those still in use live on with their bodies)."""
        self._ring.clear()
        self.kept_bytes = 0

"""``BufferPool``: batch buffers reused once nothing outside the pool references them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import numpy as np

from ... import config

__all__ = ["BufferPool"]

Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def _heap(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


class BufferPool:
    """Reuses batch buffers once nothing outside the pool references them.

    A buffer handed out stays referenced by the ``Batch`` (and by any view or
    DLPack export of it); while that is so the pool allocates another. The
    pool therefore converges on however many buffers are really in flight.
    """

    def __init__(self, reuse: bool | None = None, allocator: Allocator | None = None) -> None:
        if reuse is None:
            reuse = not config.get("no_buffer_reuse")
        self.reuse = reuse
        self.allocator: Allocator = allocator or _heap
        self._lock = threading.Lock()
        self._buffers: dict[tuple[str, tuple[int, ...], str], list[np.ndarray]] = {}
        self.allocations = 0

    def take(self, label: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous buffer of ``shape``; never one still referenced elsewhere."""
        if not self.reuse:
            self.allocations += 1
            return self.allocator(tuple(shape), np.dtype(dtype))
        key = (label, tuple(shape), np.dtype(dtype).str)
        with self._lock:
            bufs = self._buffers.setdefault(key, [])
            for i in range(len(bufs)):
                # the list's reference + getrefcount's argument: nobody else holds it
                if sys.getrefcount(bufs[i]) == 2:
                    return bufs[i]
            buf = self.allocator(tuple(shape), np.dtype(dtype))
            bufs.append(buf)
            self.allocations += 1
            return buf

    def set_allocator(self, allocator: Allocator) -> None:
        """Allocate new buffers with ``allocator`` (e.g. page-locked memory); drops idle ones."""
        with self._lock:
            self.allocator = allocator
            self._buffers.clear()

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()

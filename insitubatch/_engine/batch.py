"""``Batch``, what a pass yields, and the batch-buffer reuse pool behind it."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Batch", "BufferPool"]

NO_REUSE_ENV = "INSITUBATCH_NO_BUFFER_REUSE"
Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def _heap(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


@dataclass
class Batch:
    """One batch: ``arrays[label]`` is ``(len(batch), *inner)`` for every label.

    ``sample_indices`` are the anchors on the manifest's grid; label ``L``
    read ``sample_indices + offsets[L]`` along its sample axis.
    """

    arrays: dict[str, np.ndarray]
    sample_indices: np.ndarray
    offsets: dict[str, int]
    coords: Mapping[str, np.ndarray] | None = None
    epoch: int = 0
    index: int = 0
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sample_indices)

    def read_indices(self, label: str) -> np.ndarray:
        """The sample-axis indices ``label`` was read at (``sample_indices + offset``)."""
        if label not in self.offsets:
            raise KeyError(f"label {label!r} is not in this batch; labels are {sorted(self.offsets)}")
        return self.sample_indices + self.offsets[label]

    def stack(self, labels: Sequence[str], axis: int = 1) -> np.ndarray:
        """Stack several labels' arrays along a new ``axis`` (e.g. channels)."""
        missing = [lb for lb in labels if lb not in self.arrays]
        if missing:
            raise KeyError(f"labels {missing} are not in this batch; labels are {sorted(self.arrays)}")
        return np.stack([self.arrays[lb] for lb in labels], axis=axis)


class BufferPool:
    """Reuses batch buffers once nothing outside the pool references them.

    A buffer handed out stays referenced by the ``Batch`` (and by any view or
    DLPack export of it); while that is so the pool allocates another. The
    pool therefore converges on however many buffers are really in flight.
    """

    def __init__(self, reuse: bool | None = None, allocator: Allocator | None = None) -> None:
        if reuse is None:
            reuse = os.environ.get(NO_REUSE_ENV, "") not in ("1", "true", "yes")
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

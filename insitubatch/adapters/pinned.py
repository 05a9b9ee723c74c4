"""Page-aligned, page-locked host buffers handed out as numpy arrays.

A host-to-device copy is only truly asynchronous from page-locked memory.
``PinnedBufferPool`` hands out numpy arrays over page-aligned allocations,
registered with the CUDA runtime when torch with CUDA is present, otherwise
locked with ``mlock`` while ``RLIMIT_MEMLOCK`` allows (past it: one warning per
pool, and plain aligned memory).

Lifetime is the arrays' own: a buffer goes back to the pool on ``release`` but
is handed out again only once nothing views it any more — not the released
array, not a slice of it, not a tensor that took it over by DLPack. A buffer
never released is freed when its last view dies.
"""

from __future__ import annotations

import math
import mmap
import os
import resource
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._ext.pinned import HostBuffer
from .._weak import WeakMembers

__all__ = ["PAGE_SIZE", "PinnedBufferPool"]

PAGE_SIZE = mmap.PAGESIZE
# A free buffer serves a request down to 1/_MAX_SLACK of its size; smaller
# requests get their own buffer rather than pinning a large one.
_MAX_SLACK = 2


def _buffer_of(array: object) -> HostBuffer | None:
    """The ``HostBuffer`` under ``array`` (following views), or None."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, HostBuffer) else None


def _locked_bytes_of_process() -> int | None:
    """``VmLck`` from ``/proc/self/status`` in bytes, or None where there is no procfs."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmLck:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cuda_runtime(register_cuda: bool | None) -> Any | None:
    """torch's CUDA runtime module when buffers should be registered with it (an untyped binding)."""
    if register_cuda is False:
        return None
    try:
        import torch
    except ImportError:
        cuda = False
    else:
        cuda = torch.cuda.is_available()
    if not cuda:
        if register_cuda:
            raise ValueError("register_cuda=True needs torch built with CUDA and a visible GPU")
        return None
    return torch.cuda.cudart()


class PinnedBufferPool:
    """Reusable page-aligned host buffers for batches, locked in RAM where allowed.

    Parameters
    ----------
    lock
        Lock buffers with ``mlock`` while ``RLIMIT_MEMLOCK`` allows; the first
        buffer that cannot be locked warns once and the pool carries on with
        unlocked aligned memory. ``False`` never locks and never warns.
    register_cuda
        Register buffers with ``cudaHostRegister`` through torch (which pins
        them, so ``mlock`` is skipped). ``None`` registers when torch with CUDA
        is available; ``True`` requires it.
    """

    def __init__(self, *, lock: bool = True, register_cuda: bool | None = None) -> None:
        self._lock_pages = lock
        self._cudart = _cuda_runtime(register_cuda)
        self._mutex = threading.Lock()
        self._free: list[HostBuffer] = []
        self._lent: WeakMembers[HostBuffer] = WeakMembers()
        self._alive: WeakMembers[HostBuffer] = WeakMembers()
        self._warned = False
        self._closed = False

    # -- public ---------------------------------------------------------------

    def acquire(self, shape: Sequence[int] | int, dtype: npt.DTypeLike) -> np.ndarray:
        """A C-contiguous, page-aligned, uninitialised array of ``shape`` and ``dtype``."""
        dt = np.dtype(dtype)
        if dt.hasobject or dt.itemsize == 0:
            raise ValueError(f"dtype {dt} cannot live in a host buffer; only fixed-size dtypes can")
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(x) for x in shape)
        if any(x < 0 for x in shape):
            raise ValueError(f"{shape=} must be >= 0 in every dim")
        count = math.prod(shape)
        need = max(PAGE_SIZE, -(-count * dt.itemsize // PAGE_SIZE) * PAGE_SIZE)
        with self._mutex:
            if self._closed:
                raise ValueError("the PinnedBufferPool is closed")
            buf = self._take_free(need)
            if buf is None:
                buf = self._allocate(need)
            self._lent.add(buf)
        return np.frombuffer(memoryview(buf), dt, count).reshape(shape)

    def release(self, array: np.ndarray) -> None:
        """Give ``array``'s buffer back; it is reused once no view of it is alive.

        Raises
        ------
        ValueError
            When ``array`` was not acquired from this pool or was already released.
        """
        buf = _buffer_of(array)
        with self._mutex:
            if buf is None or buf not in self._lent:
                raise ValueError("array was not acquired from this PinnedBufferPool, or was already released")
            self._lent.discard(buf)
            if not self._closed:
                self._free.append(buf)

    def close(self) -> None:
        """Free every released buffer now; lent ones are freed when their views die. Idempotent."""
        with self._mutex:
            self._closed = True
            self._free.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def free_buffers(self) -> int:
        """Released buffers the pool holds for reuse (some may still be viewed)."""
        return len(self._free)

    @property
    def nbytes(self) -> int:
        """Bytes of every live buffer this pool allocated (lent, free or only still viewed)."""
        return sum(buf.nbytes for buf in list(self._alive))

    @property
    def locked_bytes(self) -> int:
        """Bytes of those buffers locked in RAM by ``mlock``."""
        return sum(buf.nbytes for buf in list(self._alive) if buf.locked)

    def __enter__(self) -> PinnedBufferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- private --------------------------------------------------------------

    def _take_free(self, need: int) -> HostBuffer | None:
        """The smallest released, unviewed buffer that serves ``need`` bytes without waste."""
        best = None
        for buf in self._free:
            if buf.exports == 0 and need <= buf.nbytes <= _MAX_SLACK * need:
                if best is None or buf.nbytes < best.nbytes:
                    best = buf
        if best is not None:
            self._free.remove(best)
        return best

    def _allocate(self, nbytes: int) -> HostBuffer:
        buf = HostBuffer(nbytes, PAGE_SIZE)
        self._alive.add(buf)
        if self._cudart is not None and self._register(self._cudart, buf):
            return buf
        if self._lock_pages:
            self._lock(buf)
        return buf

    def _register(self, cudart: Any, buf: HostBuffer) -> bool:
        err = cudart.cudaHostRegister(buf.address, buf.nbytes, 0)
        if err != cudart.cudaError.success:
            self._warn(f"cudaHostRegister failed ({err}); using mlock instead")
            return False
        weakref.finalize(buf, cudart.cudaHostUnregister, buf.address)
        return True

    def _lock(self, buf: HostBuffer) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        locked = _locked_bytes_of_process()
        if soft != resource.RLIM_INFINITY and locked is not None and locked + buf.nbytes > soft:
            reason = f"locking {buf.nbytes} more bytes would pass RLIMIT_MEMLOCK ({soft} bytes, {locked} locked)"
        else:
            err = buf.lock()
            if err == 0:
                return
            reason = f"mlock of {buf.nbytes} bytes failed: {os.strerror(err)}"
        self._warn(f"{reason}; this pool's buffers stay pageable (raise `ulimit -l` to lock them)")

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"PinnedBufferPool: {message}", RuntimeWarning, stacklevel=5)

"""The two process-wide executors a pass runs on: zarr's store-IO loop and the decode pool."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

from .._zarr_compat import io_loop

__all__ = ["DECODE_THREAD_PREFIX", "decode_pool", "zarr_loop"]

DECODE_THREAD_PREFIX = "insitu-dec"
_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def zarr_loop() -> asyncio.AbstractEventLoop:
    """zarr's process-wide store-IO loop, which the scheduler shares."""
    return io_loop()


def decode_pool(threads: int | None = None) -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide decode pool for ``threads`` workers (default: one per core).

    Never shut down by a pass: it outlives every dataset, like zarr's loop.
    """
    n = int(threads) if threads else (os.cpu_count() or 1)
    with _pools_lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix=DECODE_THREAD_PREFIX)
        return pool


def _forget_pools_in_child() -> None:
    # a forked child has none of its parent's decode threads: pools whose workers are gone would take work
    # and never run it, so the child starts its own (zarr resets its loop itself)
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_in_child)

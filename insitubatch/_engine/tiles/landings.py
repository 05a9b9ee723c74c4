"""How decode-pool jobs land back on the loop: completions in bursts, counters in one go.

``Landings`` hands finished tile jobs to zarr's loop with one wake-up per
burst; ``Tally`` is what one job adds to a pass's counters.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..reads.window import WindowUser

__all__ = ["Landings", "Tally", "release_permits"]


class Landings:
    """Tile jobs run on the decode pool; their completions go back to the loop in bursts.

    ``asyncio.wrap_future`` wakes the loop once per job (a self-pipe write
    and a GIL hand-over each). Here a finished job queues its outcome and
    only the first of a burst schedules the drain, so tiles that finish
    while the loop is busy (or before it ran) cost it no extra wake-up.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: concurrent.futures.Executor) -> None:
        self.loop = loop
        self.executor = executor
        self._done: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._armed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> tuple[asyncio.Future, concurrent.futures.Future]:
        """Run ``fn(*args)`` on the decode pool: a loop future for its outcome, and the pool's own job.

        A task cancelled while awaiting the loop future leaves the job running;
        the job future is what a teardown waits on.
        """
        fut = self.loop.create_future()
        return fut, self.executor.submit(self._run, fut, fn, args)

    def _run(self, fut: asyncio.Future, fn: Callable[..., Any], args: tuple) -> None:
        outcome: tuple[Any, BaseException | None]
        try:
            outcome = (fn(*args), None)
        except BaseException as exc:  # handed to the awaiting task, raised there
            outcome = (None, exc)
        self._done.append((fut, *outcome))
        with self._lock:
            if self._armed:
                return  # a drain is already scheduled and will see this one
            self._armed = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed (interpreter exit): nobody awaits these any more
            with self._lock:
                self._armed = False
            raise

    def _drain(self) -> None:
        with self._lock:
            self._armed = False  # anything queued from here on schedules its own drain
        while self._done:
            fut, result, exc = self._done.popleft()
            if fut.cancelled():
                continue
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)


@dataclass
class Tally:
    """What one decode job adds to a pass's counters, added under the pool lock in one go."""

    gets: int = 0
    get_bytes: int = 0
    decoded_tiles: int = 0

    def add_to(self, counters, lock: threading.Lock) -> None:
        with lock:
            # a remote store's GETs are counted on the loop, without this lock: a job that made none
            # must not write the counts back (a read-add-write of 0 could undo the loop's increment)
            if self.gets or self.get_bytes:
                counters.gets += self.gets
                counters.get_bytes += self.get_bytes
            counters.decoded_tiles += self.decoded_tiles


def release_permits(semaphore: WindowUser, n: int) -> None:
    for _ in range(n):
        semaphore.release()

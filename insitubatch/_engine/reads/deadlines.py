"""``Deadlines``: the hedge and stall times of every read on one link, in one heap serviced by one loop timer.

A link (``store_link.StoreLink``) holds one for the loop its reads run on, so
the passes reading one endpoint together (ranks, a train and a validation
pass) share one timer, as the link's window and hedge budget are shared.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from typing import Protocol

__all__ = ["Deadlines", "Racer"]


class Racer(Protocol):
    """What a deadline names: a read whose attempt may still race when its time comes (``fetch.Read``)."""

    def racing(self, attempt: int) -> bool:
        """Whether attempt number ``attempt`` still races."""
        ...

    def tick(self, now: float) -> None:
        """A deadline of the racing attempt came."""
        ...


class Deadlines:
    """The hedge and stall times of the attempts on one link and loop: one heap, serviced by one loop timer.

    An attempt puts its next deadline in (the earlier of its hedge and stall
    times); the timer is armed for the heap's earliest and moved only when
    an earlier one comes in, so a GET costs a heap push, never a timer
    handle of its own. An attempt that ended before its deadline leaves its
    entry in the heap until it is popped (removing it would cost a heap
    search), but :meth:`forget` lets go of the read at once: a closed pass's
    reads, and the store they read, are not kept alive by a deadline still
    to come. Loop thread only.
    """

    __slots__ = ("_armed_at", "_heap", "_order", "_timer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[list] = []  # [when, order, read (None once forgotten), its attempt then]
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = math.inf

    def add(self, when: float, read: Racer, attempt: int) -> list:
        """Call ``read.tick(now)`` at ``when`` if its attempt ``attempt`` is still racing then; returns the entry."""
        entry = [when, next(self._order), read, attempt]
        heapq.heappush(self._heap, entry)
        if when < self._armed_at:
            self._arm(when)
        return entry

    @staticmethod
    def forget(entry: list) -> None:
        """The attempt of ``entry`` (from :meth:`add`) ended: the heap no longer holds its read."""
        entry[2] = None

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed_at = None, math.inf
        heap = self._heap
        now = self.loop.time()
        while heap and heap[0][0] <= now:
            _, _, read, attempt = heapq.heappop(heap)
            if read is not None and read.racing(attempt):
                read.tick(now)  # (it may put its next deadline in: later than now)
        while heap and (heap[0][2] is None or not heap[0][2].racing(heap[0][3])):
            heapq.heappop(heap)  # ended attempts at the head: no wake-up for them
        if heap:
            self._arm(heap[0][0])

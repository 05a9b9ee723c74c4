"""The permits reads take before they go to the store: a window whose size the controller may move.

A :class:`ReadWindow` admits at most ``limit`` reads at once, ``limit``
being a pinned ``max_inflight`` or, under ``"auto"``, its
:class:`~.concurrency.ConcurrencyController`'s current value. Each dataset
(and each rank's dataset in one process) reading from the window holds a
:class:`WindowUser` with a cap of its own, the memory plan's bound for its
tile size, so a shared window never lets one reader exceed what its
``describe()`` promised. A user quacks like ``asyncio.Semaphore``
(``acquire``, ``release``, ``locked``, ``async with``), which is what the
scheduler holds; waiters are served first come, first served, with no
barging past a queue. Loop thread only, except :attr:`WindowUser.held`,
which anyone may read.
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref

from .concurrency import ConcurrencyController

__all__ = ["ReadWindow", "WindowUser"]


class ReadWindow:
    """Permits for the reads of one store (auto) or one dataset (a pinned ``max_inflight``)."""

    def __init__(self, limit: int, controller: ConcurrencyController | None = None, ceiling: int | None = None) -> None:
        self._fixed = int(limit)
        self.controller = controller
        self.ceiling = ceiling if ceiling is not None else self._fixed  # the cap of all users together
        self.inflight = 0
        self._waiters: collections.deque[tuple[asyncio.Future, WindowUser]] = collections.deque()
        self._users: weakref.WeakSet[WindowUser] = weakref.WeakSet()

    @property
    def limit(self) -> int:
        return self.controller.limit if self.controller is not None else self._fixed

    def user(self, cap: int) -> WindowUser:
        """A reader's handle, holding at most ``cap`` permits (any thread; the cap counts from its first acquire)."""
        return WindowUser(self, int(cap))

    # -- what the fetcher reports (loop) ----------------------------------------------------------
    def completed(self, nbytes: int, seconds: float) -> None:
        """A GET under a permit finished: the controller learns from it, and a raised limit admits waiters."""
        controller = self.controller
        if controller is None:
            return
        before = controller.limit
        controller.on_complete(time.monotonic(), nbytes, seconds, self.inflight >= before or bool(self._waiters))
        if controller.limit > before:
            self._wake()

    def throttled(self) -> None:
        """The store answered a GET with a throttling status."""
        if self.controller is not None:
            self.controller.on_throttle(time.monotonic())

    # -- permits ----------------------------------------------------------------------------------
    def _can(self, user: WindowUser) -> bool:
        return self.inflight < self.limit and user.held < user.cap

    def _take(self, user: WindowUser) -> None:
        self.inflight += 1
        user.held += 1
        if not user.active:
            self._join(user)

    def _join(self, user: WindowUser) -> None:
        user.active = True
        self._users.add(user)
        self._recap()

    def _recap(self) -> None:
        """Under "auto", the controller's cap is the ceiling or what the active users may hold together."""
        if self.controller is not None:
            caps = sum(u.cap for u in self._users if u.active)
            if caps:  # with no reader left the limit stays where it was, for the next one
                self.controller.set_cap(min(self.ceiling, caps), time.monotonic())

    def _give_back(self, user: WindowUser) -> None:
        self.inflight -= 1
        user.held -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand permits to waiters in arrival order; one whose reader is at its cap lets the next go first."""
        waiters = self._waiters
        if not waiters:
            return
        skipped = []
        while waiters and self.inflight < self.limit:
            fut, user = waiters.popleft()
            if fut.done():  # cancelled while waiting
                continue
            if user.held >= user.cap:
                skipped.append((fut, user))
                continue
            self._take(user)  # the permit is the waiter's from here, even before it runs
            fut.set_result(None)
        waiters.extendleft(reversed(skipped))


class WindowUser:
    """One reader's share of a :class:`ReadWindow`, shaped like ``asyncio.Semaphore``."""

    def __init__(self, window: ReadWindow, cap: int) -> None:
        self.window = window
        self.cap = max(1, cap)
        self.held = 0
        self.active = False

    def locked(self) -> bool:
        """True when an ``acquire`` now would wait."""
        w = self.window
        return bool(w._waiters) or not w._can(self)

    def try_acquire(self) -> bool:
        """Take a permit if one is free now (no waiting, no barging past waiters)."""
        w = self.window
        if not w._waiters and w._can(self):
            w._take(self)
            return True
        return False

    async def acquire(self) -> bool:
        if self.try_acquire():
            return True
        w = self.window
        fut = asyncio.get_running_loop().create_future()
        w._waiters.append((fut, self))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a permit just as it was cancelled: give it back
                w._give_back(self)
            raise
        return True

    def release(self) -> None:
        self.window._give_back(self)

    def leave(self) -> None:
        """This reader is done for now (a pass ended): its cap stops counting toward the shared cap."""
        if self.active:
            self.active = False
            self.window._recap()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

"""The permits reads take before they go to the store: a window whose size the controller may move.

A :class:`ReadWindow` admits at most ``limit`` reads at once, ``limit``
being a pinned ``max_inflight`` or, under ``"auto"``, its
:class:`~.concurrency.ConcurrencyController`'s current value. Each dataset
(and each rank's dataset in one process) reading from the window holds a
:class:`WindowUser` with a cap of its own, the memory plan's bound for its
tile size, so a shared window never lets one reader exceed what its
``describe()`` promised. A user quacks like ``asyncio.Semaphore``
(``acquire``, ``release``, ``locked``, ``async with``), which is what the
scheduler holds, with no barging past a queue.

A read of several tiles at once (a run of a shard's adjacent inner chunks,
one GET) takes a permit per tile together (:meth:`WindowUser.acquire_many`):
all or none, so two such reads never hold part of what each waits for. It
is granted when its permits fit under the limit, or when the window is
idle (a run no larger than the reader's cap always gets through); a waiter
for several permits at the head of the queue holds back the ones behind it
until then, so it cannot starve.

Waiters are served in ticket order. A read may name the
:meth:`~ReadWindow.ticket` its tile drew when the pass admitted it, so the
reads of an early batch that can start only after another read (a sharded
array's inner chunks, after their shard's index) go before reads of
batches admitted later; a read with no ticket draws one as it waits (first
come, first served). Background reads (shard indexes read ahead) wait with
``acquire_idle`` and get a permit only when no other read waits for one.
Loop thread only, except :attr:`WindowUser.held`,
which anyone may read.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import time

from ..._weak import WeakMembers
from .concurrency import ConcurrencyController

__all__ = ["ReadWindow", "WindowUser"]


class ReadWindow:
    """Permits for the reads of one store (auto) or one dataset (a pinned ``max_inflight``)."""

    def __init__(self, limit: int, controller: ConcurrencyController | None = None, ceiling: int | None = None) -> None:
        self._fixed = int(limit)
        self.controller = controller
        self.ceiling = ceiling if ceiling is not None else self._fixed  # the cap of all users together
        self.inflight = 0
        # a heap of (ticket, arrival, future, user, permits wanted)
        self._waiters: list[tuple[int, int, asyncio.Future, WindowUser, int]] = []
        self._idle: collections.deque[tuple[asyncio.Future, WindowUser]] = collections.deque()  # background reads
        self._tickets = itertools.count()
        self._arrivals = itertools.count()
        self._users: WeakMembers[WindowUser] = WeakMembers()

    @property
    def limit(self) -> int:
        return self.controller.limit if self.controller is not None else self._fixed

    def ticket(self) -> int:
        """A place in the queue: reads waiting under a smaller ticket get permits first."""
        return next(self._tickets)

    def user(self, cap: int) -> WindowUser:
        """A reader's handle, holding at most ``cap`` permits (any thread; the cap counts from its first acquire)."""
        return WindowUser(self, int(cap))

    # -- what the fetcher reports (loop) ----------------------------------------------------------
    def completed(self, nbytes: int, seconds: float, learn: bool = True) -> None:
        """A GET under a permit finished: the controller learns from it, and a raised limit admits waiters.

        ``learn=False``: a read that only held a place (a shard index), which the controller discounts.
        """
        controller = self.controller
        if controller is None:
            return
        if not learn:
            controller.on_side(time.monotonic())
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
    def _can(self, user: WindowUser, n: int = 1) -> bool:
        """Whether ``user`` may take ``n`` permits now: under the limit and its cap, or into an idle window
        (and an idle user), so a read of more tiles than the limit at the time still goes through alone."""
        if n == 1:
            return self.inflight < self.limit and user.held < user.cap
        fits = self.inflight + n <= self.limit or self.inflight == 0
        return fits and (user.held + n <= user.cap or user.held == 0)

    def _take(self, user: WindowUser, n: int = 1) -> None:
        self.inflight += n
        user.held += n
        if not user.active:
            self._join(user)

    def _join(self, user: WindowUser) -> None:
        user.active = True
        self._users.add(user)
        self.recap()

    def recap(self) -> None:
        """Under "auto", the controller's cap is the ceiling or what the active users may hold together."""
        if self.controller is not None:
            caps = sum(u.cap for u in self._users if u.active)
            if caps:  # with no reader left the limit stays where it was, for the next one
                self.controller.set_cap(min(self.ceiling, caps), time.monotonic())

    def give_back(self, user: WindowUser, n: int = 1) -> None:
        """Return ``n`` of ``user``'s permits and hand what is free to the waiters."""
        self.inflight -= n
        user.held -= n
        self._wake()

    def _wake(self) -> None:
        """Hand permits to waiters in ticket order (one whose reader is at its cap lets the next go first),
        then, with none left waiting, to background waiters."""
        waiters = self._waiters
        skipped = []
        held_back = False
        while waiters and self.inflight < self.limit:
            waiter = heapq.heappop(waiters)
            fut, user, n = waiter[2], waiter[3], waiter[4]
            if fut.done():  # cancelled while waiting
                continue
            if user.held >= user.cap:
                skipped.append(waiter)
                continue
            if not self._can(user, n):  # several permits, not free yet: nobody behind it goes first
                heapq.heappush(waiters, waiter)
                held_back = True
                break
            self._take(user, n)  # the permits are the waiter's from here, even before it runs
            fut.set_result(None)
        for waiter in skipped:
            heapq.heappush(waiters, waiter)
        idle = self._idle  # with a permit left, the only waiters still queued are the skipped ones
        while idle and not skipped and not held_back and self.inflight < self.limit:
            fut, user = idle.popleft()
            if fut.done():
                continue
            if user.held >= user.cap:
                idle.appendleft((fut, user))
                break
            self._take(user)
            fut.set_result(None)

    def would_wait(self, user: WindowUser, n: int = 1) -> bool:
        """Whether ``user`` taking ``n`` permits now would wait (a read waits already, or none is free)."""
        return bool(self._waiters) or not self._can(user, n)

    def try_take(self, user: WindowUser, n: int = 1) -> bool:
        """Give ``user`` ``n`` permits if they are free now, without barging past a waiting read."""
        if not self._waiters and self._can(user, n):
            self._take(user, n)
            return True
        return False

    def take_free(self, user: WindowUser, n: int) -> int:
        """Give ``user`` as many of ``n`` permits as are free now (none past a waiting read); how many it got."""
        if self._waiters:
            return 0
        got = min(n, self.limit - self.inflight, user.cap - user.held)
        if got <= 0:
            return 0
        self._take(user, got)
        return got

    def enqueue(self, user: WindowUser, ticket: int | None, n: int = 1) -> asyncio.Future:
        """Queue ``user`` for ``n`` permits in ``ticket`` order; the future is done once they are its."""
        fut = asyncio.get_running_loop().create_future()
        entry = (self.ticket() if ticket is None else ticket, next(self._arrivals), fut, user, n)
        heapq.heappush(self._waiters, entry)
        return fut

    def enqueue_idle(self, user: WindowUser) -> asyncio.Future:
        """Queue ``user`` for a permit no other read waits for; the future is done once it is its."""
        fut = asyncio.get_running_loop().create_future()
        self._idle.append((fut, user))
        return fut


class WindowUser:
    """One reader's share of a :class:`ReadWindow`, shaped like ``asyncio.Semaphore``."""

    def __init__(self, window: ReadWindow, cap: int) -> None:
        self.window = window
        self.cap = max(1, cap)
        self.held = 0
        self.active = False

    def locked(self) -> bool:
        """True when an ``acquire`` now would wait."""
        return self.window.would_wait(self)

    def try_acquire(self) -> bool:
        """Take a permit if one is free now (no waiting, no barging past waiters)."""
        return self.window.try_take(self)

    def take_free(self, n: int) -> int:
        """Take as many of ``n`` permits as are free now (no waiting, no barging); how many were taken.

        A batch of reads takes its permits in one call; each is given back
        alone (``release``) as its read lands.
        """
        return self.window.take_free(self, n)

    async def acquire(self, ticket: int | None = None) -> bool:
        """Wait for a permit, served in ``ticket`` order (None: behind every read already waiting)."""
        if self.try_acquire():
            return True
        await self._wait(self.window.enqueue(self, ticket))
        return True

    async def acquire_many(self, n: int, ticket: int | None = None) -> None:
        """Wait for ``n`` permits at once (a read of ``n`` tiles), served in ``ticket`` order; all or none.

        ``n`` may exceed the limit, or the cap: such a read waits for an idle window (and reader).
        """
        if n == 1:
            await self.acquire(ticket)
            return
        if not self.window.try_take(self, n):
            await self._wait(self.window.enqueue(self, ticket, n), n)

    async def acquire_idle(self) -> bool:
        """Wait for a permit no other read is waiting for (background work, such as reading ahead)."""
        if self.try_acquire():
            return True
        await self._wait(self.window.enqueue_idle(self))
        return True

    async def _wait(self, fut: asyncio.Future, n: int = 1) -> None:
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed its permits just as it was cancelled: give them back
                self.window.give_back(self, n)
            raise

    def release(self, n: int = 1) -> None:
        self.window.give_back(self, n)

    def leave(self) -> None:
        """This reader is done for now (a pass ended): its cap stops counting toward the shared cap."""
        if self.active:
            self.active = False
            self.window.recap()

    def turn(self, ticket: int | None) -> _Turn:
        """``async with user.turn(ticket):`` holds a permit taken in ``ticket`` order."""
        return _Turn(self, ticket)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class _Turn:
    """A permit held for an ``async with`` block, taken in ticket order."""

    __slots__ = ("ticket", "user")

    def __init__(self, user: WindowUser, ticket: int | None) -> None:
        self.user = user
        self.ticket = ticket

    async def __aenter__(self) -> None:
        await self.user.acquire(self.ticket)

    async def __aexit__(self, *exc: object) -> None:
        self.user.release()

"""``PassTasks``: the work one pass has in flight on zarr's loop and on the decode pool.

The driver and its tile sources start tasks on the loop and jobs on the
decode pool through it, so one object knows everything a pass must cancel
or wait for when it stops: its tasks (never anyone else's), its decode-pool
jobs, and the jobs a cancelled task left running (with what to undo once
each ends). It also keeps the pass's two timing facts about that work: how
long the driver waited for room while none of its work was active (the
budget alone held it back), and, on a remote pass, the first block's reads
(the second block is admitted once they have landed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..stats import PassCounters

__all__ = ["PassTasks"]


class PassTasks:
    """One pass's loop tasks and decode-pool jobs: started, counted, and cancelled or awaited as one."""

    def __init__(self, loop: asyncio.AbstractEventLoop, counters: PassCounters, gated: bool) -> None:
        self.loop = loop
        self.counters = counters
        self._tasks: set[asyncio.Task] = set()
        self._jobs: set[concurrent.futures.Future] = set()  # decode-pool jobs of this pass not yet ended
        self._jobs_lock = threading.Lock()
        # decode-pool jobs a cancelled task left running, and what to undo once each ends
        self._orphans: list[tuple[concurrent.futures.Future, Callable[[], None]]] = []
        self._active = 0  # tiles being fetched or decoded, and revival jobs (loop thread)
        self._waiting = False
        self._stall_from: float | None = None  # when the driver began waiting for room with nothing active
        # while the first block's reads land (a remote pass): the work tasks started since
        self._gate: set[asyncio.Task] | None = set() if gated else None

    # -- starting work ---------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, None], work: bool = False) -> asyncio.Task:
        """Run ``coro`` as a task of this pass; ``work``: a fetch or revival, active until the task ends."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if work:
            if self._gate is not None:
                self._gate.add(task)
            self.work_started()
            task.add_done_callback(self.work_ended)
        return task

    def track(self, job: concurrent.futures.Future) -> None:
        """Remember a decode-pool job until it ends: ``cancel_all`` waits for every one still running."""
        with self._jobs_lock:
            self._jobs.add(job)
        job.add_done_callback(self._job_ended)

    def _job_ended(self, job: concurrent.futures.Future) -> None:
        with self._jobs_lock:  # called on the decode thread that ran it
            self._jobs.discard(job)

    def orphan(self, job: concurrent.futures.Future, cleanup: Callable[[], None]) -> None:
        """A cancelled task's decode-pool job still runs: ``cancel_all`` waits for it, then runs ``cleanup``."""
        self._orphans.append((job, cleanup))

    def running(self) -> list[asyncio.Task]:
        """The tasks of this pass not yet done."""
        return [t for t in self._tasks if not t.done()]

    # -- the first block ----------------------------------------------------------
    @property
    def gated(self) -> bool:
        """Whether the pass still waits for its first block's reads before admitting its second."""
        return self._gate is not None

    async def first_block_lands(self) -> None:
        """Loop: wait until the reads the first block started, and the reads those started, have ended."""
        while self._gate:
            started, self._gate = self._gate, set()
            await asyncio.wait(started)
        self._gate = None

    # -- waiting for room -----------------------------------------------------------
    async def wait(self, wake: asyncio.Event) -> None:
        """Loop: wait for ``wake``, timing a wait while none of this pass's work is active (``budget_wait_s``)."""
        wake.clear()
        self._waiting = True
        if self._active == 0:
            self._stall_from = time.perf_counter()
        try:
            await wake.wait()
        finally:
            self._waiting = False
            self._end_stall()

    def _end_stall(self) -> None:
        if self._stall_from is not None:
            self.counters.trace.add("budget_wait_s", time.perf_counter() - self._stall_from)
            self._stall_from = None

    def work_started(self) -> None:
        """Loop: a fetch, decode or revival of this pass began."""
        if self._active == 0:
            self._end_stall()
        self._active += 1

    def work_ended(self, _done: asyncio.Future) -> None:
        """Loop: one ended (a done-callback)."""
        self._active -= 1
        if self._active == 0 and self._waiting:
            self._stall_from = time.perf_counter()

    # -- stopping ---------------------------------------------------------------------
    async def cancel_all(self, main: concurrent.futures.Future | None) -> None:
        """Loop: cancel ``main`` (the driver) first, so it spawns nothing more, then every task; wait for the jobs."""
        if main is not None:
            main.cancel()
            await asyncio.gather(asyncio.wrap_future(main), return_exceptions=True)
        while tasks := self.running():  # a cancelled task may not spawn, but be safe
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        with self._jobs_lock:
            jobs = list(self._jobs)
        if jobs:  # no read or decode of a stopped pass is still running once stop returns
            await asyncio.gather(*(asyncio.wrap_future(j) for j in jobs), return_exceptions=True)
        orphans, self._orphans = self._orphans, []
        for job, cleanup in orphans:
            await asyncio.gather(asyncio.wrap_future(job), return_exceptions=True)
            cleanup()
